"""Signal handling: handlers only record, the supervisor's event loop acts.

``install()`` runs before any heavy import (see ``launcher.__main__``). Each handled signal is
appended to a queue, and ``signal.set_wakeup_fd`` writes its number to a non-blocking pipe, so the
event loop's ``select`` wakes within microseconds of a SIGCHLD, SIGTERM or SIGINT without polling.
"""

import collections
import os
import select
import signal
from typing import Deque, Optional

#: Signals that ask the launcher to stop the job.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_pending: Deque[int] = collections.deque()
_wakeup_read_fd: Optional[int] = None
_wakeup_write_fd: Optional[int] = None


def _record(signum: int, _frame: object) -> None:
    # Only record: the main loop decides what to do (never act inside a handler).
    if signum != signal.SIGCHLD:
        _pending.append(signum)


def install() -> int:
    """Install the recording handlers and the wakeup pipe (idempotent).

    Returns:
        The read end of the wakeup pipe, readable whenever a handled signal arrived.
    """
    global _wakeup_read_fd, _wakeup_write_fd
    if _wakeup_read_fd is not None:
        return _wakeup_read_fd
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in STOP_SIGNALS + (signal.SIGCHLD,):
        signal.signal(signum, _record)
    _wakeup_read_fd, _wakeup_write_fd = read_fd, write_fd
    return read_fd


def wake() -> None:
    """Make the wakeup pipe readable from any thread (the event loop then runs what threads handed
    it); a full pipe is readable already."""
    if _wakeup_write_fd is not None:
        try:
            os.write(_wakeup_write_fd, b"\0")
        except OSError:  # full (BlockingIOError), or closed by uninstall() meanwhile
            pass


def wakeup_fd() -> int:
    """The wakeup pipe's read end (installs the handlers on first use)."""
    return install()


def drain_wakeup() -> None:
    """Empty the wakeup pipe after the loop woke on it."""
    if _wakeup_read_fd is None:
        return
    try:
        while os.read(_wakeup_read_fd, 4096):
            pass
    except BlockingIOError:
        pass


def pop_pending() -> Optional[int]:
    """The oldest recorded stop signal not yet handled, or None."""
    return _pending.popleft() if _pending else None


def has_pending() -> bool:
    """True if a stop signal was recorded and not yet handled."""
    return bool(_pending)


def interruptible_sleep(seconds: float) -> None:
    """Sleep, but wake at once when a stop signal arrives.

    Used as tenacity's ``sleep`` while waiting for a rank table, so SIGTERM during the wait stops
    the launcher promptly instead of after the next poll.
    """
    fd = wakeup_fd()
    if has_pending():
        return
    select.select([fd], [], [], max(0.0, seconds))
    drain_wakeup()


def uninstall() -> None:
    """Restore default handlers and drop the wakeup pipe (for embedding and tests)."""
    global _wakeup_read_fd, _wakeup_write_fd
    if _wakeup_read_fd is None:
        return
    for signum in STOP_SIGNALS + (signal.SIGCHLD,):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    write_fd = signal.set_wakeup_fd(-1)
    for fd in (_wakeup_read_fd, write_fd):
        if fd >= 0:
            os.close(fd)
    _wakeup_read_fd = _wakeup_write_fd = None
    _pending.clear()
