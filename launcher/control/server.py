"""The control channel between ``launcher prestop`` / ``launcher exit`` and a running supervisor.

A unix stream socket in the private (0700) run dir; the server also checks the peer's uid with
``SO_PEERCRED``. Protocol: the client sends one JSON line ``{"command": ..., "args": {...}}``; the
server answers with JSON lines, the last one ending the connection. Requests become
``ControlRequest`` events in the supervisor's event loop, so the loop never blocks on a client.
"""

import json
import logging
import os
import socket
import struct
from typing import Any, Callable, Dict, Optional

from launcher.common.inputfiles import loads_json
from launcher.supervision.integration import Host, Integration
from launcher.supervision.loopevents import ControlRequest

log = logging.getLogger(__name__)

MAX_REQUEST = 64 * 1024


class ControlServer:
    """Accepts requests on ``path`` and posts them as events.

    Args:
        path: Socket path inside the run dir (a stale file is replaced).
        add_reader: Registers ``(fd, callback)`` with the event loop.
        remove_reader: Unregisters an fd.
        post: Queues a ``ControlRequest`` for the supervisor.
    """

    def __init__(self, path: str, add_reader: Callable[[int, Callable[[], None]], None],
                 remove_reader: Callable[[int], None], post: Callable[[ControlRequest], None]):
        self.path = path
        self._add_reader, self._remove_reader, self._post = add_reader, remove_reader, post
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
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return
        except OSError as exc:  # e.g. out of file descriptors: the client is refused, the loop goes on
            log.warning("cannot accept a control connection: %s", exc.strerror or exc)
            return
        if not _same_user(conn):
            conn.close()
            log.warning("refused a control connection from another user")
            return
        conn.setblocking(False)
        fd = conn.fileno()
        self._conns[fd], self._buffers[fd] = conn, b""
        self._add_reader(fd, lambda: self._read(fd))

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
        del self._buffers[fd]
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
        self.server = ControlServer(host.run_dir.socket_address(), group.add_reader, group.remove_reader, group.post)

    def stop(self) -> None:
        """Close the socket (a later ``launcher prestop`` finds no supervisor)."""
        if self.server is not None:
            self.server.close()
