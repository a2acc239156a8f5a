"""The client end of the control channel (``launcher.control.server`` is the server in the supervisor).

Kept apart and light (json, socket, nothing else) because a preStop hook pays every import of
``launcher prestop`` before the gasp starts: see benchmark 4 in ``docs/benchmarks.md``.
"""

import json
import socket
import time
from typing import Any, Dict, Iterator, Optional

from launcher.common.errors import LauncherError
from launcher.common.inputfiles import loads_json


class NoSupervisor(LauncherError):
    """No supervisor listens on the run dir's socket (not started, or dead)."""


#: Seconds to wait for the supervisor to accept the connection and send its first answer. A live
#: event loop answers within milliseconds (every request is acknowledged at once); one that does not
#: (stopped, hung, or its backlog full) counts as no supervisor.
CONNECT_TIMEOUT = 5.0


def request(path: str, command: str, args: Optional[Dict[str, Any]] = None,
            timeout: Optional[float] = None, first_timeout: float = CONNECT_TIMEOUT) -> Iterator[Dict[str, Any]]:
    """Send one request and yield the answers until the server closes the connection.

    Args:
        path: The control socket.
        command: The request's command.
        args: Its parameters.
        timeout: Seconds to wait for each later answer (None: as long as it takes).
        first_timeout: Deadline for connecting, sending and the first answer together. A stopped
            supervisor's socket still accepts into its backlog, so only this deadline tells.

    Raises:
        NoSupervisor: nothing listens on ``path``, or no first answer within ``first_timeout``
            (connection refused, backlog full, silence, or closed without answering).
        LauncherError: a later answer did not come within ``timeout``, was malformed, or the
            connection broke after the first answer.
    """
    deadline = time.monotonic() + first_timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(first_timeout if timeout is None else min(timeout, first_timeout))
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise NoSupervisor(f"no launcher is listening on {path}: {exc.strerror}") from None
    except (socket.timeout, BlockingIOError):  # a full backlog: EAGAIN at once on a unix socket
        sock.close()
        raise NoSupervisor(f"the launcher on {path} does not accept connections") from None
    answered = False
    with sock, sock.makefile("rb") as reader:
        try:
            sock.settimeout(max(0.0, deadline - time.monotonic()))
            sock.sendall((json.dumps({"command": command, "args": args or {}}) + "\n").encode())
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            for line in reader:
                try:
                    answer = loads_json(line, path, "answer on")  # bounded: no RecursionError
                except ValueError as exc:
                    raise LauncherError(f"malformed answer from the launcher on {path}: {exc}") from None
                if not answered:
                    answered = True
                    sock.settimeout(timeout)
                yield answer
        except socket.timeout:
            if not answered:
                raise NoSupervisor(f"the launcher on {path} did not answer {command!r} within "
                                   f"{first_timeout:g} s (stopped or hung)") from None
            raise LauncherError(f"the launcher did not answer {command!r} within {timeout:g} s") from None
        except ValueError:
            raise LauncherError("malformed answer from the launcher") from None
        except OSError as exc:  # reset / broken pipe: the supervisor died or refused us
            if not answered:
                raise NoSupervisor(f"the launcher closed the connection without answering: "
                                   f"{exc.strerror or exc}") from None
            raise LauncherError(f"lost the connection to the launcher: {exc.strerror or exc}") from None
