"""Rank output: a per-rank log file, and the console with a ``[rank N]`` prefix.

Every rank writes into a pipe (:func:`rank_pipe`), never into its file: a full or failing log disk
fails the launcher's write, which is reported once, never the rank's (before, a rank that wrote its
file directly died of ``ENOSPC`` in its own ``print``). For a rank shown on the console the event
loop reads the pipe in large chunks, appends the raw bytes to the rank's file and writes whole
prefixed lines to the console (partial lines wait for their newline, so ranks never interleave
mid-line). For a rank not shown on the console the loop moves the bytes from the pipe into the file
inside the kernel (``splice``), without copying them through the launcher; once the file cannot be
written the pipe is still drained, into nothing, so the rank never blocks.

Neither sink can stop the launcher: a log file that cannot be written (full disk, I/O error) is
reported once and no longer written while the console goes on; the console never blocks
(:mod:`launcher.supervision.console`).
"""

import errno
import fcntl
import logging
import os
import re
from typing import BinaryIO, List, Optional, Tuple, Union

from launcher.supervision.console import Console
from launcher.common.warnonce import WarnOnce

log = logging.getLogger(__name__)

# Read size. Measured with 8 ranks printing flat out (benchmark 6): 32 KiB reads cost the launcher
# ~40 % less CPU per byte than 64 KiB ones, whose console copy (~2x the chunk with the prefixes)
# crosses malloc's 128 KiB mmap threshold; 16 KiB pays more in wakeups.
CHUNK = 1 << 15
# A line held back for its end is shown anyway once this long: a huge line, or output that never
# ends one, must neither grow the launcher's memory without bound nor stay invisible.
MAX_PARTIAL = 1 << 16
_LONE_CR = re.compile(rb"\r(?!\n)")  # \r\n is one line end, as written by Windows-minded code
#: Bytes one ``splice`` may move from a files-only rank's pipe into its file (all the pipe holds).
SPLICE_CHUNK = 1 << 20
#: A rank's pipe holds this much (``F_SETPIPE_SZ``; the kernel's default is 64 KiB): a rank printing
#: in bursts keeps going while the launcher's loop is busy elsewhere for a moment. 1 MiB is what an
#: unprivileged process may ask for by default (``/proc/sys/fs/pipe-max-size``).
PIPE_SIZE = 1 << 20


def rank_pipe() -> Tuple[int, int]:
    """A rank's output pipe ``(read_fd, write_fd)``, enlarged to :data:`PIPE_SIZE` where allowed."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:  # over this user's pipe-buffer quota: the default size works, only smaller
        pass
    return read_fd, write_fd


def open_log(path: str) -> int:
    """Open (create) a rank's log file for appending; returns the fd."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class RankOutput:
    """Tees one rank's output pipe to its log file and the console.

    Args:
        read_fd: Read end of the rank's stdout/stderr pipe.
        log_fd: The rank's log file (O_APPEND), or -1 when it could not be opened.
        label: Console prefix text, e.g. ``rank 3``.
        console: Console (a :class:`Console`, or any binary stream), or None to write only the file.
        warn: Reports a log file that cannot be written, once per rank for the whole run.
        log_path: The log file's path, for that report.
    """

    def __init__(self, read_fd: int, log_fd: int, label: str, console: Optional[Union[Console, BinaryIO]] = None,
                 warn: Optional[WarnOnce] = None, log_path: str = ""):
        self.read_fd = read_fd
        self.log_fd = log_fd
        self.label = label
        self.log_path = log_path
        self.prefix = f"[{label}] ".encode()
        # torch prefixes an uncaught exception's lines with "[rank3]: " (its excepthook, installed by
        # init_process_group, whatever the launcher): said once, as "[rank 3] ", on the console.
        self._doubled = self.prefix + f"[{label.replace(' ', '')}]: ".encode()
        self._newline_prefix = b"\n" + self.prefix
        self._return_prefix = lambda _match: b"\r" + self.prefix
        self.console = console
        self._warn = warn or WarnOnce(log)
        self._partial = b""
        self._splice = console is None and hasattr(os, "splice") and log_fd >= 0 and _unappend(log_fd)

    def pump(self) -> bool:
        """Move what is available to the sinks. Returns False at end of stream (fd closed)."""
        moved = self._move()
        if moved == 0:
            self.close()
            return False
        return True

    def drain(self) -> None:
        """Move what is already in the pipe, then close it (the attempt is over).

        Stops at the first empty read instead of waiting for end-of-file: a process that escaped
        its group could hold the pipe open forever.
        """
        while self.read_fd >= 0 and self._move():
            pass
        if self.read_fd >= 0:
            self.close()

    def _move(self) -> Optional[int]:
        """One chunk from the pipe to the sinks: the bytes moved, 0 at end of stream, None when the
        pipe is empty for now."""
        if self._splice and self.log_fd >= 0:
            try:
                return os.splice(self.read_fd, self.log_fd, SPLICE_CHUNK, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS):  # a file system without splice: copy instead
                    self._splice = False
                else:  # the bytes stay in the pipe: read below, into nothing from now on
                    self.file_failed(exc)
        try:
            data = os.read(self.read_fd, CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data:
            self._tee(data)
        return len(data)

    def _tee(self, data: bytes) -> None:
        if self.log_fd >= 0:
            try:
                _write_all(self.log_fd, data)
            except OSError as exc:
                self.file_failed(exc)
        if self.console is not None:
            self._to_console(data)

    def file_failed(self, exc: OSError) -> None:
        """The log file cannot be written (full disk, I/O error): say so once, stop writing it."""
        self._warn(self.label, "%s: cannot write its log file %s (%s): no longer writing it, the console goes on",
                   self.label, self.log_path or "", exc.strerror or exc)
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1

    def _to_console(self, data: bytes) -> None:
        # A line ends at \n, and also at a lone \r: a progress bar (tqdm) redraws itself with \r and
        # sends \n only when it closes, so each redraw is shown, prefixed, as it arrives.
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if not cut:
            self._partial += data
            if len(self._partial) >= MAX_PARTIAL:
                self._emit(self.prefix + self._partial + b"\n")
                self._partial = b""
            return
        end = 2 if data[cut - 2:cut] == b"\r\n" else 1
        # One C-level replace per chunk instead of a Python loop over lines (~9x cheaper), and one
        # join: every copy of the chunk costs the ranks CPU on a busy node.
        body = data[:cut - end].replace(b"\n", self._newline_prefix)
        if b"\r" in body:
            body = _LONE_CR.sub(self._return_prefix, body)
        self._emit(b"".join((self.prefix, self._partial, body, data[cut - end:cut])))
        self._partial = data[cut:]

    def _emit(self, data: bytes) -> None:
        if self._doubled in data:
            data = data.replace(self._doubled, self.prefix)
        try:
            self.console.write(data)  # a Console never blocks nor raises; a plain stream might
        except (OSError, ValueError):  # console gone (closed terminal / pipe): keep the files going
            self.console = None

    def close(self) -> None:
        """Flush a trailing partial line and close the pipe and the log file."""
        if self.console is not None and self._partial:
            self._emit(self.prefix + self._partial + b"\n")
        self._partial = b""
        for fd in (self.read_fd, self.log_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.log_fd = -1


def _unappend(fd: int) -> bool:
    """Make ``fd`` (a log file opened ``O_APPEND``) writable by ``splice``, which refuses append mode:
    the same position, the end, now kept by the file offset (the launcher is its only writer)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        return False
    return True


def tail_lines(path: str, count: int = 10, max_bytes: int = 8192) -> List[str]:
    """The last ``count`` lines of a log file (for the root-cause summary)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-count:]
