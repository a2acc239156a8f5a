"""Keeping ranks from outliving the launcher, and reaping what they leave behind.

- Each rank's main process gets ``PR_SET_PDEATHSIG=SIGKILL``: it dies the moment the launcher dies.
- The orphan guard, a small process forked once at start (before any thread exists), learns each
  rank's process-group id over a pipe. When the pipe reaches end-of-file (the launcher exited or was
  SIGKILLed) it SIGKILLs every group it still knows, so dataloader workers and other grandchildren
  die too, then the job's cgroup and every process carrying the job's token
  (:meth:`launcher.supervision.jobtree.JobTree.kill_all`): those that left their group. It sits in its own
  session so a signal to the launcher's group does not take it down. At its start it removes the
  empty job cgroups of launchers that were SIGKILLed together with their guard.
- ``become_subreaper`` makes orphaned grandchildren re-parent to the launcher, which reaps them
  (as PID 1 in a container it reaps everything anyway).
"""

import ctypes
import logging
import os
import signal
import time
from typing import Optional, Set

from launcher.supervision.jobtree import JobTree

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc: Optional[ctypes.CDLL] = None


def _prctl(option: int, arg: int) -> bool:
    global _libc
    if _libc is None:
        # The process's own libc (dlopen(NULL)): find_library("c") would run `ldconfig -p` in a
        # subprocess (a fork and an exec, ~8 ms) and import ctypes.util on the way to the first rank.
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl(option, arg, 0, 0, 0) == 0


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process. Returns False where unsupported."""
    if os.getpid() == 1:
        return True
    try:
        return _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        return False


def child_setup() -> None:
    """``preexec_fn`` for ranks: die with the launcher (parent-death signal)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def prepare() -> None:
    """Load libc in the parent so ``child_setup`` does no dynamic loading after fork."""
    _prctl(_PR_SET_PDEATHSIG, 0)


class OrphanGuard:
    """Parent side of the guard process: tell it which process groups to kill if we die.

    Args:
        tree: The job's process tree; when given, the guard also kills its cgroup and token carriers.
    """

    def __init__(self, tree: Optional[JobTree] = None) -> None:
        read_fd, self._write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the forked guard
            os.close(self._write_fd)
            _guard_main(read_fd, tree)
        os.close(read_fd)
        os.set_inheritable(self._write_fd, False)

    def watch(self, pgid: int) -> None:
        """Kill process group ``pgid`` if the launcher dies."""
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """Stop watching ``pgid`` (its processes are all gone)."""
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        try:
            os.write(self._write_fd, line.encode())
        except OSError as exc:
            log.warning("orphan guard unreachable: %s", exc)

    def close(self) -> None:
        """Let the guard exit (it kills whatever it still watches, normally nothing)."""
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1


def _guard_main(read_fd: int, tree: Optional[JobTree]) -> None:  # pragma: no cover - runs in the forked guard
    code = 0
    try:
        os.setsid()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # hold no pipe of the launcher's caller open
            os.dup2(devnull, fd)
        os.closerange(3, read_fd)
        os.closerange(read_fd + 1, 1024)
        if tree is not None:  # here, beside the launcher's start-up rather than in its way
            tree.remove_stale()
        groups: Set[int] = set()
        buffer = b""
        while True:
            data = os.read(read_fd, 4096)
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                pgid = int(line[1:])
                (groups.add if line[:1] == b"+" else groups.discard)(pgid)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        if tree is not None:  # after a clean exit there is nothing left: one /proc scan
            tree.kill_all(time.monotonic() + 5.0)
    except BaseException:  # never let the guard run the launcher's code after fork
        code = 1
    os._exit(code)
