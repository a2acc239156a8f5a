"""The client end of the control channel (``launcher.control`` is the server in the supervisor).

Kept apart and light (json, socket, nothing else) because a preStop hook pays every import of
``launcher prestop`` before the gasp starts: see benchmark 4 in ``docs/benchmarks.md``.
"""

import json
import socket
from typing import Any, Dict, Iterator, Optional

from launcher.errors import LauncherError


class NoSupervisor(LauncherError):
    """No supervisor listens on the run dir's socket (not started, or dead)."""


def request(path: str, command: str, args: Optional[Dict[str, Any]] = None,
            timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
    """Send one request and yield the answers until the server closes the connection.

    Raises:
        NoSupervisor: nothing listens on ``path``.
        LauncherError: the answer did not come within ``timeout`` or was malformed.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise NoSupervisor(f"no launcher is listening on {path}: {exc.strerror}") from None
    with sock:
        sock.settimeout(timeout)
        sock.sendall((json.dumps({"command": command, "args": args or {}}) + "\n").encode())
        reader = sock.makefile("rb")
        try:
            for line in reader:
                yield json.loads(line)
        except socket.timeout:
            raise LauncherError(f"the launcher did not answer {command!r} within {timeout:.0f} s") from None
        except ValueError:
            raise LauncherError("malformed answer from the launcher") from None
