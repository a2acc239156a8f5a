"""Mechanism: whether a TCP port of this network namespace is listening, and a short wait for it.

Asked of the kernel, never by connecting: a connection would reach the server that listens there
(torch's TCPStore) as a client it does not know. The answer comes from ``sock_diag`` netlink (what
``ss -ltn`` uses), asking for listening sockets only, which the kernel finds in its listening table
(0.05 ms here). ``/proc/net/tcp`` and ``/proc/net/tcp6`` are read only where netlink cannot be used:
they walk every connection bucket of the namespace (3 ms each here, with 20 sockets), too slow for
the supervisor's loop, which asks when a rank exits.
"""

import socket
import struct
import time
from typing import Optional, Set, Tuple

from launcher.supervision.cgroup import read_file

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"
_POLL = 0.002
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x301
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCPF_LISTEN = 1 << 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_MAX_MESSAGES = 1 << 16  # recv calls per dump: a bound, far above any namespace's listening sockets


def port_listening(table: str, port: int) -> bool:
    """Whether ``table``, the text of ``/proc/net/tcp`` or ``/proc/net/tcp6``, has a socket listening
    on ``port`` (any local address). Lines that are not the kernel's format count as no socket."""
    suffix = f":{port:04X}"
    for line in table.splitlines()[1:]:  # the first line names the columns
        fields = line.split()
        if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == _LISTEN:
            return True
    return False


def diag_ports(data: bytes) -> Tuple[Set[int], bool]:
    """The local ports of the ``inet_diag_msg`` records in one netlink datagram, and whether the dump
    ended with it (``NLMSG_DONE``, an error, or a record too short or longer than the datagram: not
    the kernel's)."""
    ports: Set[int] = set()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind = _HEADER.unpack_from(data, offset)[:2]
        if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < _HEADER.size + 6 or offset + length > len(data):
            return ports, True
        ports.add(struct.unpack_from("!H", data, offset + _HEADER.size + 4)[0])  # idiag_sport
        offset += (length + 3) & ~3
    return ports, False


def _listening_ports(family: int) -> Set[int]:
    """Local ports of the listening TCP sockets of ``family`` here (``sock_diag``); OSError where
    netlink is not allowed."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _TCPF_LISTEN) + bytes(48)
    message = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0) + request
    ports: Set[int] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        sock.sendto(message, (0, 0))
        for _ in range(_MAX_MESSAGES):
            found, done = diag_ports(sock.recv(1 << 16))
            ports |= found
            if done:
                break
    return ports


def _netlink_listening(port: int) -> Optional[bool]:
    try:
        return any(port in _listening_ports(family) for family in (socket.AF_INET, socket.AF_INET6))
    except OSError:  # no netlink here (a sandbox): the tables
        return None


def listening(port: int) -> bool:
    """Whether something listens on TCP ``port`` here (False where nothing can tell)."""
    answer = _netlink_listening(port)
    if answer is not None:
        return answer
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
