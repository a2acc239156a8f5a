"""The hang detector's wiring, with a fake host and clock (no processes): slots written by hand."""

import struct
import time
from types import SimpleNamespace

import pytest

from launcher.jobspec.runspec import HangRules
from launcher.monitoring.heartbeats import SLOT_FORMAT
from launcher.run.hangwatch import HangWatch
from launcher.supervision.loopevents import RankHung


class FakeGroup:
    def __init__(self, tmp):
        self.timers, self.posted, self.log_paths = [], [], {r: str(tmp / f"rank_{r}.log") for r in range(3)}

    def call_later(self, delay, callback):
        self.timers.append(callback)
        return len(self.timers)

    def cancel(self, handle):
        pass

    def pids(self):
        return {0: 100, 1: 101, 2: 102}

    def post(self, event):
        self.posted.append(event)


class FakeHost:
    def __init__(self, tmp, **rules):
        self.spec = SimpleNamespace(hangs=HangRules(**rules))
        self.ctx = SimpleNamespace(run_dir=str(tmp))
        self.group = FakeGroup(tmp)
        self.events = []

    def emit(self, event, **fields):
        self.events.append((event, fields))


def write_slot(tmp, rank, at, step):
    (tmp / "heartbeats" / f"rank_{rank}").write_bytes(struct.pack(SLOT_FORMAT, 0, 0, at, step, 0.0, b""))


@pytest.fixture
def watch(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_PY_SPY", "")  # no py-spy, no faulthandler flag: stacks unread, at once
    clock = SimpleNamespace(now=100.0)
    host = FakeHost(tmp_path, steady=5.0)
    hw = HangWatch(clock=lambda: clock.now)
    hw.start(host)
    hw.on_event("attempt_start", {"attempt": 0})
    for rank in range(3):
        hw.on_event("rank_spawned", {"rank": rank})
    return hw, host, clock, tmp_path


def tick(hw, host):
    host.group.timers.pop(0)()


def test_off_by_default_starts_nothing(tmp_path):
    host = FakeHost(tmp_path)
    HangWatch().start(host)
    assert host.group.timers == [] and not (tmp_path / "heartbeats").exists()


def test_silent_rank_is_reported_then_handed_to_the_supervisor(watch):
    hw, host, clock, tmp = watch
    clock.now = 101.0
    for rank in range(3):
        write_slot(tmp, rank, 101.0, 4)
    tick(hw, host)
    assert host.group.posted == []
    clock.now = 106.5
    write_slot(tmp, 0, 106.0, 9)
    write_slot(tmp, 2, 106.0, 9)
    tick(hw, host)
    events = [(e, f) for e, f in host.events if not e.startswith("step_")]  # steps: their own test
    assert [e for e, _ in events] == ["hang_detected", "stacks_dumped"]
    assert events[0][1]["rank"] == 1 and events[0][1]["step"] == 4
    [hung] = host.group.posted
    assert isinstance(hung, RankHung) and hung.rank == 1 and "no stacks could be read" in hung.diagnosis[0]
    tick(hw, host)  # one report per hung rank
    assert len(host.group.posted) == 1


def test_a_rank_that_exited_is_never_hung_and_a_later_hang_of_another_is_still_found(watch):
    hw, host, clock, tmp = watch
    hw.on_event("rank_exited", {"rank": 1, "state": "succeeded"})  # exited 0 at once, no beat, no output
    hw.on_event("stop_group", {"ranks": [2]})  # being stopped by the launcher: its own deadline
    write_slot(tmp, 0, 104.0, 3)
    clock.now = 106.0
    tick(hw, host)
    assert host.group.posted == []  # rank 1 silent for 6 s but gone; rank 2 stopping; rank 0 beat 2 s ago
    clock.now = 109.5
    tick(hw, host)
    [hung] = host.group.posted
    assert hung.rank == 0
    assert [f["hung_ranks"] for e, f in host.events if e == "hang_detected"] == [[0]]


def test_every_hang_of_an_attempt_is_reported_once_per_spawn(watch):
    hw, host, clock, tmp = watch
    for rank in range(3):
        write_slot(tmp, rank, 101.0, 1)
    write_slot(tmp, 2, 104.0, 2)
    clock.now = 106.5
    tick(hw, host)  # ranks 0 and 1 silent since 101: the lowest is handed over first
    assert [e.rank for e in host.group.posted] == [0]
    tick(hw, host)  # rank 0 was reported (recover-in-place keeps the attempt running): now rank 1
    assert [e.rank for e in host.group.posted] == [0, 1]
    hw.on_event("rank_spawned", {"rank": 0})  # respawned in place at 106.5: watched afresh
    write_slot(tmp, 2, 111.0, 3)
    clock.now = 111.0
    tick(hw, host)
    assert len(host.group.posted) == 2  # the new rank 0 is 4.5 s old
    clock.now = 112.0
    tick(hw, host)
    assert [e.rank for e in host.group.posted] == [0, 1, 0]


def test_highest_step_of_an_attempt_is_kept_for_the_no_progress_policy(watch):
    hw, host, clock, tmp = watch
    write_slot(tmp, 0, 101.0, 7)
    write_slot(tmp, 1, 101.0, 12)
    hw.on_event("attempt_end", {"attempt": 0, "failed": True})
    assert hw.progress(0) == 12 and hw.progress(1) is None


def test_output_counts_as_progress(watch):
    hw, host, clock, tmp = watch
    clock.now = 104.0
    for rank in range(3):
        (tmp / f"rank_{rank}.log").write_text("step 1\n")
    tick(hw, host)
    clock.now = 108.0
    tick(hw, host)
    assert host.events == []  # 4 s since the output, under the 5 s timeout


def test_status_names_stragglers_only_when_watched(tmp_path):
    hw = HangWatch()
    hw.start(FakeHost(tmp_path, straggler=0.2))
    hw.named.add(2)
    assert hw.status() == {"stragglers": [2]}
    assert HangWatch().status() == {}


def test_steps_are_recorded_for_the_goodput(watch):
    """step_first once per attempt, step_last at its end (the highest slot step), step_regained once the
    next attempt is back at that step; ``at`` is the beat's own time on the wall clock."""
    hw, host, clock, tmp = watch
    clock.now = 101.0
    write_slot(tmp, 0, 100.5, 3)
    tick(hw, host)
    write_slot(tmp, 1, 101.0, 4)
    tick(hw, host)
    first = [f for e, f in host.events if e == "step_first"]
    assert [(f["attempt"], f["step"]) for f in first] == [(0, 3)]
    assert abs(first[0]["at"] - (time.time() - 0.5)) < 5
    write_slot(tmp, 2, 101.0, 7)
    hw.on_event("attempt_end", {"attempt": 0, "failed": True})
    assert [f for e, f in host.events if e == "step_last"] == [{"attempt": 0, "step": 7,
                                                                 "ranks": {"0": 3, "1": 4, "2": 7}}]
    hw.on_event("attempt_start", {"attempt": 1})  # removes attempt 0's slots
    for rank in range(3):
        hw.on_event("rank_spawned", {"rank": rank})
    write_slot(tmp, 0, 101.0, 5)
    tick(hw, host)
    assert not [e for e, _ in host.events if e == "step_regained"]
    write_slot(tmp, 0, 101.0, 7)
    tick(hw, host)
    tick(hw, host)
    regained = [f for e, f in host.events if e == "step_regained"]
    assert [(f["attempt"], f["step"]) for f in regained] == [(1, 7)]
    assert [f["attempt"] for e, f in host.events if e == "step_first"] == [0, 1]


def test_no_steps_no_step_events(watch):
    hw, host, clock, tmp = watch
    write_slot(tmp, 0, 100.5, -1)  # beats without a step
    tick(hw, host)
    hw.on_event("attempt_end", {"attempt": 0, "failed": True})
    assert not [e for e, _ in host.events if e.startswith("step_")]
