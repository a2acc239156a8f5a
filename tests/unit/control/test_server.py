"""Unit tests for ``launcher.control.server.ControlServer``: the supervisor's end of the control socket.

Real unix sockets in a short private dir under /tmp (``tmp_path`` can exceed the 108-byte limit).
The server is driven by a real ``selectors`` loop stepped from the test thread, as the supervisor's
loop would; clients are plain blocking sockets with a timeout (threads only where a send can block).
Unix sockets deliver synchronously, so "ready now" is checked with zero-timeout selects, never sleeps.
"""

import contextlib
import json
import os
import select
import selectors
import shutil
import socket
import stat
import tempfile
import threading
import time

import pytest

from launcher.control import server as control
from launcher.control.server import MAX_REQUEST, ControlServer
from launcher.supervision.loopevents import ControlRequest

MALFORMED = {"ok": False, "error": "malformed request"}


class Harness:
    """The supervisor's side: a reader registry on a real selector, the posted events, the clients."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ctl-", dir="/tmp")  # tmp_path may be too long for a socket
        self.path = os.path.join(self.dir, "control.sock")
        self.selector = selectors.DefaultSelector()
        self.posted, self.added, self.clients, self.servers = [], [], [], []

    def start(self):
        self.servers.append(ControlServer(self.path, self.add_reader, self.remove_reader, self.posted.append))
        return self.servers[-1]

    def add_reader(self, fd, callback):
        self.selector.register(fd, selectors.EVENT_READ, callback)
        self.added.append(fd)  # every fd ever registered, in order

    def remove_reader(self, fd):
        with contextlib.suppress(KeyError, ValueError):  # as LocalProcessGroup.remove_reader
            self.selector.unregister(fd)

    def watched(self):
        return set(self.selector.get_map())  # the fds still registered

    def connect(self, request=b""):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.clients.append(sock)
        sock.settimeout(5)
        sock.connect(self.path)
        sock.sendall(request)
        return sock

    def run_until(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not get there in time"
            for key, _ in self.selector.select(min(remaining, 0.1)):
                key.data()

    def drain(self):  # run callbacks until no watched fd is ready
        while ready := self.selector.select(0):
            for key, _ in ready:
                key.data()

    def close(self):
        for item in self.clients + self.servers:
            item.close()
        self.selector.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def readable(sock):
    return bool(select.select([sock], [], [], 0)[0])


def answers(sock):
    """Every JSON line the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def closed_by_server(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed with our request still unread
        return True


@pytest.fixture
def loop():
    harness = Harness()
    yield harness
    harness.close()


@pytest.fixture
def server(loop):
    return loop.start()


def test_a_request_is_posted_and_every_reply_reaches_the_client(server, loop):
    client = loop.connect(b'{"command": "gasp", "args": {"save": true}}\n')
    loop.run_until(lambda: loop.posted)
    [req] = loop.posted
    assert isinstance(req, ControlRequest)
    assert (req.command, req.args) == ("gasp", {"save": True})
    req.reply({"ok": True, "progress": 1})
    assert client.recv(100) == b'{"ok": true, "progress": 1}\n'
    assert not readable(client)  # not final: the connection stays open
    req.reply({"ok": True, "done": True, "path": control}, final=True)  # default=str for the rest
    [last] = answers(client)
    assert last["done"] is True and last["path"].startswith("<module 'launcher.control.server'")
    assert len(loop.posted) == 1


@pytest.mark.parametrize("end", ["newline", "eof"])
def test_a_request_split_across_writes_waits_for_its_end(server, loop, end):
    client = loop.connect()
    for piece in (b'{"command": "ex', b'it", "args": {"a": 1}}'):
        client.sendall(piece)
        loop.drain()
        assert loop.posted == [] and not readable(client)
    if end == "newline":
        client.sendall(b"\n")
    else:
        client.shutdown(socket.SHUT_WR)
    loop.run_until(lambda: loop.posted)
    assert (loop.posted[0].command, loop.posted[0].args) == ("exit", {"a": 1})


@pytest.mark.parametrize("line, posted", [
    (b'{"command": "status"}\n', ("status", {})), (b'{"command": "status", "args": null}\n', ("status", {})),
    (b'{"command": "a", "args": {"b": 1}}\n{"command": "c"}\n', ("a", {"b": 1})),  # one request a connection
    (b"not json\n", None), (b"\n", None), (b"[1, 2]\n", None), (b'"gasp"\n', None), (b'{"args": {}}\n', None),
    (b'{"command": "x", "args": 5}\n', None), (b'{"command": "x", "args": "ab"}\n', None), (b"\xff\xfe\n", None),
    (b"", None)])  # b"": a client that connects and says nothing
def test_a_request_is_parsed_or_answered_as_malformed_and_closed(server, loop, line, posted):
    client = loop.connect(line)
    client.shutdown(socket.SHUT_WR)
    loop.run_until(lambda: loop.posted or readable(client))
    loop.drain()
    assert loop.watched() == {loop.added[0]}  # the connection is read no further
    if posted:
        assert [(req.command, req.args) for req in loop.posted] == [posted] and not readable(client)
    else:
        assert answers(client) == [MALFORMED] and loop.posted == []


def test_an_over_long_request_without_newline_is_refused_at_the_limit(server, loop):
    client = loop.connect()
    sender = threading.Thread(target=client.sendall, args=(b"x" * (MAX_REQUEST - 1),))
    sender.start()
    loop.run_until(lambda: not sender.is_alive())  # keep reading while the sender may block
    sender.join(5)
    loop.drain()
    assert not readable(client)  # one byte short of the limit: still waiting for the newline
    client.sendall(b"x")
    loop.run_until(lambda: readable(client))
    assert answers(client) == [MALFORMED]
    assert loop.posted == []


def test_a_client_of_another_user_is_closed_without_a_post(server, loop, monkeypatch, caplog):
    real_euid = os.geteuid()
    monkeypatch.setattr(control.os, "geteuid", lambda: real_euid + 1)
    client = loop.connect(b'{"command": "gasp"}\n')
    loop.run_until(lambda: readable(client))
    assert closed_by_server(client)
    loop.drain()
    assert loop.posted == [] and loop.watched() == {loop.added[0]}
    assert "refused a control connection from another user" in caplog.text


def test_without_peer_credentials_the_private_run_dir_is_trusted():
    class NoPeerCred:
        def getsockopt(self, *args):
            raise OSError("SO_PEERCRED not supported")

    assert control._same_user(NoPeerCred()) is True


def test_a_stale_socket_file_is_replaced_by_a_private_socket(loop):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(loop.path)
    stale.close()  # the file stays, as after a SIGKILLed launcher
    old = os.umask(0o022)
    try:
        loop.start()
    finally:
        assert os.umask(old) == 0o022  # restored
    mode = os.stat(loop.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    loop.connect(b'{"command": "status"}\n')
    loop.run_until(lambda: loop.posted)


def test_replies_go_to_the_client_that_asked(server, loop):
    first, second = loop.connect(b'{"command": "one"}\n'), loop.connect(b'{"command": "two"}\n')
    loop.run_until(lambda: len(loop.posted) == 2)
    by_command = {req.command: req for req in loop.posted}
    by_command["two"].reply({"for": "two"}, final=True)
    by_command["one"].reply({"for": "one"}, final=True)
    assert answers(first) == [{"for": "one"}] and answers(second) == [{"for": "two"}]


def test_a_reply_to_a_client_that_left_is_dropped(server, loop):
    client = loop.connect(b'{"command": "gasp"}\n')
    loop.run_until(lambda: loop.posted)
    client.close()
    loop.posted[0].reply({"progress": 1})  # EPIPE: no exception into the supervisor
    loop.posted[0].reply({"done": True}, final=True)


def test_a_client_that_stops_reading_does_not_stall_the_server(server, loop):
    client = loop.connect(b'{"command": "status"}\n')
    loop.run_until(lambda: loop.posted)
    huge = {"blob": "x" * (16 * 1024 * 1024)}  # far more than the socket buffers hold
    replier = threading.Thread(target=loop.posted[0].reply, args=(huge,))
    replier.start()
    replier.join(5)
    if replier.is_alive():
        client.close()  # unblocks the send so the thread ends
        replier.join(5)
        pytest.fail("the reply blocked on a client that does not read")
    received = 0
    while chunk := client.recv(1 << 20):  # what was buffered, then EOF: the connection was given up
        received += len(chunk)
    assert received < len(huge["blob"])


def test_close_stops_listening_and_ends_pending_requests(server, loop):
    client = loop.connect(b'{"command": "gasp"}\n')
    loop.run_until(lambda: loop.posted)
    server.close()
    assert not os.path.lexists(server.path)
    assert loop.watched() == set()
    assert closed_by_server(client)
    loop.posted[0].reply({"late": True}, final=True)  # answers nobody, raises nothing
    with pytest.raises(FileNotFoundError):
        loop.connect()
def test_close_unregisters_connections_still_reading(server, loop):
    loop.connect(b'{"comm')
    loop.drain()
    assert len(loop.watched()) == 2  # the listener and the accepted connection
    server.close()
    assert loop.watched() == set()
def test_a_reply_after_the_final_one_does_not_reach_a_later_client(server, loop):
    first = loop.connect(b'{"command": "gasp"}\n')
    loop.run_until(lambda: loop.posted)
    second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # its fd is taken before the server's is freed
    with second:
        second.settimeout(5)
        loop.posted[0].reply({"ok": True}, final=True)
        assert answers(first) == [{"ok": True}]
        second.connect(server.path)
        second.sendall(b'{"command": "status"}\n')
        loop.run_until(lambda: len(loop.posted) == 2)
        if loop.added[2] != loop.added[1]:
            pytest.skip("the kernel did not reuse the fd; nothing to show")
        loop.posted[0].reply({"stale": True})  # e.g. a progress line for a client that timed out
        loop.posted[1].reply({"ok": True}, final=True)
        assert answers(second) == [{"ok": True}]


# -- descriptors: a cap, silent clients closed, no spinning when accept finds none (issue 27) -------
def test_a_new_client_closes_the_oldest_silent_one_at_the_cap(loop):
    loop.servers.append(ControlServer(loop.path, loop.add_reader, loop.remove_reader, loop.posted.append,
                                      max_connections=2))
    first, second = loop.connect(), loop.connect()
    loop.drain()
    third = loop.connect(b'{"command": "status"}\n')
    loop.run_until(lambda: loop.posted)
    assert closed_by_server(first) and not readable(second)
    assert loop.posted[0].command == "status"
    loop.posted[0].reply({"ok": True}, final=True)
    assert answers(third) == [{"ok": True}]


def test_at_the_cap_with_every_client_answered_a_new_one_is_refused_once(loop, caplog):
    loop.servers.append(ControlServer(loop.path, loop.add_reader, loop.remove_reader, loop.posted.append,
                                      max_connections=1))
    loop.connect(b'{"command": "gasp"}\n')
    loop.run_until(lambda: loop.posted)
    extra = [loop.connect() for _ in range(3)]
    loop.drain()
    assert all(closed_by_server(sock) for sock in extra)
    assert caplog.text.count("control connections open (the most at once): refusing more") == 1


def test_a_silent_client_is_closed_after_the_request_timeout(loop, monkeypatch):
    timers = []
    loop.servers.append(ControlServer(loop.path, loop.add_reader, loop.remove_reader, loop.posted.append,
                                      lambda delay, callback: timers.append((delay, callback))))
    silent = loop.connect()
    loop.drain()
    assert [delay for delay, _ in timers] == [control.REQUEST_TIMEOUT]
    monkeypatch.setattr(control, "REQUEST_TIMEOUT", 0.0)  # its time is up
    timers.pop()[1]()
    assert closed_by_server(silent) and not timers  # nobody left to time out


def test_connection_cap_follows_the_descriptor_limit(monkeypatch):
    for soft, cap in ((256, 16), (32, 4), (1 << 20, 64), (control.resource.RLIM_INFINITY, 64)):
        monkeypatch.setattr(control.resource, "getrlimit", lambda _what, soft=soft: (soft, soft))
        assert control.connection_cap() == cap


OUT_OF_FDS = r"""
import logging, os, resource, selectors, socket, sys, time
sys.path.insert(0, sys.argv[2])
from launcher.control.server import ControlServer
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
sel, posted, timers, calls = selectors.DefaultSelector(), [], [], [0]
def add(fd, callback):
    def counted():
        calls[0] += 1
        callback()
    sel.register(fd, selectors.EVENT_READ, counted)
def remove(fd):
    if fd in sel.get_map():
        sel.unregister(fd)
server = ControlServer(sys.argv[1], add, remove, posted.append, lambda d, cb: timers.append((time.monotonic() + d, cb)),
                       max_connections=1000)
ballast = []
while True:
    try:
        ballast.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
print("full", flush=True)
def run(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in sel.select(0.05):
            key.data()
        for due, cb in [t for t in timers if t[0] <= time.monotonic()]:
            timers.remove((due, cb))
            cb()
sys.stdin.readline()  # the clients connected
run(1.5)
print("calls", calls[0], flush=True)
for fd in ballast:
    os.close(fd)
sys.stdin.readline()  # a client with a request connected
run(1.5)
print("posted", [r.command for r in posted], flush=True)
"""


def test_out_of_descriptors_is_one_line_no_spinning_and_service_resumes(loop):
    """accept fails with EMFILE (the process's descriptors all taken by something else): one warning,
    the waiting client is refused (connection closed, not a hang), the socket is left alone between
    tries (a handful of callbacks, not thousands), and once descriptors are free a request is served."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", OUT_OF_FDS, loop.path, repo], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "full\n"
        waiting = [loop.connect(b'{"command": "status"}\n') for _ in range(3)]
        proc.stdin.write("\n")
        proc.stdin.flush()
        calls = int(proc.stdout.readline().split()[1])
        assert calls < 20, calls  # before: one callback per loop turn, ~60000 a second
        assert closed_by_server(waiting[0])
        loop.connect(b'{"command": "exit"}\n')
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert "'exit'" in proc.stdout.readline()
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert err.count("out of file descriptors (Too many open files)") == 1, err
    assert "Traceback" not in err
