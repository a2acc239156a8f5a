"""The launcher's console streams (stdout for rank output, stderr for its own lines), never blocking.

A console nobody reads (a stopped pipe, a frozen terminal, a stalled log collector) must not stop
the supervisor: writes go to a private non-blocking descriptor; what the reader does not take at
once waits in a bounded buffer that the event loop flushes when the fd becomes writable, and what
does not fit is dropped from the console only (the rank log files stay complete) and counted.
"""

import atexit
import collections
import logging
import os
import select
import socket
import stat
import sys
import time
from typing import Callable, Deque, List, Optional, Union

log = logging.getLogger(__name__)

#: Console bytes held while the console does not take them; beyond it new output is dropped (from
#: the console only) and counted. 1 MiB: several seconds of a chatty job, a bounded cost in memory.
CONSOLE_BUFFER = 1 << 20
#: Seconds a slow console gets at exit to take what is still buffered.
CONSOLE_EXIT_WAIT = 2.0

Watch = Callable[[int, Callable[[], None]], None]


def _lines(data: Union[bytes, memoryview]) -> int:
    return bytes(data).count(b"\n") or 1  # a chunk without a newline is a (partial) line too


class Console:
    """A console stream (stdout or stderr) that the launcher writes without ever blocking.

    A pipe or terminal is opened anew through ``/proc/self/fd`` as a private non-blocking
    descriptor (setting ``O_NONBLOCK`` on the inherited one would change it for the shell and every
    process sharing it); a socket is written with ``MSG_DONTWAIT``. Regular files and devices such as
    /dev/null never wait for a reader and are written as they are. What the reader does not take at
    once waits in a buffer of ``limit`` bytes, written out from the event loop when the fd becomes
    writable (:meth:`attach`); output that does not fit is dropped and counted.

    Args:
        fd: The inherited descriptor (1 or 2).
        name: ``stdout`` or ``stderr``, for messages.
        limit: Buffer size in bytes.
    """

    def __init__(self, fd: int, name: str, limit: int = CONSOLE_BUFFER):
        self.name = name
        self.limit = limit
        self.fd = -1
        self._write: Callable[[Union[bytes, memoryview]], int] = _closed
        self._open(fd)
        self._pending: Deque[memoryview] = collections.deque()
        self._size = 0
        self.dropped_bytes = self.dropped_lines = 0
        self._add: Optional[Watch] = None
        self._remove: Optional[Callable[[int], None]] = None
        self._watching = False

    def _open(self, fd: int) -> None:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return  # no such stream (closed by whoever started us)
        self.fd = fd
        self._write = lambda data: os.write(fd, data)
        if stat.S_ISSOCK(mode):
            sock = socket.socket(fileno=os.dup(fd))  # kept alive by the closure below
            self._write = lambda data: sock.send(data, socket.MSG_DONTWAIT)
        elif (stat.S_ISFIFO(mode) or os.isatty(fd)) and os.get_blocking(fd):
            try:
                own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:  # no /proc, or a pipe whose reader is gone: writes fail at once anyway
                return
            self.fd = own
            self._write = lambda data: os.write(own, data)

    def write(self, data: bytes) -> None:
        """Write ``data`` now, or buffer it, or drop it (counted); never blocks, never raises."""
        if self._pending and not self._watching:
            self.flush_ready()  # no event loop watching the fd (start-up, shutdown): try now
        if self._pending:
            self._queue(memoryview(data))
            return
        try:
            written = self._write(data)
        except BlockingIOError:
            written = 0
        except OSError:  # console gone (closed terminal, pipe without reader): the files go on
            self._gone()
            return
        if written < len(data):
            self._queue(memoryview(data)[written:])

    def _queue(self, data: memoryview) -> None:
        if self._size + len(data) > self.limit:
            first = not self.dropped_bytes
            self.dropped_bytes += len(data)
            self.dropped_lines += _lines(data)
            if first:  # counted before logging: the warning may itself land on this console
                log.warning("the console (%s) is not taking output: dropping what does not fit in its %d KiB "
                            "buffer (rank log files stay complete)", self.name, self.limit >> 10)
            return
        self._pending.append(data)
        self._size += len(data)
        self._watch(True)

    def flush_ready(self) -> None:
        """Write what the console takes now (the event loop calls this when the fd is writable)."""
        while self._pending:
            head = self._pending[0]
            try:
                written = self._write(head)
            except BlockingIOError:
                return
            except OSError:
                self._gone()
                return
            self._size -= written
            if written < len(head):
                self._pending[0] = head[written:]
                return
            self._pending.popleft()
        self._watch(False)

    def attach(self, add_writer: Watch, remove_writer: Callable[[int], None]) -> None:
        """Let an event loop flush the buffer: ``add_writer(fd, callback)`` when there is a backlog."""
        self._watch(False)
        self._add, self._remove = add_writer, remove_writer
        self._watch(bool(self._pending))

    def detach(self) -> None:
        """The event loop is going away; writes try again by themselves."""
        self._watch(False)
        self._add = self._remove = None

    def _watch(self, on: bool) -> None:
        if self._add is None or on == self._watching or self.fd < 0:
            return
        self._watching = on
        if on:
            self._add(self.fd, self.flush_ready)
        else:
            self._remove(self.fd)

    def finish(self, timeout: float) -> int:
        """Give the reader up to ``timeout`` s to take the backlog, then drop the rest.

        Returns:
            Bytes dropped by this call.
        """
        self.detach()
        if self._pending:
            poller = select.poll()
            poller.register(self.fd, select.POLLOUT)
            deadline = time.monotonic() + timeout
            while self._pending and deadline > time.monotonic():
                if poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                    self.flush_ready()
        left = sum(len(chunk) for chunk in self._pending)
        self.dropped_bytes += left
        self.dropped_lines += sum(_lines(chunk) for chunk in self._pending)
        self._pending.clear()
        self._size = 0
        return left

    def _gone(self) -> None:
        self._watch(False)
        self._pending.clear()
        self._size = 0
        self._write = _closed


def _closed(data: Union[bytes, memoryview]) -> int:
    return len(data)  # a console that is gone swallows everything


_CONSOLES: List[Console] = []


def console_stream() -> Console:
    """The console rank output goes to (stdout), made non-blocking on first use."""
    return _console(1, "stdout")


def console_stderr() -> Optional[Console]:
    """The launcher's own log stream as a :class:`Console`, or None when ``sys.stderr`` is not fd 2
    (replaced by a test harness or an embedding program): then logging writes to it as it is."""
    try:
        if sys.stderr is None or sys.stderr.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return _console(2, "stderr")


def _console(fd: int, name: str) -> Console:
    for console in _CONSOLES:
        if console.name == name:
            return console
    console = Console(fd, name)
    if not _CONSOLES:
        atexit.register(finish_consoles)
    _CONSOLES.append(console)
    return console


def consoles() -> List[Console]:
    """The consoles opened so far, stdout first (its drop report goes to stderr)."""
    return sorted(_CONSOLES, key=lambda console: console.name != "stdout")


def finish_consoles(timeout: float = CONSOLE_EXIT_WAIT) -> None:
    """At exit: give each console up to ``timeout`` s to take its backlog (stdout, then stderr)."""
    for console in consoles():
        console.finish(timeout)


class ConsoleHandler(logging.Handler):
    """A logging handler writing through a :class:`Console`: a stopped stderr reader never blocks
    the launcher (its lines are buffered, then dropped and counted like rank output)."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "replace")
        except Exception:  # pylint: disable=broad-except  # logging's own contract: never raise
            self.handleError(record)
            return
        self.console.write(line)
