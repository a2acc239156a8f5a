"""The process-group mechanism on its own: spawning, exit events, timers, watched pids."""

import subprocess
import sys
import time

import pytest

from launcher.supervision.procgroup import LocalProcessGroup, RankExited
from launcher.jobspec.rankenv import WorkerSpec


@pytest.fixture
def group(tmp_path):
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / f"a{attempt}" / f"r{spec.rank}.log"),
                            lambda spec: False)
    yield grp
    grp.ensure_gone(5)
    grp.close()


def spec(rank, code):
    return WorkerSpec(rank, rank, rank, "worker", (sys.executable, "-c", f"import sys; sys.exit({code})"), {})


def test_exit_events_carry_codes_and_pids_are_reaped(group, tmp_path):
    group.start([spec(0, 0), spec(1, 3)], 0)
    events = [group.wait_event(10), group.wait_event(10)]
    assert sorted((e.rank, e.info.returncode) for e in events if isinstance(e, RankExited)) == [(0, 0), (1, 3)]
    assert group.pids() == {}
    assert (tmp_path / "a0" / "r1.log").exists()


def test_timers_fire_in_order_and_cancel(group):
    fired = []
    group.call_later(0.05, lambda: fired.append("b"))
    group.call_later(0.01, lambda: fired.append("a"))
    handle = group.call_later(0.02, lambda: fired.append("cancelled"))
    group.cancel(handle)
    started = time.monotonic()
    assert group.wait_event(0.2) is None  # timers run inside the wait, no event is produced
    assert fired == ["a", "b"]
    assert time.monotonic() - started >= 0.19


def test_watched_child_exit_is_reported(group):
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    seen = []
    group.watch_pid(proc.pid, seen.append)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        group.wait_event(0.05)
    assert seen and seen[0].returncode == 5
    proc.returncode = 5  # reaped by the group's loop, not by Popen


def test_a_log_file_that_cannot_be_created_does_not_stop_the_rank(tmp_path, caplog):
    """The log disk refuses new files (here: a path under a regular file): the rank starts anyway, its
    exit is seen, and the failure is reported once per rank across attempts."""
    (tmp_path / "not-a-dir").write_text("")
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / "not-a-dir" / f"a{attempt}" / f"r{spec.rank}.log"),
                            lambda spec: spec.rank == 0)
    try:
        with caplog.at_level("WARNING", logger="launcher.supervision.procgroup"):
            for attempt in (0, 1):
                grp.start([spec(0, 4), spec(1, 0)], attempt)
                events = [grp.wait_event(10), grp.wait_event(10)]
                assert sorted((e.rank, e.info.returncode) for e in events) == [(0, 4), (1, 0)]
                grp.ensure_gone(5)
    finally:
        grp.ensure_gone(5)
        grp.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("cannot create its log file" in w for w in warnings), warnings
