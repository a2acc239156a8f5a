"""PathWatcher on the real event loop: ConfigMap symlink swaps, in-place writes, delete and re-create,
a directory that appears late, the poll fallback, overflow and re-arm, and the absence of busy polling.
"""

import os
import shutil
import struct
import time

import pytest

from launcher.common import filewatch
from launcher.common.filewatch import IN_IGNORED, IN_Q_OVERFLOW, PathWatcher
from launcher.supervision.procgroup import LocalProcessGroup
from tests.helpers.configmap import ConfigMapDir

FAST = 0.02  # poll_interval of the tests: a missing directory is retried, or the fallback polls, this often


@pytest.fixture
def loop():
    group = LocalProcessGroup(lambda spec, attempt: "/dev/null", lambda spec: False)
    yield group
    group.close()


def spin(loop, predicate, timeout=3.0):
    """Run the event loop until ``predicate()`` or ``timeout``; returns ``predicate()``."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        loop.wait_event(0.01)
    return predicate()


def read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


class Recorder:
    """A PathWatcher plus the content seen at the path each time ``on_change`` ran."""

    def __init__(self, loop, path, **kwargs):
        self.path = str(path)
        self.seen = []
        kwargs.setdefault("poll_interval", FAST)
        kwargs.setdefault("debounce", 0.01)
        self.watcher = PathWatcher(self.path, lambda: self.seen.append(read(self.path)), loop.add_reader,
                                   loop.remove_reader, loop.call_later, loop.cancel, **kwargs)

    def saw(self, content):
        return lambda: bool(self.seen) and self.seen[-1] == content


@pytest.fixture
def watch(loop):
    made = []

    def make(path, **kwargs):
        made.append(Recorder(loop, path, **kwargs))
        return made[-1]

    yield make
    for recorder in made:
        recorder.watcher.close()


def no_inotify():
    raise OSError("inotify disabled by the test")


@pytest.fixture(params=["inotify", "poll"])
def mode(request, monkeypatch):
    """Every detection test runs with inotify and with the stat() poll fallback."""
    if request.param == "poll":
        monkeypatch.setattr(filewatch, "_load_inotify", no_inotify)
    return request.param


def test_configmap_symlink_swaps_in_a_row(loop, watch, mode, tmp_path):
    cm = ConfigMapDir(tmp_path / "config", {"reset.json": "v0", "restartType": "hotReset"})
    rec = watch(cm.path("reset.json"))
    assert rec.watcher.mode == mode
    for i in range(1, 5):
        cm.write("reset.json", "v" + "x" * i)
        assert spin(loop, rec.saw("v" + "x" * i)), rec.seen
    assert len(os.listdir(cm.root)) == 4  # ..data, one timestamped dir, two user-visible symlinks


def test_in_place_writes(loop, watch, mode, tmp_path):
    cm = ConfigMapDir(tmp_path)
    cm.write_in_place("reset.json", "first")
    rec = watch(cm.path("reset.json"))
    for content in ("second!", "3", "fourth content"):
        cm.write_in_place("reset.json", content)
        assert spin(loop, rec.saw(content)), rec.seen


def test_delete_then_create(loop, watch, mode, tmp_path):
    cm = ConfigMapDir(tmp_path)
    cm.write_in_place("reset.json", "old")
    rec = watch(cm.path("reset.json"))
    os.unlink(cm.path("reset.json"))
    assert spin(loop, rec.saw(None)), rec.seen
    cm.write_in_place("reset.json", "recreated")
    assert spin(loop, rec.saw("recreated")), rec.seen


def test_directory_created_later(loop, watch, mode, tmp_path):
    root = tmp_path / "not" / "yet"
    rec = watch(root / "reset.json")
    loop.wait_event(3 * FAST)
    assert rec.seen == []
    ConfigMapDir(root, {"reset.json": "late"})
    assert spin(loop, rec.saw("late")), rec.seen


def test_directory_deleted_and_recreated(loop, watch, mode, tmp_path):
    root = tmp_path / "config"
    ConfigMapDir(root, {"reset.json": "one"})
    rec = watch(root / "reset.json")
    shutil.rmtree(root)
    assert spin(loop, rec.saw(None)), rec.seen
    cm = ConfigMapDir(root, {"reset.json": "two"})
    assert spin(loop, rec.saw("two")), rec.seen
    cm.write("reset.json", "three")
    assert spin(loop, rec.saw("three")), rec.seen


def test_a_burst_is_debounced(loop, watch, tmp_path):
    cm = ConfigMapDir(tmp_path, {"reset.json": "0"})
    rec = watch(cm.path("reset.json"), debounce=0.05)
    for i in range(20):
        cm.write("reset.json", str(i))
    assert spin(loop, rec.saw("19"))
    loop.wait_event(0.1)
    assert len(rec.seen) <= 2


def test_safety_net_poll_sees_what_inotify_cannot(loop, watch, tmp_path):
    """The path is a symlink into another directory: in-place writes there raise no event here."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "config").mkdir()
    target = tmp_path / "elsewhere" / "reset.json"
    target.write_text("a")
    os.symlink(target, tmp_path / "config" / "reset.json")
    rec = watch(tmp_path / "config" / "reset.json", safety_interval=0.05)
    assert rec.watcher.mode == "inotify"
    target.write_text("bb")
    assert spin(loop, rec.saw("bb")), rec.seen


def test_no_busy_polling_with_inotify(loop, watch, monkeypatch, tmp_path):
    cm = ConfigMapDir(tmp_path, {"reset.json": "x"})
    calls = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):
        if os.fspath(path) == cm.path("reset.json"):
            calls.append(time.monotonic())
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    rec = watch(cm.path("reset.json"))  # safety net at the default 10 s
    assert rec.watcher.mode == "inotify"
    cpu, started = time.process_time(), time.monotonic()
    while time.monotonic() - started < 1.0:
        loop.wait_event(1.0)
    assert len(calls) == 1  # the initial signature only: no poll within the 10 s safety interval
    assert time.process_time() - cpu < 0.2
    assert rec.seen == []


def test_poll_fallback_polls_at_its_interval_only(loop, watch, monkeypatch, tmp_path):
    monkeypatch.setattr(filewatch, "_load_inotify", no_inotify)
    cm = ConfigMapDir(tmp_path, {"reset.json": "x"})
    calls = []
    real_signature = filewatch.signature
    monkeypatch.setattr(filewatch, "signature", lambda path: calls.append(path) or real_signature(path))
    rec = watch(cm.path("reset.json"), poll_interval=0.05)
    loop.wait_event(0.3)
    assert rec.watcher.mode == "poll"
    assert 3 <= len(calls) <= 8  # the initial signature, then one per 0.05 s
    assert rec.seen == []


class FakeInotify:
    """An inotify whose queue is a pipe the test writes raw events into."""

    def __init__(self, add_error=None):
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.add_error = add_error
        self.watches = []

    def init(self):
        return self.read_fd

    def add_watch(self, fd, path, mask):
        if self.add_error is not None:
            raise OSError(self.add_error, os.strerror(self.add_error), path)
        self.watches.append(path)
        return 7

    def rm_watch(self, fd, wd):
        pass

    def send(self, wd, mask, name=b""):
        os.write(self.write_fd, struct.pack("iIII", wd, mask, 0, len(name)) + name)


@pytest.fixture
def fake_inotify(monkeypatch):
    made = []

    def install(**kwargs):
        made.append(FakeInotify(**kwargs))
        monkeypatch.setattr(filewatch, "_load_inotify", lambda: made[-1])
        return made[-1]

    yield install
    for fake in made:
        os.close(fake.write_fd)


def test_overflow_counts_as_a_change(loop, watch, fake_inotify, tmp_path):
    fake = fake_inotify()
    rec = watch(tmp_path / "reset.json")
    fake.send(-1, IN_Q_OVERFLOW)
    assert spin(loop, lambda: rec.seen == [None])


def test_lost_watch_is_set_again(loop, watch, fake_inotify, tmp_path):
    fake = fake_inotify()
    rec = watch(tmp_path / "reset.json")
    fake.send(7, IN_IGNORED)
    assert spin(loop, lambda: len(rec.seen) == 1)
    assert fake.watches == [str(tmp_path)] * 2
    fake.send(99, 0x100, b"other-watch\0\0\0\0\0")  # an event of a stale watch descriptor: ignored
    loop.wait_event(0.1)
    assert len(rec.seen) == 1


def test_watch_limit_falls_back_to_polling(loop, watch, fake_inotify, tmp_path):
    fake_inotify(add_error=28)  # ENOSPC: out of inotify watches
    cm = ConfigMapDir(tmp_path, {"reset.json": "a"})
    rec = watch(cm.path("reset.json"))
    assert rec.watcher.mode == "poll"
    cm.write("reset.json", "b")
    assert spin(loop, rec.saw("b")), rec.seen


def test_close_releases_the_descriptor_and_timers(loop, watch, tmp_path):
    cm = ConfigMapDir(tmp_path, {"reset.json": "a"})
    rec = watch(cm.path("reset.json"), safety_interval=0.05)
    fd = rec.watcher._fd  # pylint: disable=protected-access
    cm.write("reset.json", "b")
    rec.watcher.close()
    rec.watcher.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    loop.wait_event(0.1)
    assert rec.seen == []


def test_shared_file_systems_are_detected_from_the_mount_table():
    assert filewatch.shared_file_system("/proc/self")  # proc: not a type known to see every write locally
