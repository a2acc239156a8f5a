"""Mechanism: whether a TCP port of this network namespace is listening, and a short wait for it.

Read from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (a socket in state ``0A``, LISTEN, whose local
port is the one asked for), never by connecting: a connection would reach the server that listens
there (torch's TCPStore) as a client it does not know.
"""

import time

from launcher.supervision.cgroup import read_file

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"
_POLL = 0.002


def port_listening(table: str, port: int) -> bool:
    """Whether ``table``, the text of ``/proc/net/tcp`` or ``/proc/net/tcp6``, has a socket listening
    on ``port`` (any local address). Lines that are not the kernel's format count as no socket."""
    suffix = f":{port:04X}"
    for line in table.splitlines()[1:]:  # the first line names the columns
        fields = line.split()
        if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == _LISTEN:
            return True
    return False


def listening(port: int) -> bool:
    """Whether something listens on TCP ``port`` here (False where the tables cannot be read)."""
    for path in TABLES:
        try:
            if port_listening(read_file(path).decode("ascii", "replace"), port):
                return True
        except OSError:
            continue
    return False


def wait_listening(port: int, timeout: float) -> bool:
    """Poll until ``port`` listens or ``timeout`` seconds passed; returns whether it listens."""
    deadline = time.monotonic() + timeout
    while not listening(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True
