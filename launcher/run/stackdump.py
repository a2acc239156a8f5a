"""Dump the Python stacks of every local rank into the run dir, without blocking the event loop.

``py-spy dump --pid P`` runs for all ranks at once, each a child watched by the event loop
(``watch_pid``) with its output in ``heartbeats/attempt_A/stacks_rank_N.txt``; a rank whose py-spy fails (not
installed, no ptrace permission) and that imported ``launcher_heartbeat`` gets ``SIGUSR1`` instead,
and its ``faulthandler`` writes the stacks next to its slot. Whatever is not in by the deadline is
reported as unread; leftover py-spy processes are killed. Used by ``launcher.run.hangwatch``.
"""

import logging
import os
import signal
import subprocess
import time
from typing import Callable, Dict, Optional, Set

from launcher.monitoring import stacks
from launcher.monitoring.heartbeats import STACKS_SUFFIX, slot_path

log = logging.getLogger(__name__)

#: How long a rank's faulthandler gets to write its stacks after SIGUSR1.
FAULTHANDLER_WAIT = 0.3

Done = Callable[[Dict[int, Optional[str]], Dict[int, str]], None]


class StackDump:
    """One dump of every local rank; ``done(texts, sources)`` runs on the event loop when it ends.

    Args:
        group: The event loop (``watch_pid``, ``call_later``).
        pids: Rank -> the Python process to read (the slot's writer, else the rank's main process).
        faulthandler_ranks: Ranks that registered faulthandler on SIGUSR1.
        directory: Where the dumps go (``stacks_rank_N.txt``).
        slot_dir: The heartbeat slots' directory (faulthandler writes next to each slot).
        timeout: Seconds before the dump gives up on the ranks still unread.
        done: ``(rank -> stack text or None, rank -> "py-spy" | "faulthandler")``.
        tool: The py-spy executable (default: found on PATH); "" forces the faulthandler fallback.
    """

    def __init__(self, group, pids: Dict[int, int], faulthandler_ranks: Set[int], directory: str,
                 slot_dir: str, timeout: float, done: Done, tool: Optional[str] = None):
        self.group = group
        self.pids = pids
        self.faulthandler_ranks = faulthandler_ranks
        self.directory = directory
        self.slot_dir = slot_dir
        self.done = done
        self.texts: Dict[int, Optional[str]] = {rank: None for rank in pids}
        self.sources: Dict[int, str] = {}
        self._pending: Set[int] = set(pids)
        self._spies: Dict[int, subprocess.Popen] = {}
        self._finished = False
        self.started = time.monotonic()
        tool = stacks.py_spy_path() if tool is None else tool
        os.makedirs(directory, exist_ok=True)
        for rank, pid in pids.items():
            if not (tool and self._spy(tool, rank, pid)):
                self._fallback(rank)
        group.call_later(timeout, self._finish)

    def _out(self, rank: int) -> str:
        return os.path.join(self.directory, f"stacks_rank_{rank}.txt")

    def _spy(self, tool: str, rank: int, pid: int) -> bool:
        try:
            with open(self._out(rank), "wb") as out:
                spy = subprocess.Popen([tool, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            log.warning("cannot run py-spy for rank %d: %s", rank, exc)
            return False
        self._spies[rank] = spy
        self.group.watch_pid(spy.pid, lambda info, r=rank: self._spied(r, info.returncode))
        return True

    def _spied(self, rank: int, returncode: int) -> None:
        self._spies.pop(rank).returncode = returncode  # reaped by the loop: Popen must not wait again
        if self._finished:
            return
        if returncode == 0:
            self._got(rank, self._read(self._out(rank)), "py-spy")
        else:
            log.info("py-spy could not read rank %d (%s)", rank, self._read(self._out(rank)).strip()[:200])
            self._fallback(rank)

    def _fallback(self, rank: int) -> None:
        """faulthandler on SIGUSR1, only for a rank that registered it (else SIGUSR1 would kill it)."""
        if rank not in self.faulthandler_ranks:
            self._got(rank, None, "")
            return
        path = slot_path(self.slot_dir, rank) + STACKS_SUFFIX
        try:
            os.truncate(path, 0)
            os.kill(self.pids[rank], signal.SIGUSR1)
        except OSError:
            self._got(rank, None, "")
            return
        self.group.call_later(FAULTHANDLER_WAIT, lambda: self._handled(rank, path))

    def _handled(self, rank: int, path: str) -> None:
        """The faulthandler dump, copied beside py-spy's so that one directory holds every rank."""
        text = self._read(path) or None
        if text is not None:
            try:
                with open(self._out(rank), "w", encoding="utf-8") as out:
                    out.write(text)
            except OSError as exc:
                log.warning("cannot keep rank %d's stacks in %s: %s", rank, self.directory, exc)
        self._got(rank, text, "faulthandler")

    @staticmethod
    def _read(path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _got(self, rank: int, text: Optional[str], source: str) -> None:
        if self._finished or rank not in self._pending:
            return
        self._pending.discard(rank)
        self.texts[rank] = text
        if text is not None:
            self.sources[rank] = source
        if not self._pending:
            self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        for spy in self._spies.values():  # past the deadline: a py-spy stuck on a process in D state
            try:
                spy.kill()
            except OSError:
                pass
        self.done(self.texts, self.sources)
