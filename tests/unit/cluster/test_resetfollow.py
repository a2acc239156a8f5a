"""reset.json during a run: the follower and the decisions on its changes."""

import json
import logging
import time

import pytest

from launcher.common.filewatch import PathWatcher
from launcher.supervision.procgroup import LocalProcessGroup
from launcher.cluster.resetfollow import ResetChange, ResetFollower, changes
from launcher.cluster.resetjson import ResetState, parse_reset
from tests.helpers.configmap import ConfigMapDir
from tests.unit.cluster.test_resetjson import FULL

def state(statuses=(), **fields):
    return ResetState(statuses=tuple(sorted(statuses)), **fields)


# -- following ----------------------------------------------------------------------------------
class FakeWatcher:
    def __init__(self, path, on_change):
        self.path, self.on_change, self.closed = path, on_change, False

    def close(self):
        self.closed = True


@pytest.fixture
def follow(tmp_path):
    """A follower on ``tmp_path/config/reset.json`` with a hand-driven watcher."""
    cm = ConfigMapDir(tmp_path / "config")
    updates, watchers = [], []

    def factory(path, on_change):
        watchers.append(FakeWatcher(path, on_change))
        return watchers[-1]

    def start():
        follower = ResetFollower(cm.path("reset.json"), factory, lambda new, old: updates.append((new, old)))
        return follower, watchers[-1]

    return cm, start, updates


def test_follower_reports_real_changes_only(follow):
    cm, start, updates = follow
    follower, watcher = start()
    assert follower.current is None and watcher.path == cm.path("reset.json")
    cm.write("reset.json", json.dumps({"RetryTime": 1}))
    watcher.on_change()
    first = ResetState(retry_time=1)
    assert follower.current == first and updates == [(first, None)]
    watcher.on_change()  # same bytes
    cm.write("reset.json", json.dumps({"RetryTime": 1}, indent=2))  # other bytes, same state
    watcher.on_change()
    assert len(updates) == 1
    cm.write("restartType", "hotReset")  # the sibling alone changed
    watcher.on_change()
    assert updates[-1] == (ResetState(retry_time=1, restart_type="hotReset"), first)
    follower.close()
    assert watcher.closed


def test_follower_initial_state_is_not_an_update(follow):
    cm, start, updates = follow
    cm.write("reset.json", json.dumps(FULL))
    follower, _watcher = start()
    assert follower.current == parse_reset(FULL) and updates == []


def test_follower_keeps_the_last_good_state_and_warns_once(follow, caplog):
    cm, start, updates = follow
    cm.write("reset.json", json.dumps({"RetryTime": 1}))
    follower, watcher = start()
    good = follower.current
    caplog.set_level(logging.WARNING, logger="launcher.cluster.resetjson")
    for content in ("{broken", "{broken", '{"RankList": [{"RankId": "x"}]}', '{"RankList": [{"RankId": "x"}]}'):
        cm.write("reset.json", content)
        watcher.on_change()
        watcher.on_change()
    assert follower.current is good and updates == []
    malformed = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed) == 2  # one per distinct content, not per read or per generation
    cm.write("reset.json", "")  # emptied: still no information, the state stays
    watcher.on_change()
    assert follower.current is good and updates == []
    cm.write("reset.json", json.dumps({"RetryTime": 2}))
    watcher.on_change()
    assert updates == [(ResetState(retry_time=2), good)]


def test_follower_on_the_real_event_loop(tmp_path):
    loop = LocalProcessGroup(lambda spec, attempt: "/dev/null", lambda spec: False)
    cm = ConfigMapDir(tmp_path, {"reset.json": json.dumps({"RetryTime": 0})})
    updates = []

    def factory(path, on_change):
        return PathWatcher(path, on_change, loop.add_reader, loop.remove_reader, loop.call_later, loop.cancel,
                           debounce=0.01)

    follower = ResetFollower(cm.path("reset.json"), factory, lambda new, old: updates.append(new))
    try:
        for retry in (1, 1, 2):
            cm.write("reset.json", json.dumps({"RetryTime": retry}))
            deadline = time.monotonic() + 3
            while follower.current.retry_time != retry and time.monotonic() < deadline:
                loop.wait_event(0.01)
        loop.wait_event(0.05)
        assert [s.retry_time for s in updates] == [1, 2]
    finally:
        follower.close()
        loop.close()


# -- decisions ----------------------------------------------------------------------------------
LOCAL = {0, 1, 2, 3}  # this node; ranks 4..7 are another node's


def test_fault_then_recovered():
    fault = state([(1, "fault"), (5, "fault")])
    got = changes(None, fault, LOCAL)
    assert got == ResetChange(frozenset({1}), recovered_all=False, retry_bumped=False,
                              graceful_exit_requested=False, hold=True)
    unrecovered = state([(1, "unrecovered"), (5, "unrecovered")])
    got = changes(fault, unrecovered, LOCAL)
    assert got.newly_faulty_local == set() and not got.hold  # still faulty, not newly; unrecovered does not hold
    recovered = state([(1, "recovered"), (5, "recovered")])
    got = changes(unrecovered, recovered, LOCAL)
    assert got.recovered_all and got.restart and got.newly_faulty_local == set()
    assert not changes(recovered, recovered, LOCAL).recovered_all  # an edge, not a level


def test_retry_time_bump():
    got = changes(state(retry_time=1), state(retry_time=2), LOCAL)
    assert got.retry_bumped and got.restart and not got.recovered_all
    assert not changes(state(retry_time=2), state(retry_time=2, update_time=9), LOCAL).retry_bumped
    assert not changes(state(retry_time=2), state(retry_time=1), LOCAL).retry_bumped
    assert changes(None, state(retry_time=1), LOCAL).retry_bumped


def test_graceful_exit_zero_to_one():
    assert changes(state(), state(graceful_exit=True), LOCAL).graceful_exit_requested
    assert not changes(state(graceful_exit=True), state(graceful_exit=True, update_time=5),
                       LOCAL).graceful_exit_requested
    assert not changes(state(graceful_exit=True), state(), LOCAL).graceful_exit_requested


def test_fault_flushing_holds():
    flushing = state([(6, "fault")], fault_flushing=True)
    got = changes(state(), flushing, LOCAL)
    assert got.hold and got.newly_faulty_local == set()
    assert not changes(flushing, state([(6, "fault")]), LOCAL).hold  # a remote fault does not hold us


def test_ranks_of_other_nodes_are_not_local():
    got = changes(state([(4, "recovered")]), state([(4, "failed"), (7, "unrecovered"), (2, "failed")]), LOCAL)
    assert got.newly_faulty_local == {2}
    got = changes(state([(2, "fault")]), state([(2, "fault"), (3, "failed")]), LOCAL)
    assert got.newly_faulty_local == {3}
    assert changes(None, state([(5, "fault")]), []).newly_faulty_local == set()
