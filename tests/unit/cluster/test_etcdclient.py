"""The etcd client's kept connections without a server: ``close()`` closes the idle ones and never
one a thread took for a call (closing that under the call broke it: ``reentrant call``). The calls
themselves are tested on a real etcd in tests/integration/test_etcdclient.py."""

import http.client
import socket
import threading

from launcher.cluster.etcdclient import EtcdClient

ENDPOINT = ("127.0.0.1", 2379)


def connection() -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(*ENDPOINT)
    conn.sock, peer = socket.socketpair()
    peer.close()
    return conn


def test_close_closes_the_idle_connections_and_none_in_use():
    client = EtcdClient([ENDPOINT])
    idle = client._idle()
    in_use, kept = connection(), connection()
    client._keep(idle, ENDPOINT, in_use)
    assert client._take(idle, ENDPOINT) is in_use  # a call took it
    client._keep(client._idle(), ("127.0.0.1", 2380), kept)
    client.close()
    assert in_use.sock is not None and kept.sock is None
    assert client._take(idle, ENDPOINT) is None  # taken: not offered twice
    in_use.close()


def test_a_thread_is_offered_only_its_own_connection():
    client = EtcdClient([ENDPOINT])
    conn = connection()
    client._keep(client._idle(), ENDPOINT, conn)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(client._take(client._idle(), ENDPOINT)))
    thread.start()
    thread.join()
    assert seen == [None] and client._take(client._idle(), ENDPOINT) is conn
    conn.close()
