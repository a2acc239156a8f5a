"""Where every rank is: read the Python stacks of hung ranks and say which one differs (pure parts).

Two sources, in this order: ``py-spy dump --pid P`` (reads a process's stacks from outside, without
its cooperation: a rank in a C call holding the GIL or with its stderr closed still answers), and
``faulthandler`` on ``SIGUSR1`` for ranks that imported ``launcher_heartbeat`` (it registers that
handler and marks it in its slot; a rank stuck in C code holding the GIL cannot run it). The
launcher runs the dumps (``launcher.run.hangwatch``); this module parses and compares them.
"""

import os
import re
import sys
from collections import Counter
from typing import Dict, List, Mapping, Optional

from launcher.common import envnames
from launcher.common.programs import which

#: ``    func (file.py:88)`` in a py-spy dump.
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
#: ``Thread 123 (idle): "MainThread"`` in a py-spy dump.
_PYSPY_THREAD = re.compile(r"^Thread (?:0x)?(?P<tid>[0-9A-Fa-f]+)")
#: ``  File "x.py", line 88 in func`` in a faulthandler dump.
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def py_spy_path(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The py-spy executable: ``$LAUNCHER_PY_SPY`` (empty: none), else on PATH or beside this
    interpreter; None when there is none."""
    environ = os.environ if environ is None else environ
    if envnames.LAUNCHER_PY_SPY in environ:
        return environ[envnames.LAUNCHER_PY_SPY] or None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def _where(func: str, path: str, line: str) -> str:
    return f"{func} ({os.path.basename(path)}:{line})"


def innermost_frame(dump: str, pid: Optional[int] = None) -> Optional[str]:
    """The innermost frame of a rank's main thread, ``func (file.py:88)``, from either dump format.

    py-spy: the thread whose id is the pid (Linux's main thread), else the first; faulthandler: the
    ``Current thread`` (the signal runs on the main thread), else the first.
    """
    first = chosen = None
    block_is_main = False
    for raw in dump.splitlines():
        thread = _PYSPY_THREAD.match(raw)
        if thread or raw.startswith(("Current thread", "Thread 0x")):
            block_is_main = raw.startswith("Current thread") or bool(
                thread and pid is not None and thread.group("tid") == str(pid))
            continue
        frame = _PYSPY_FRAME.match(raw) or _FH_FRAME.match(raw)
        if frame is None:
            continue
        where = _where(frame.group("func"), frame.group("file"), frame.group("line"))
        if first is None:
            first = where
        if block_is_main and chosen is None:
            chosen = where
        block_is_main = False  # only a thread's first frame is its innermost one
    return chosen or first


def diagnose(where: Dict[int, Optional[str]], hung: List[int]) -> List[str]:
    """Lines for the summary: where each group of ranks is, the odd ones out named first.

    Args:
        where: Rank -> its innermost frame (None: no stacks could be read).
        hung: The ranks judged hung.
    """
    if not where:
        return []
    known = Counter(w for w in where.values() if w is not None)
    common = known.most_common(1)[0][0] if known else None
    lines = []
    for spot in sorted(set(where.values()), key=lambda w: (w == common, w is None, str(w))):
        ranks = sorted(r for r, w in where.items() if w == spot)
        who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
        flag = " (hung)" if any(r in hung for r in ranks) else ""
        if spot is None:
            lines.append(f"{who}{flag}: no stacks could be read")
        elif spot != common and len(known) > 1:
            lines.append(f"{who}{flag} differ{'' if len(ranks) > 1 else 's'} from the rest: in {spot}")
        else:
            lines.append(f"{who}{flag}: in {spot}")
    return lines


def odd_one_out(where: Dict[int, Optional[str]]) -> Optional[int]:
    """The one rank whose stacks differ from every other rank's (all others in one place), or None.

    When every rank stops beating (three in ``all_reduce``, one in its data loader), that rank is
    the one holding the others up: the hang detector fails it rather than the lowest silent rank.
    """
    known = {r: w for r, w in where.items() if w is not None}
    spots = Counter(known.values())
    if len(known) < 3 or len(spots) != 2:
        return None
    lone = [r for r, w in known.items() if spots[w] == 1]
    return lone[0] if len(lone) == 1 else None
