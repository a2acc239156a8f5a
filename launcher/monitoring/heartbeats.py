"""The launcher's side of rank heartbeats: read the slots, judge whether a rank is hung (pure).

A rank writes its slot with ``launcher/rankhooks/launcher_heartbeat.py`` (stdlib only, the layout is
documented there and ``SLOT_FORMAT`` must match it; a unit test checks that). Ranks that never call
it are judged by their output instead: a rank log that grew is progress too.

``launcher status`` reads the slots through this module and must answer in under 100 ms, so it
imports no more than it needs: its records are NamedTuples (the ``dataclasses`` module alone costs
about 10 ms to import) and ``statistics`` is imported where a median is taken.
"""

import os
import struct
from typing import Any, Deque, Dict, List, NamedTuple, Optional, Tuple

from launcher.common.inputfiles import open_regular

SLOT_FORMAT = "<IIdqd32s"
SLOT_SIZE = struct.calcsize(SLOT_FORMAT)
FLAG_FAULTHANDLER = 1
FLAG_EXITING = 2
STACKS_SUFFIX = ".stacks"
#: The run dir's directory of heartbeat slots (one file per local rank) and stack dumps.
HEARTBEAT_DIR = "heartbeats"


class Beat(NamedTuple):
    """One read of a rank's slot.

    Attributes:
        at: ``time.monotonic()`` of the last beat (0: none yet).
        step: The last step the rank gave (-1: unknown).
        section: The named section the rank is in ("" outside one).
        section_start: When it entered it (monotonic).
        pid: The process that wrote the slot.
        faulthandler: Whether the rank dumps its stacks on SIGUSR1.
        exiting: The rank's interpreter is exiting (``atexit`` ran): its teardown is never a hang.
    """

    at: float
    step: int
    section: str
    section_start: float
    pid: int
    faulthandler: bool
    exiting: bool = False


def read_slot(path: str) -> Optional[Beat]:
    """The slot at ``path``, or None when the rank has not created it (yet)."""
    try:  # a FIFO or a device in its place is refused at once, a symlink not followed
        fd = open_regular(path, "heartbeat slot", follow=False)
    except (OSError, ValueError):
        return None
    try:
        data = os.pread(fd, SLOT_SIZE, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) < SLOT_SIZE:
        return None
    flags, pid, at, step, start, name = struct.unpack(SLOT_FORMAT, data)
    return Beat(at, step, name.rstrip(b"\0").decode("utf-8", "replace"), start, pid,
                bool(flags & FLAG_FAULTHANDLER), bool(flags & FLAG_EXITING))


def judge(rules: Any, spawned_at: float, beat: Optional[Beat], output_at: float,
          now: float) -> Optional[str]:
    """Why the rank is hung at ``now``, or None (pure).

    Args:
        rules: The timeouts (``launcher.jobspec.runspec.HangRules``, the run's ``hangs`` spec; not
            imported here, for ``launcher status``'s import time).
        spawned_at: When the rank was spawned (monotonic).
        beat: Its slot, or None.
        output_at: When its log last grew (monotonic; 0: never).
        now: The current monotonic time.
    """
    if beat is not None and beat.exiting:
        return None
    if beat is not None and beat.section and beat.section in rules.sections:
        limit = rules.sections[beat.section]
        stay = now - beat.section_start
        return f"in section {beat.section!r} for {stay:.1f} s (limit {limit:g} s)" if stay > limit else None
    last = max(beat.at if beat is not None else 0.0, output_at)
    if last <= spawned_at:
        limit = rules.initial if rules.initial is not None else rules.steady
        silent = now - spawned_at
        return (f"no heartbeat or output {silent:.1f} s after start (initial timeout {limit:g} s)"
                if limit and silent > limit else None)
    silent = now - last
    return (f"no heartbeat or output for {silent:.1f} s (timeout {rules.steady:g} s)"
            if rules.steady and silent > rules.steady else None)


def slot_path(directory: str, rank: int) -> str:
    """The slot file of ``rank`` under the run dir's heartbeat directory."""
    return os.path.join(directory, f"rank_{rank}")


#: Seconds of step history behind a step rate; a rate needs at least ``RATE_MIN_SPAN`` of it, so a
#: straggler is one that stayed slow for that long, not one slow step.
RATE_WINDOW = 10.0
RATE_MIN_SPAN = 5.0


def step_rate(history: Deque[Tuple[float, int]]) -> Optional[float]:
    """Steps per second over ``history`` (``(monotonic time, step)``, oldest first), or None when it
    spans less than ``RATE_MIN_SPAN`` seconds."""
    if len(history) < 2 or history[-1][0] - history[0][0] < RATE_MIN_SPAN:
        return None
    (t0, s0), (t1, s1) = history[0], history[-1]
    return (s1 - s0) / (t1 - t0)


def stragglers(rates: Dict[int, Optional[float]], threshold: float) -> List[int]:
    """Ranks whose step rate is more than ``threshold`` (a fraction) below the median of the others'.

    Ranks without a rate yet are neither judged nor compared with.
    """
    from statistics import median

    known = {r: v for r, v in rates.items() if v is not None}
    slow = []
    for rank, rate in known.items():
        peers = [v for r, v in known.items() if r != rank]
        if peers and median(peers) > 0 and rate < (1.0 - threshold) * median(peers):
            slow.append(rank)
    return sorted(slow)
