"""The control channel between ``launcher prestop`` / ``launcher exit`` and a running supervisor.

A unix stream socket in the private (0700) run dir; the server also checks the peer's uid with
``SO_PEERCRED``. Protocol: the client sends one JSON line ``{"command": ..., "args": {...}}``; the
server answers with JSON lines, the last one ending the connection. Requests become
``ControlRequest`` events in the supervisor's event loop, so the loop never blocks on a client.

Clients cannot take the launcher's file descriptors (it needs them to start ranks): at most
:func:`connection_cap` connections are open at once, a client has ``REQUEST_TIMEOUT`` seconds to send
its request, and a new client closes the oldest one still silent. When ``accept`` fails for want of
descriptors (EMFILE, ENFILE: something else took them) the server frees one (the oldest silent client,
else its reserve descriptor, to refuse the waiting client cleanly), says so once, and stops watching
the socket for ``ACCEPT_BACKOFF`` seconds instead of spinning on it.
"""

import errno
import json
import logging
import os
import resource
import socket
import struct
import time
from typing import Any, Callable, Dict, Optional

from launcher.common.warnonce import WarnOnce
from launcher.common.inputfiles import loads_json
from launcher.supervision.integration import Host, Integration
from launcher.supervision.loopevents import ControlRequest

log = logging.getLogger(__name__)

MAX_REQUEST = 64 * 1024
#: Seconds a client has, once connected, to send its request line.
REQUEST_TIMEOUT = 5.0
#: Seconds the socket is left alone after ``accept`` found no free descriptor.
ACCEPT_BACKOFF = 0.5
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


def connection_cap() -> int:
    """Control connections open at once: a sixteenth of the descriptors this process may open (4 to
    64), so that the ranks' pipes and log files always find theirs (``ulimit -n 256``: 16)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(4, min(64, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 16))


class ControlServer:
    """Accepts requests on ``path`` and posts them as events.

    Args:
        path: Socket path inside the run dir (a stale file is replaced).
        add_reader: Registers ``(fd, callback)`` with the event loop.
        remove_reader: Unregisters an fd.
        post: Queues a ``ControlRequest`` for the supervisor.
        call_later: ``call_later(seconds, callback)`` of the event loop: closes silent clients on
            time and ends a back-off (without it, silent clients are closed at the next accept).
        max_connections: Connections open at once (default :func:`connection_cap`).
    """

    def __init__(self, path: str, add_reader: Callable[[int, Callable[[], None]], None],
                 remove_reader: Callable[[int], None], post: Callable[[ControlRequest], None],
                 call_later: Optional[Callable[[float, Callable[[], None]], object]] = None,
                 max_connections: Optional[int] = None):
        self.path = path
        self._add_reader, self._remove_reader, self._post = add_reader, remove_reader, post
        self._call_later = call_later
        self.max_connections = max_connections or connection_cap()
        self._since: Dict[int, float] = {}  # when each client still sending its request connected
        self._sweep_pending = self._paused = False
        self._warn = WarnOnce(log)
        self._reserve: Optional[int] = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if os.path.lexists(path):
            os.unlink(path)  # left by a launcher that was SIGKILLed; we hold the run-dir lock
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old_umask)
        self._sock.listen(16)
        self._sock.setblocking(False)
        self._buffers: Dict[int, bytes] = {}
        self._conns: Dict[int, socket.socket] = {}
        add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        self._close_silent(time.monotonic() - REQUEST_TIMEOUT)
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in _OUT_OF_FDS:
                self._out_of_descriptors(exc)
            else:
                self._warn(exc.errno, "cannot accept a control connection: %s", exc.strerror or exc)
            return
        if not _same_user(conn):
            conn.close()
            log.warning("refused a control connection from another user")
            return
        if len(self._conns) >= self.max_connections and not self._close_oldest_silent():
            conn.close()  # every slot answers a request in progress
            self._warn("cap", "%d control connections open (the most at once): refusing more", len(self._conns))
            return
        conn.setblocking(False)
        fd = conn.fileno()
        self._conns[fd], self._buffers[fd], self._since[fd] = conn, b"", time.monotonic()
        self._add_reader(fd, lambda: self._read(fd))
        self._schedule_sweep()

    def _out_of_descriptors(self, exc: OSError) -> None:
        """``accept`` found no free descriptor: free one and serve the waiting client, else refuse it
        with the reserve descriptor; either way leave the socket alone for a while."""
        self._warn("fds", "out of file descriptors (%s): closing silent control clients, refusing new ones "
                   "until some are free", exc.strerror)
        if not self._close_oldest_silent() and self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            try:
                self._sock.accept()[0].close()  # its client sees the connection closed, not a hang
            except OSError:
                pass
            try:
                self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # taken meanwhile: tried again at the next shortage
        if self._call_later is not None and not self._paused:
            self._paused = True
            self._remove_reader(self._sock.fileno())
            self._call_later(ACCEPT_BACKOFF, self._resume)

    def _resume(self) -> None:
        if self._paused and self._sock.fileno() >= 0:
            self._paused = False
            self._add_reader(self._sock.fileno(), self._accept)

    def _close_oldest_silent(self) -> bool:
        """Close the client that connected first among those that sent no request yet."""
        if not self._since:
            return False
        self._drop(min(self._since, key=self._since.__getitem__))
        return True

    def _close_silent(self, before: float) -> None:
        """Close the clients that connected before ``before`` and sent no request since."""
        for fd in [fd for fd, since in self._since.items() if since <= before]:
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        self._remove_reader(fd)
        self._buffers.pop(fd, None)
        self._since.pop(fd, None)
        conn = self._conns.pop(fd, None)
        if conn is not None:
            conn.close()

    def _schedule_sweep(self) -> None:
        if self._call_later is not None and not self._sweep_pending:
            self._sweep_pending = True
            self._call_later(REQUEST_TIMEOUT, self._sweep)

    def _sweep(self) -> None:
        self._sweep_pending = False
        self._close_silent(time.monotonic() - REQUEST_TIMEOUT)
        if self._since:
            self._schedule_sweep()

    def _read(self, fd: int) -> None:
        conn = self._conns[fd]
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buffer = self._buffers[fd] + data
        if b"\n" not in buffer and data and len(buffer) < MAX_REQUEST:
            self._buffers[fd] = buffer
            return
        self._remove_reader(fd)
        del self._buffers[fd], self._since[fd]
        conn = self._conns[fd]
        try:
            request = loads_json(buffer.split(b"\n", 1)[0], "control socket", "request on")  # bounded: no RecursionError
            command, args = request["command"], dict(request.get("args") or {})
            if not isinstance(command, str):
                raise TypeError(command)
        except (ValueError, KeyError, TypeError, AttributeError):
            self._send(fd, conn, {"ok": False, "error": "malformed request"}, final=True)
            return
        self._post(ControlRequest(command, args,
                                  lambda payload, final=False: self._send(fd, conn, payload, final)))

    def _send(self, fd: int, conn: socket.socket, payload: Any, final: bool = False) -> None:
        # The connection object, not the fd number: once this client is gone its fd may belong to
        # a later client, which must never get this request's answers.
        if self._conns.get(fd) is not conn:
            return
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)  # a client that stops reading must not stall the supervisor
            conn.sendall((json.dumps(payload, default=str) + "\n").encode())
        except OSError:
            final = True
        if final:
            self._conns.pop(fd, None)
            conn.close()

    def close(self) -> None:
        """Stop listening; answer nobody further."""
        self._remove_reader(self._sock.fileno())
        self._sock.close()
        self._since.clear()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        for fd, conn in self._conns.items():
            if fd in self._buffers:  # still reading its request: watched by the loop
                self._remove_reader(fd)
            conn.close()
        self._conns.clear()
        self._buffers.clear()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _same_user(conn: socket.socket) -> bool:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return True  # no SO_PEERCRED here: the 0700 run dir is the protection
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.geteuid()


class ControlChannel(Integration):
    """The control socket as an integration of ``launcher run``: listening until the run ends."""

    name = "control server"

    def __init__(self) -> None:
        self.server: Optional[ControlServer] = None

    def start(self, host: Host) -> None:
        """Listen on the run dir's socket; requests reach the supervisor as events of its loop."""
        group = host.group
        self.server = ControlServer(host.run_dir.socket_address(), group.add_reader, group.remove_reader, group.post,
                                    group.call_later)

    def stop(self) -> None:
        """Close the socket (a later ``launcher prestop`` finds no supervisor)."""
        if self.server is not None:
            self.server.close()
