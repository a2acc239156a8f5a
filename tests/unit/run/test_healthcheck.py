"""The free-space look at ``--checkpoint-dir`` before an attempt (``launcher.run.healthcheck``): made
beside the attempt before it, so that a restart does not wait for a stat of every rank directory."""

import shutil
import threading
from collections import namedtuple

import pytest

from launcher.run import healthcheck
from launcher.run.healthcheck import SpaceCheck, node_health

Usage = namedtuple("Usage", "total used free")


@pytest.fixture(name="free")
def _free(monkeypatch):
    """The checkpoint file system's free bytes, as the test sets them."""
    space = {"free": 100}
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(1 << 40, 0, space["free"]))
    return space


def _save(root, name, size):
    (root / name).mkdir()
    (root / name / "ckpt-1_100.pt").write_bytes(b"x" * size)


def test_without_a_look_started_take_looks_now(tmp_path, free):
    _save(tmp_path, "rank_0", 500)
    assert SpaceCheck(str(tmp_path)).take() == (100, 500, str(tmp_path / "rank_0"))
    free["free"] = 1000
    assert SpaceCheck(str(tmp_path)).take() is None


def test_a_look_started_beside_the_attempt_is_what_the_next_attempt_gets(tmp_path, free, monkeypatch):
    _save(tmp_path, "rank_0", 500)
    check = SpaceCheck(str(tmp_path))
    looking, release = threading.Event(), threading.Event()
    real = healthcheck.checkpoint_space

    def slow(directory):
        looking.set()
        release.wait(10)
        return real(directory)

    monkeypatch.setattr(healthcheck, "checkpoint_space", slow)
    check.start()
    assert looking.wait(10)
    check.start()  # a look in progress is not started twice
    assert check.take() is None  # a restart does not wait for a look still running
    release.set()
    check._thread.join()  # pylint: disable=protected-access
    monkeypatch.setattr(healthcheck, "checkpoint_space", real)
    free["free"] = 1000  # after the look: its finding stands
    assert check.take() == (100, 500, str(tmp_path / "rank_0"))  # the finding goes to the attempt after
    assert check.take() is None  # taken once
    free["free"] = 100
    check.start()
    check._thread.join()  # pylint: disable=protected-access
    assert check.take() == (100, 500, str(tmp_path / "rank_0"))


def test_node_health_warns_with_the_finding_of_its_space_check(tmp_path, free, caplog):
    _save(tmp_path, "rank_3", 500)
    events = []
    check = SpaceCheck(str(tmp_path))
    check.start()
    check._thread.join()  # pylint: disable=protected-access
    with caplog.at_level("WARNING"):
        assert node_health(None, str(tmp_path), [0], lambda name, **fields: events.append((name, fields)), check) is None
    assert events == [("checkpoint_space_low", {"free_bytes": 100, "last_save_bytes": 500,
                                                "last_save": str(tmp_path / "rank_3")})]
    assert "the next save may not fit" in caplog.text
