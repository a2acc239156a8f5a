"""``launcher.supervision.listening``: the sock_diag and /proc/net/tcp parsers (examples, malformed
input, properties) and the answers and the wait against real sockets of this machine."""

import socket
import struct
import time

import pytest
from hypothesis import given, strategies as st

from launcher.supervision import listening

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
TCP = HEADER + (
    "   0: 0100007F:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123 1\n"
    "   1: 0100007F:9C40 0100007F:7531 01 00000000:00000000 00:00000000 00000000     0        0 124 1\n")
TCP6 = HEADER + ("   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A "
                 "00000000:00000000 00:00000000 00000000     0        0 125 1\n")


def test_a_listening_socket_on_ipv4_and_ipv6():
    assert listening.port_listening(TCP, 30001)  # 0x7531
    assert listening.port_listening(TCP6, 8080)  # 0x1F90


def test_a_connection_from_that_port_or_to_it_is_not_listening():
    assert not listening.port_listening(TCP, 40000)  # 0x9C40: an established connection's local port
    assert not listening.port_listening(TCP.replace(" 0A ", " 06 "), 30001)  # TIME_WAIT


@pytest.mark.parametrize("table", ["", HEADER, "garbage", HEADER + "0: 0100007F:7531", HEADER + "0A 0A 0A 0A\n",
                                   TCP.splitlines()[1] + "\n"])  # the only socket line taken for the header
def test_malformed_tables_have_no_listener(table):
    assert not listening.port_listening(table, 30001)


@given(st.text(), st.integers(min_value=1, max_value=65535))
def test_parser_never_raises(table, port):
    assert listening.port_listening(table, port) in (True, False)


def test_wait_sees_a_real_listener_and_gives_up_on_a_bound_socket_that_does_not_listen():
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        started = time.monotonic()
        assert not listening.wait_listening(port, 0.05)
        assert time.monotonic() - started >= 0.05
        bound.listen()
        assert listening.wait_listening(port, 5.0)


def _record(sport: int, kind: int = 20) -> bytes:
    """One netlink message as the kernel sends it for a listening socket: nlmsghdr + inet_diag_msg."""
    body = struct.pack("=BBBB", socket.AF_INET, 10, 0, 0) + struct.pack("!HH", sport, 0) + bytes(64)
    return struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body


DONE = struct.pack("=IHHII", 20, 3, 2, 1, 0) + bytes(4)


def test_diag_records_give_their_local_ports_until_done():
    assert listening.diag_ports(_record(29500) + _record(8080)) == ({29500, 8080}, False)
    assert listening.diag_ports(_record(29500) + DONE + _record(8080)) == ({29500}, True)
    assert listening.diag_ports(struct.pack("=IHHII", 20, 2, 0, 1, 0) + bytes(4)) == (set(), True)  # error


@pytest.mark.parametrize("data", [b"", b"\0" * 15, struct.pack("=IHHII", 0, 20, 0, 0, 0),
                                  struct.pack("=IHHII", 17, 20, 0, 0, 0) + b"x", _record(1)[:20]])
def test_malformed_diag_data_ends_the_dump_without_a_port(data):
    ports, _done = listening.diag_ports(data)
    assert ports == set()


@given(st.binary())
def test_diag_parser_never_raises(data):
    ports, done = listening.diag_ports(data)
    assert all(0 <= port < 65536 for port in ports) and done in (True, False)


@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc-tables"])
def test_both_ways_find_a_real_listener_on_ipv4_and_ipv6(monkeypatch, netlink):
    if not netlink:
        monkeypatch.setattr(listening, "_netlink_listening", lambda port: None)
    with socket.create_server(("127.0.0.1", 0)) as four, \
            socket.create_server(("::1", 0), family=socket.AF_INET6) as six:
        assert listening.listening(four.getsockname()[1]) and listening.listening(six.getsockname()[1])
        with socket.socket() as bound:
            bound.bind(("127.0.0.1", 0))
            assert not listening.listening(bound.getsockname()[1])


def test_unreadable_tables_without_netlink_mean_not_listening(monkeypatch):
    monkeypatch.setattr(listening, "_netlink_listening", lambda port: None)
    monkeypatch.setattr(listening, "TABLES", ("/nonexistent/tcp",))
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert not listening.listening(server.getsockname()[1])
