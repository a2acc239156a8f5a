"""Unit tests for ``launcher.control.client.request``: the client end of the control socket.

Real unix sockets in a short private dir under /tmp (``tmp_path`` can exceed the 108-byte limit).
The error paths run against a hand-written one-connection server in a thread, so each misbehaviour
(silence, garbage, reset, a missing or dead socket) is produced directly; one round trip runs against
the real ``ControlServer``, its ``selectors`` loop stepped from the test thread while the client runs
in a thread. Every thread is joined with a timeout; nothing waits on a sleep.
"""

import json
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time

import pytest

from launcher.control.server import ControlServer
from launcher.control.client import NoSupervisor, request
from launcher.common.errors import LauncherError


class FakeServer:
    """Accepts one connection in a thread, reads the request line, then runs ``script(conn)``."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.sock.settimeout(5)
        self.request = None
        self.release = threading.Event()  # ends a script that holds the connection open
        self.error = None
        self.thread = None

    def serve(self, script, read_request=True):
        def run():
            try:
                conn, _ = self.sock.accept()
                with conn:
                    conn.settimeout(5)
                    if read_request:
                        data = b""
                        while not data.endswith(b"\n"):
                            data += conn.recv(4096)
                        self.request = json.loads(data)
                    script(conn)
            except Exception as exc:  # surfaced by close()
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        if self.thread is not None:
            self.thread.join(5)
            assert not self.thread.is_alive(), "the fake server did not finish"
        self.sock.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def run_dir():
    path = tempfile.mkdtemp(prefix="ctl-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake(run_dir):
    srv = FakeServer(os.path.join(run_dir, "control.sock"))
    yield srv
    srv.close()


def test_every_answer_is_yielded_until_the_server_closes(fake):
    fake.serve(lambda conn: conn.sendall(b'{"ok": true, "accepted": true}\n{"ok": true, "done": true}\n'))
    got = list(request(fake.path, "exit", {"no_wait": False}, timeout=5))
    assert got == [{"ok": True, "accepted": True}, {"ok": True, "done": True}]
    assert fake.request == {"command": "exit", "args": {"no_wait": False}}


def test_without_args_an_empty_dict_is_sent_and_a_silent_close_yields_nothing(fake):
    fake.serve(lambda conn: None)
    assert list(request(fake.path, "gasp")) == []
    assert fake.request == {"command": "gasp", "args": {}}


def test_a_last_answer_without_newline_is_still_read(fake):
    fake.serve(lambda conn: conn.sendall(b'{"ok": true}'))
    assert list(request(fake.path, "status", timeout=5)) == [{"ok": True}]


def test_a_missing_socket_means_no_supervisor(run_dir):
    path = os.path.join(run_dir, "control.sock")
    with pytest.raises(NoSupervisor) as info:
        next(request(path, "gasp", timeout=5))
    assert isinstance(info.value, LauncherError) and info.value.exit_code == 1
    assert path in info.value.message


def test_a_stale_socket_file_means_no_supervisor(run_dir):
    path = os.path.join(run_dir, "control.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: ECONNREFUSED
    with pytest.raises(NoSupervisor, match="no launcher is listening"):
        next(request(path, "gasp", timeout=5))


def test_silence_past_the_timeout_is_an_error_naming_the_command(fake):
    def one_answer_then_silence(conn):
        conn.sendall(b'{"ok": true, "progress": 1}\n')
        fake.release.wait(5)

    fake.serve(one_answer_then_silence)
    got = []
    started = time.monotonic()
    with pytest.raises(LauncherError) as info:
        for answer in request(fake.path, "gasp", timeout=1.0):
            got.append(answer)
    assert not isinstance(info.value, NoSupervisor)
    assert "did not answer 'gasp' within 1" in info.value.message
    assert got == [{"ok": True, "progress": 1}]  # the timeout is per answer, earlier ones still arrive
    assert 0.9 < time.monotonic() - started < 4


def test_a_malformed_answer_is_an_error(fake):
    fake.serve(lambda conn: conn.sendall(b'{"ok": true}\nnot json\n{"ok": true}\n'))
    got = []
    with pytest.raises(LauncherError, match="malformed answer from the launcher"):
        for answer in request(fake.path, "status", timeout=5):
            got.append(answer)
    assert got == [{"ok": True}]


def test_a_round_trip_through_the_control_server(run_dir):
    selector, posted = selectors.DefaultSelector(), []

    def remove_reader(fd):
        try:
            selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    srv = ControlServer(os.path.join(run_dir, "control.sock"),
                        lambda fd, cb: selector.register(fd, selectors.EVENT_READ, cb), remove_reader, posted.append)
    outcome = {}

    def client():
        try:
            outcome["answers"] = list(request(srv.path, "exit", {"no_wait": True}, timeout=5))
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=client, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 5
        while not posted and thread.is_alive() and time.monotonic() < deadline:
            for key, _ in selector.select(0.1):
                key.data()
        assert posted, outcome
        assert (posted[0].command, posted[0].args) == ("exit", {"no_wait": True})
        posted[0].reply({"ok": True, "accepted": True})
        posted[0].reply({"ok": True, "done": True}, final=True)
        thread.join(5)
        assert not thread.is_alive()
    finally:
        srv.close()
        thread.join(5)
        selector.close()
    assert outcome == {"answers": [{"ok": True, "accepted": True}, {"ok": True, "done": True}]}
def test_a_reset_connection_is_a_launcher_error(fake):
    # Close once the request has arrived but unread: the kernel resets the client's end.
    fake.serve(lambda conn: conn.recv(1, socket.MSG_PEEK), read_request=False)
    with pytest.raises(LauncherError):
        list(request(fake.path, "gasp", timeout=5))
def client_thread(path, command, **kwargs):
    """``request(path, command, **kwargs)`` in a started thread; the dict gets its answers or error."""
    outcome = {}

    def client():
        try:
            outcome["answers"] = list(request(path, command, **kwargs))
        except LauncherError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    return thread, outcome


def test_the_timeout_covers_a_supervisor_that_does_not_accept(run_dir):
    path = os.path.join(run_dir, "control.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    fillers = []
    for _ in range(64):  # fill the backlog: a non-blocking connect says EAGAIN once it is full
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        fillers.append(filler)
        try:
            filler.connect(path)
        except BlockingIOError:
            break
    thread, _outcome = client_thread(path, "status", timeout=0.3)
    thread.join(2)
    blocked = thread.is_alive()
    listener.close()  # wakes a blocked connect with ECONNREFUSED
    for filler in fillers:
        filler.close()
    thread.join(5)
    assert not thread.is_alive()
    assert not blocked, "request() was still connecting 2 s after a 0.3 s timeout"


def test_a_stopped_supervisor_is_no_supervisor_within_the_first_answer_deadline(run_dir):
    """Issue #17.5: a SIGSTOPped launcher's socket accepts into its backlog and never answers."""
    path = os.path.join(run_dir, "control.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(4)  # never accepts, never reads: what a stopped process does
        thread, outcome = client_thread(path, "gasp", first_timeout=0.3)
        thread.join(5)
        assert not thread.is_alive(), "request() still waiting 5 s after a 0.3 s first-answer deadline"
    assert isinstance(outcome.get("error"), NoSupervisor)
    assert "did not answer 'gasp' within 0.3 s" in outcome["error"].message


def test_later_answers_wait_past_the_first_answer_deadline(fake):
    def ack_then_slow_report(conn):
        conn.sendall(b'{"ok": true, "accepted": true}\n')
        fake.release.wait(0.6)  # a gasp takes as long as the ranks need to save
        conn.sendall(b'{"ok": true, "done": true}\n')

    fake.serve(ack_then_slow_report)
    assert list(request(fake.path, "gasp", first_timeout=0.3, timeout=5)) == [
        {"ok": True, "accepted": True}, {"ok": True, "done": True}]
