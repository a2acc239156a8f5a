"""The integrations of a run: started in order, stopped in reverse whatever happened, told every event."""

import logging
from types import SimpleNamespace

import pytest

from launcher.cluster.syncjoin import SyncCoordination
from launcher.jobspec.runspec import ClusterSpec
from launcher.supervision.integration import Integration, Integrations


class Recorder(Integration):
    def __init__(self, name, log, fail_start=False, fail_stop=False):
        self.name, self.log, self.fail_start, self.fail_stop = name, log, fail_start, fail_stop

    def start(self, host):
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(("start", self.name))

    def attempt_started(self, attempt):
        self.log.append(("attempt_started", self.name, attempt))

    def attempt_ended(self, attempt, failed):
        self.log.append(("attempt_ended", self.name, attempt, failed))

    def on_event(self, event, fields):
        self.log.append(("event", self.name, event))

    def stop(self):
        self.log.append(("stop", self.name))
        if self.fail_stop:
            raise RuntimeError(f"{self.name} cannot stop")


def test_started_in_order_stopped_in_reverse():
    log = []
    group = Integrations([Recorder("a", log), Recorder("b", log), Recorder("c", log)])
    group.start(host=None)
    group.stop()
    assert log == [("start", "a"), ("start", "b"), ("start", "c"), ("stop", "c"), ("stop", "b"), ("stop", "a")]


def test_a_failed_start_stops_those_already_started():
    log = []
    group = Integrations([Recorder("a", log), Recorder("b", log, fail_start=True), Recorder("c", log)])
    with pytest.raises(RuntimeError):
        group.start(host=None)
    group.stop()
    assert log == [("start", "a"), ("stop", "a")]


def test_one_failing_stop_does_not_keep_the_others_running(caplog):
    log = []
    group = Integrations([Recorder("a", log), Recorder("b", log, fail_stop=True)])
    group.start(host=None)
    with caplog.at_level(logging.ERROR):
        group.stop()
    assert log[-2:] == [("stop", "b"), ("stop", "a")]
    assert "stopping the b failed" in caplog.text
    group.stop()  # stopped once only
    assert log.count(("stop", "a")) == 1


def test_attempt_hooks_and_every_event_reach_the_started_ones():
    log = []
    group = Integrations([Recorder("a", log)])
    group.dispatch("attempt_start", {"attempt": 0})  # not started yet: nothing
    group.start(host=None)
    group.dispatch("attempt_start", {"attempt": 0, "ranks": [0, 1]})
    group.dispatch("rank_exited", {"attempt": 0, "rank": 1})
    group.dispatch("attempt_end", {"attempt": 0, "failed": True})
    assert log[1:] == [("attempt_started", "a", 0), ("event", "a", "attempt_start"), ("event", "a", "rank_exited"),
                       ("attempt_ended", "a", 0, True), ("event", "a", "attempt_end")]


class FakeCoordinator:
    def __init__(self):
        self.left = []

    def leave(self, generation, result, quiet=False):
        self.left.append((generation, result.reason, result.exit_code, quiet))


def coordination(events):
    sync = SyncCoordination()
    sync.coordinator = FakeCoordinator()
    for event, fields in events:
        sync.on_event(event, fields)
    sync.stop()
    return sync.coordinator.left


def test_a_launcher_error_leaves_the_coordination_at_the_supervisors_attempt():
    # The supervisor counted a restart (attempt 2) and failed before attempt 2 started.
    left = coordination([("attempt_start", {"attempt": 0}), ("restart", {"attempt": 1}),
                         ("attempt_start", {"attempt": 1}), ("restart", {"attempt": 2})])
    assert left == [(2, "launcher-error", 1, True)]


def test_a_job_that_ended_has_left_already():
    assert coordination([("attempt_start", {"attempt": 0}), ("job_end", {"reason": "succeeded"})]) == []


def test_without_coordination_there_is_nothing_to_leave():
    sync = SyncCoordination()
    sync.start(SimpleNamespace(spec=SimpleNamespace(cluster=ClusterSpec()), ctx=None))
    sync.stop()
    assert sync.coordinator is None


class Contributes(Integration):
    """An integration contributing one of each (what the restart loop and the ranks may ask)."""

    def __init__(self, held=None, step=None, section=None, env=None, coordinator=None):
        self._held, self._step, self._section = held, step, section or {}
        self._env, self._coordinator = env or {}, coordinator

    def hold(self):
        return self._held

    def progress(self, attempt):
        return self._step

    def status(self):
        return dict(self._section)

    def rank_env(self):
        return dict(self._env)

    def restart_coordinator(self):
        return self._coordinator

    def coordinates_restarts(self):
        return self._coordinator is not None


def test_the_session_asks_every_started_member_never_one_by_name():
    plain, first, second = Integration(), Contributes(env={"A": "1", "B": "1"}), Contributes(
        held="reset.json: FaultFlushing", step=7, section={"stragglers": [3]}, env={"B": "2"}, coordinator="c")
    members = Integrations([plain, first, second])
    assert (members.hold(), members.progress(0), members.status(), members.rank_env(),
            members.restart_coordinator(), members.coordinates_restarts()) == (None, None, {}, {}, None, False)
    members.start(None)
    assert members.hold() == "reset.json: FaultFlushing"
    assert members.progress(0) == 7 and members.status() == {"stragglers": [3]}
    assert members.rank_env() == {"A": "1", "B": "2"}  # later members win, in start order
    assert members.restart_coordinator() == "c" and members.coordinates_restarts()


def test_progress_is_the_highest_any_member_saw():
    members = Integrations([Contributes(step=3), Contributes(), Contributes(step=9)])
    members.start(None)
    assert members.progress(1) == 9
