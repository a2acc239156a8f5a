"""The event loop without ranks: timers, readers, posted events, reaped children."""

import os
import subprocess
import sys
import time

import pytest

from launcher.supervision.eventloop import EventLoop
from launcher.supervision.loopevents import ControlRequest


class Recording(EventLoop):
    """Records what the base loop hands to ``_child_exited`` (a process group turns it into RankExited)."""

    def __init__(self):
        super().__init__()
        self.exited = []

    def _child_exited(self, pid, info):
        self.exited.append((pid, info.returncode))


@pytest.fixture
def loop():
    evl = Recording()
    yield evl
    evl._selector.close()


def test_timers_fire_in_order_and_cancel(loop):
    fired = []
    loop.call_later(0.05, lambda: fired.append("b"))
    loop.call_later(0.01, lambda: fired.append("a"))
    handle = loop.call_later(0.02, lambda: fired.append("cancelled"))
    loop.cancel(handle)
    started = time.monotonic()
    assert loop.wait_event(0.2) is None  # timers run inside the wait, no event is produced
    assert fired == ["a", "b"]
    assert time.monotonic() - started >= 0.19


def test_a_reader_posts_an_event_that_wait_event_returns(loop):
    read_fd, write_fd = os.pipe()
    try:
        def on_readable():
            loop.post(ControlRequest(os.read(read_fd, 100).decode(), {}, lambda *a, **k: None))
            loop.remove_reader(read_fd)

        loop.add_reader(read_fd, on_readable)
        os.write(write_fd, b"status")
        event = loop.wait_event(5)
        assert isinstance(event, ControlRequest) and event.command == "status"
        assert loop.wait_event(0.01) is None  # removed: an unread pipe would wake it again
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_reaped_child_goes_to_its_watcher_and_to_child_exited(loop):
    watched = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    seen = []
    loop.watch_pid(watched.pid, seen.append)
    deadline = time.monotonic() + 10
    while len(loop.exited) < 2 and time.monotonic() < deadline:
        loop.wait_event(0.05)
    assert [info.returncode for info in seen] == [5]
    assert sorted(loop.exited) == sorted([(watched.pid, 5), (other.pid, 7)])
    watched.returncode, other.returncode = 5, 7  # reaped by the loop, not by Popen


def test_an_unwatched_pid_has_no_callback(loop):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    seen = []
    loop.watch_pid(proc.pid, seen.append)
    loop.unwatch_pid(proc.pid)
    deadline = time.monotonic() + 10
    while not loop.exited and time.monotonic() < deadline:
        loop.wait_event(0.05)
    assert seen == [] and loop.exited == [(proc.pid, 0)]
    proc.returncode = 0


def test_another_thread_hands_the_loop_a_callback_and_wakes_it(loop):
    import threading

    ran = []
    loop.call_later(5.0, lambda: ran.append("timer"))  # the loop would sleep until then
    handed = lambda: ran.append((threading.current_thread(), time.monotonic()))  # noqa: E731
    threading.Timer(0.1, loop.call_soon_threadsafe, args=(handed,)).start()
    start = time.monotonic()
    loop.wait_event(2.0)
    [(thread, when)] = ran
    assert thread is threading.main_thread() and when - start < 1.0  # on the loop's thread, at once
