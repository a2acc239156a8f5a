"""``launcher.supervision.listening``: the /proc/net/tcp parser (examples, malformed input,
properties) and the wait against real sockets of this machine."""

import socket
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


def test_unreadable_tables_mean_not_listening(monkeypatch):
    monkeypatch.setattr(listening, "TABLES", ("/nonexistent/tcp",))
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert not listening.listening(server.getsockname()[1])
