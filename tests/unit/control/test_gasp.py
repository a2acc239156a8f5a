"""Unit tests for ``launcher.control.gasp``: the crash-loop gate, the gasp timeout, the graceful-exit file,
and the supervisor-less gasp (pid + create-time verification, signal, wait, SIGKILL).

The gate runs on a fake clock against a state file in ``tmp_path``; a hypothesis model checks it over
arbitrary gasp sequences. Process tests start tiny real ranks (``sys.executable -c``) in their own
session, as the launcher does, wait for a ready file each writes once its signal handler is in place,
and reap them in the fixture's teardown.
"""

import json
import os
import signal
import subprocess
import tempfile
import time

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.control import gasp
from launcher.control.gasp import GaspGate, RecordedRank, fallback_gasp, verified_ranks
from tests.helpers.procs import RankSpawner, wait_until


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spawn(tmp_path):
    """``spawn(mode, *extra)`` starts a rank in its own session and returns its Popen once it is ready."""
    ranks = RankSpawner(tmp_path)
    yield ranks.start
    ranks.close()


def gone(pid: int) -> bool:
    """The process exited (a zombie awaiting its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def record(proc, rank=0, offset=0.0):
    return RecordedRank(rank, proc.pid, psutil.Process(proc.pid).create_time() + offset)


# -- the crash-loop gate -----------------------------------------------------------------------------

def test_gate_allows_the_first_gasp_and_records_it(tmp_path):
    path = tmp_path / "gasp.json"
    gate = GaspGate(str(path), 60, Clock(1000.0))
    assert gate.last() is None and gate.allowed()
    assert gate.try_save() is True
    assert json.loads(path.read_text()) == {"last_save": 1000.0}
    assert gate.last() == 1000.0
    assert not (tmp_path / "gasp.json.tmp").exists()


def test_gate_refuses_within_min_interval_then_allows(tmp_path):
    clock = Clock(1000.0)
    gate = GaspGate(str(tmp_path / "gasp.json"), 60, clock)
    assert gate.try_save()
    clock.now = 1059.9
    assert not gate.allowed() and gate.try_save() is False
    assert gate.last() == 1000.0  # a refused gasp does not restart the interval
    clock.now = 1060.0  # exactly min_interval later: allowed again
    assert gate.try_save() is True
    assert gate.last() == 1060.0


@pytest.mark.parametrize("interval", [0, -1])
def test_gate_non_positive_interval_disables_the_rule(tmp_path, interval):
    gate = GaspGate(str(tmp_path / "gasp.json"), interval, Clock(1000.0))
    assert [gate.try_save() for _ in range(3)] == [True, True, True]


def test_gate_state_survives_a_new_gate_on_the_same_file(tmp_path):
    path = str(tmp_path / "gasp.json")
    clock = Clock(1000.0)
    assert GaspGate(path, 60, clock).try_save()
    clock.now = 1030.0  # the restarted launcher, 30 s later
    again = GaspGate(path, 60, clock)
    assert again.last() == 1000.0 and again.try_save() is False
    assert GaspGate(str(tmp_path / "other.json"), 60, clock).allowed()  # the state is per file


@pytest.mark.parametrize("content", ["", "not json", "[]", "null", "{}", '{"last_save": null}',
                                     '{"last_save": "yesterday"}', '{"other": 1}', '{"last_save": NaN}',
                                     '{"last_save": Infinity}'])
def test_gate_treats_a_corrupt_state_file_as_no_previous_gasp(tmp_path, content):
    path = tmp_path / "gasp.json"
    path.write_text(content)
    gate = GaspGate(str(path), 60, Clock(1000.0))
    assert gate.last() is None and gate.allowed()
    assert gate.try_save() is True
    assert json.loads(path.read_text()) == {"last_save": 1000.0}  # replaced by a valid file


def test_gate_allows_a_save_when_the_clock_went_back(tmp_path):
    """A last save "in the future" (the clock was stepped back) must not block saves until it catches up."""
    clock = Clock(1000.0)
    gate = GaspGate(str(tmp_path / "gasp.json"), 60, clock)
    assert gate.try_save()
    clock.now = 400.0
    assert gate.try_save() is True
    clock.now = 430.0
    assert gate.try_save() is False  # the rule holds again from the new save


@pytest.mark.parametrize("state, expected", [
    ({"ranks": [{"rank": 1, "pid": 42, "create_time": 5.5}, {"rank": 2, "pid": 43}]},
     [RecordedRank(1, 42, 5.5), RecordedRank(2, 43, None)]),
    ({"ranks": [{"pid": 1}, {"rank": 0}, 1, None, "x", {"rank": "a", "pid": 3}, {"rank": 0, "pid": 2,
                                                                            "create_time": "t"}]}, []),
    ({"ranks": [{"rank": 0, "pid": 0, "create_time": 1.0}, {"rank": 1, "pid": -5, "create_time": 1.0}]}, []),
    ({"ranks": None}, []), ({"ranks": {"rank": 0}}, []), ([1], []), (None, []), ({}, []),
])
def test_recorded_ranks_skips_what_a_damaged_state_file_holds(state, expected):
    assert gasp.recorded_ranks(state) == expected


@settings(max_examples=50, deadline=None)
@given(interval=st.floats(0, 100), steps=st.lists(st.floats(0, 200), max_size=8))
def test_gate_matches_a_model_over_any_gasp_sequence(interval, steps):
    with tempfile.TemporaryDirectory() as tmp:
        clock = Clock(1000.0)
        gate = GaspGate(os.path.join(tmp, "gasp.json"), interval, clock)
        last = None
        for step in steps:
            clock.now += step
            expected = interval == 0 or last is None or clock.now - last >= interval
            assert gate.try_save() is expected
            if expected:
                last = clock.now


# -- the graceful-exit file --------------------------------------------------------------------------

def test_write_graceful_exit_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "graceful_exit.json"
    gasp.write_graceful_exit(str(path), 1)
    assert json.loads(path.read_text()) == {"GracefulExit": 1}
    gasp.write_graceful_exit(str(path), 0)
    assert json.loads(path.read_text()) == {"GracefulExit": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graceful_exit.json"]  # no temp file left


# -- verified_ranks and fallback_gasp ----------------------------------------------------------------

def test_verified_ranks_keeps_only_the_very_processes_recorded(spawn):
    ours, other = spawn("exit"), spawn("exit")
    records = [record(ours, 0), record(other, 1, offset=-100.0),  # pid reuse: another create time
               record(other, 2, offset=0.05), RecordedRank(3, ours.pid, None)]
    verified = verified_ranks(records)
    assert [(rec.rank, proc.pid) for rec, proc in verified] == [(0, ours.pid)]


def test_verified_ranks_rejects_a_dead_pid(spawn):
    proc = spawn("exit")
    rec = record(proc)
    assert len(verified_ranks([rec])) == 1
    proc.kill()
    proc.wait(10)
    assert verified_ranks([rec]) == []


def test_fallback_gasp_reports_a_rank_that_exits_on_the_signal(spawn):
    proc = spawn("exit")
    started = time.monotonic()
    outcomes = fallback_gasp([record(proc, 3)], signal.SIGTERM, 30.0)
    assert time.monotonic() - started < 10  # returns when the rank exits, not at the timeout
    assert proc.wait(10) == 7  # its handler ran: it got the gasp signal
    # Not fallback_gasp's child, so it cannot know the exit code.
    assert outcomes == [{"rank": 3, "label": "rank 3", "killed_after_timeout": False,
                         "exit_code": None, "signal": None, "returncode": None}]


def test_fallback_gasp_sends_the_given_signal(spawn):
    proc = spawn("exit", "SIGUSR1")  # SIGTERM would kill it with -15, not exit 7
    outcomes = fallback_gasp([record(proc)], signal.SIGUSR1, 30.0)
    assert proc.wait(10) == 7 and not outcomes[0]["killed_after_timeout"]


def test_fallback_gasp_kills_a_rank_ignoring_the_signal_after_the_timeout(spawn):
    stubborn, quick = spawn("ignore"), spawn("exit")
    started = time.monotonic()
    outcomes = fallback_gasp([record(stubborn, 0), record(quick, 1)], signal.SIGTERM, 0.5)
    assert time.monotonic() - started >= 0.5
    assert stubborn.wait(10) == -signal.SIGKILL and quick.wait(10) == 7
    assert [(o["rank"], o["killed_after_timeout"]) for o in outcomes] == [(0, True), (1, False)]


def test_fallback_gasp_kills_the_whole_group_of_a_rank_ignoring_the_signal(spawn):
    proc = spawn("ignore", "SIGTERM", "child")
    outcomes = fallback_gasp([record(proc)], signal.SIGTERM, 0.2)
    assert outcomes[0]["killed_after_timeout"]
    assert proc.wait(10) == -signal.SIGKILL
    assert wait_until(lambda: gone(proc.child), 5)


def test_fallback_gasp_leaves_nothing_of_a_rank_that_exited(spawn):
    """A rank that saved and exited may leave dataloader children in its group: they are killed too."""
    proc = spawn("exit", "SIGTERM", "child")
    fallback_gasp([record(proc)], signal.SIGTERM, 5.0)
    assert proc.wait(10) == 7
    assert wait_until(lambda: gone(proc.child), 1)


def test_fallback_gasp_never_signals_an_unverified_pid(spawn):
    stranger = spawn("exit")
    assert fallback_gasp([record(stranger, offset=-100.0)], signal.SIGTERM, 0.2) == []
    with pytest.raises(subprocess.TimeoutExpired):  # a signalled rank would exit 7 at once
        stranger.wait(0.3)


def test_wait_exits_returns_the_processes_still_running(spawn):
    proc = spawn("ignore")
    assert gasp.wait_exits([proc.pid], 0.1) == [proc.pid]
    proc.kill()
    assert gasp.wait_exits([proc.pid], 10) == []  # a zombie counts as exited
    proc.wait(10)
    assert gasp.wait_exits([proc.pid], 10) == []  # so does a pid that is gone


def test_full_run_dir_never_refuses_the_save(tmp_path, caplog):
    path = tmp_path / "gasp.json"
    os.symlink("/dev/full", f"{path}.{os.getpid()}.tmp")  # writes fail with ENOSPC, as on a full disk
    gate = gasp.GaspGate(str(path), 60.0, clock=lambda: 1000.0)
    with caplog.at_level("WARNING", logger="launcher.control.gasp"):
        assert gate.try_save() is True
    assert "saving anyway" in caplog.text and "No space left on device" in caplog.text
    assert os.listdir(tmp_path) == []  # no temp file left behind


def test_write_graceful_exit_on_a_full_disk_warns(tmp_path, caplog):
    path = tmp_path / "graceful_exit.json"
    os.symlink("/dev/full", f"{path}.{os.getpid()}.tmp")
    with caplog.at_level("WARNING", logger="launcher.control.gasp"):
        assert gasp.write_graceful_exit(str(path), 1) is False
    assert "No space left on device" in caplog.text and os.listdir(tmp_path) == []
