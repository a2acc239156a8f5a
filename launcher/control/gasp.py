"""Dying-gasp support: the crash-loop gate, the graceful-exit file, and prestop without a supervisor.

``GaspGate`` implements the seed's 60 s rule once, in the launcher: a gasp within
``--gasp-min-interval`` of the previous one stops the ranks without the save signal, and each rank is
told at start (``LAUNCHER_GASP_SAVE_ALLOWED``) whether a save is currently allowed.
"""

import json
import logging
import math
import os
import signal
import time
from typing import Any, Callable, List, Optional

from launcher.common.inputfiles import read_record
from launcher.common.records import record

log = logging.getLogger(__name__)

GASP_STATE = "gasp.json"
GRACEFUL_EXIT_FILE = "graceful_exit.json"
class GaspGate:
    """Remembers when the last gasp sent the save signal (in the run dir, across launcher restarts).

    Args:
        path: State file, e.g. ``<run-dir>/gasp.json``.
        min_interval: Seconds; 0 disables the rule.
        clock: Wall clock (tests pass a fake).
    """

    def __init__(self, path: str, min_interval: float, clock: Callable[[], float] = time.time):
        self.path = path
        self.min_interval = min_interval
        self.clock = clock

    def last(self) -> Optional[float]:
        """Time of the last gasp that sent the save signal, if any (None for a damaged file)."""
        try:
            last = float(read_record(self.path, GASP_STATE)["last_save"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return last if math.isfinite(last) else None

    def allowed(self) -> bool:
        """Whether a gasp now may send the save signal.

        A last save in the future (the clock was stepped back) does not count: refusing would skip
        saves until the clock catches up, and an extra save costs time, never work.
        """
        last, now = self.last(), self.clock()
        return self.min_interval <= 0 or last is None or now < last or now - last >= self.min_interval

    def try_save(self) -> bool:
        """Decide for a gasp happening now; records it when the save is allowed."""
        if not self.allowed():
            return False
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"last_save": self.clock()}, fh)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full run dir never costs the ranks their save
            _remove(tmp)
            log.warning("cannot record the dying gasp in %s (%s): saving anyway", self.path, exc.strerror or exc)
        return True


def write_graceful_exit(path: str, value: int) -> bool:
    """Atomically write ``{"GracefulExit": value}`` (temp file + rename), as MindSpore polls it.

    Returns False, with a warning, when the file cannot be written (a full disk): the job goes on.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"GracefulExit": value}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        log.warning("cannot write %s (%s): ranks polling it do not see GracefulExit=%d", path,
                    exc.strerror or exc, value)
        return False
    return True


def _remove(path: str) -> None:
    """Remove a temp file left by a failed write (a full disk), if any."""
    try:
        os.unlink(path)
    except OSError:
        pass


@record
class RecordedRank:
    """A rank recorded in the run dir's state file."""

    rank: int
    pid: int
    create_time: Optional[float]


def recorded_ranks(state: Any) -> List[RecordedRank]:
    """The ranks listed in a ``state.json`` document; malformed entries (a damaged file) are skipped."""
    entries = state.get("ranks") if isinstance(state, dict) else None
    records = []
    for entry in entries if isinstance(entries, list) else ():
        try:
            created = entry.get("create_time")
            record = RecordedRank(int(entry["rank"]), int(entry["pid"]), None if created is None else float(created))
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if record.pid > 0:  # 0 and negative pids address process groups in kill(2)
            records.append(record)
    return records


def verified_ranks(records: List[RecordedRank]) -> List[tuple]:
    """``(record, psutil.Process)`` for the records that are still the very processes the launcher started.

    A pid is trusted only if a process with that pid exists and its create time equals the recorded
    one, so a recycled pid is never signalled.
    """
    import psutil

    procs = []
    for rec in records:
        if rec.create_time is None:
            continue
        try:
            proc = psutil.Process(rec.pid)
            if abs(proc.create_time() - rec.create_time) < 0.01:
                procs.append((rec, proc))
        except psutil.Error:
            continue
    return procs


def fallback_gasp(records: List[RecordedRank], signum: int, timeout: float) -> List[dict]:
    """prestop when the supervisor is gone: signal each verified rank once, wait, kill its group."""
    import psutil

    procs = verified_ranks(records)
    for _rec, proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.Error:
            pass
    alive = wait_exits([p.pid for _, p in procs], timeout)
    outcomes = []
    for rec, proc in procs:
        killed = proc.pid in alive
        _kill_rank(proc, killed)
        # Not our children: their exit codes went to whoever reaps them now.
        outcomes.append({"rank": rec.rank, "label": f"rank {rec.rank}", "killed_after_timeout": killed,
                         "exit_code": None, "signal": None, "returncode": None})
    wait_exits(sorted(alive), 5.0)
    return outcomes


def _kill_rank(proc: Any, running: bool) -> None:
    """SIGKILL what is left of a rank: its process group (the launcher gives each rank its own
    session, pgid == pid), where dataloader or writer children outlive a rank that exited, and the
    rank itself if it is still ``running`` (psutil re-checks its create time)."""
    import psutil

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # no such group any more: nothing of it is left
        pass
    if running:
        try:
            proc.kill()
        except psutil.Error:
            pass


def wait_exits(pids: List[int], timeout: float) -> List[int]:
    """Wait until the processes (not our children) exit; returns those still running at the timeout.

    Uses pidfds, which become readable when the process terminates (zombie or reaped), so the wait
    ends the moment the last one exits.
    """
    import select

    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    try:
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], remaining)
            for fd in ready:
                os.close(fd)
                fds.pop(fd)
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)
