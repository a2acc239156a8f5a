"""reset.json: parsing every field, the malformed corpus, reading, the follower, and the decisions."""

import json
import logging
import time

import pytest

from launcher.filewatch import PathWatcher
from launcher.procgroup import LocalProcessGroup
from launcher.restore.faults import parse_reset_json
from launcher.resetjson import (EMPTY, ResetChange, ResetFollower, ResetState, changes, loads_reset, parse_reset,
                                read_reset)
from tests.helpers.configmap import ConfigMapDir

FULL = {
    "RankList": [
        {"RankId": 3, "Status": "unrecovered", "Policy": "restart", "LogicId": 3, "ErrorCode": [1]},
        {"RankId": "1", "Status": "Recovered", "Policy": ""},
        {"RankId": 9, "Status": "failed"},
        {"RankId": 0, "Status": "fault"},
    ],
    "UpdateTime": 1763704800, "RetryTime": 2, "FaultFlushing": True, "GracefulExit": 1,
    "RestartFaultProcess": True, "SomethingNew": {"ignored": True},
}


def state(statuses=(), **fields):
    return ResetState(statuses=tuple(sorted(statuses)), **fields)


# -- parsing ------------------------------------------------------------------------------------
def test_parse_every_field():
    got = parse_reset(FULL, " hotReset\n")
    assert got.statuses == ((0, "fault"), (1, "recovered"), (3, "unrecovered"), (9, "failed"))
    assert (got.update_time, got.retry_time) == (1763704800, 2)
    assert got.fault_flushing and got.graceful_exit and got.restart_fault_process
    assert got.restart_type == "hotReset"
    assert got.warnings == ()


def test_helpers():
    got = parse_reset(FULL)
    assert got.status_of(3) == "unrecovered" and got.status_of(5) is None
    assert got.faulty() == {0, 3, 9}
    assert got.faulty([1, 3, 4]) == {3}
    assert got.ranks() == {0, 1, 3, 9}
    assert not got.all_recovered()
    assert got.hold([5])  # FaultFlushing holds everyone
    calm = parse_reset({**FULL, "FaultFlushing": False})
    assert calm.hold([0, 7]) and not calm.hold([3, 9])  # only a local "fault" holds, not unrecovered
    assert parse_reset({"RankList": [{"RankId": 1, "Status": "recovered"}]}).all_recovered()
    assert not EMPTY.all_recovered()  # nothing listed is not "all recovered"


def test_minimal_and_null_fields_default():
    got = parse_reset({"RankList": None, "UpdateTime": None, "GracefulExit": None})
    assert got == EMPTY and got.restart_type is None
    assert parse_reset({}) == EMPTY
    assert parse_reset({"GracefulExit": True}).graceful_exit


def test_unknown_values_are_warnings_not_errors():
    got = parse_reset({"RankList": [{"RankId": 2, "Status": "rebooting"}, {"RankId": 4, "Status": ""}],
                       "GracefulExit": 2})
    assert got.status_of(2) == "rebooting"
    assert got.faulty() == set() and not got.all_recovered()
    assert not got.graceful_exit
    assert len(got.warnings) == 3 and "rebooting" in got.warnings[0] and "GracefulExit 2" in got.warnings[2]


def test_fault_ranks_agree_with_the_restore_reader():
    payload = {"RankList": [{"RankId": r, "Status": s} for r, s in
                            enumerate(["fault", "recovered", "failed", "unrecovered", "FAULT"])]}
    assert parse_reset(payload).faulty() == set(parse_reset_json(payload)[0])


MALFORMED = [
    ("[]", "JSON object"),
    ('"reset"', "JSON object"),
    ("42", "JSON object"),
    ("{not json", "not valid JSON"),
    ('{"RankList": {"RankId": 1}}', "RankList must be an array"),
    ('{"RankList": [1]}', "RankList[0] must be an object"),
    ('{"RankList": [{"Status": "fault"}]}', "RankList[0] has no RankId"),
    ('{"RankList": [{"RankId": "x", "Status": "fault"}]}', "RankList[0].RankId"),
    ('{"RankList": [{"RankId": 1.5, "Status": "fault"}]}', "RankList[0].RankId"),
    ('{"RankList": [{"RankId": true, "Status": "fault"}]}', "RankList[0].RankId"),
    ('{"RankList": [{"RankId": -1, "Status": "fault"}]}', "negative"),
    ('{"RankList": [{"RankId": 1}]}', "RankList[0].Status"),
    ('{"RankList": [{"RankId": 1, "Status": 3}]}', "RankList[0].Status"),
    ('{"RankList": [{"RankId": 1, "Status": "fault"}, {"RankId": "1", "Status": "recovered"}]}', "two statuses"),
    ('{"RetryTime": "1"}', "RetryTime must be an integer"),
    ('{"RetryTime": 1.5}', "RetryTime must be an integer"),
    ('{"UpdateTime": true}', "UpdateTime must be an integer"),
    ('{"FaultFlushing": "true"}', "FaultFlushing must be true or false"),
    ('{"FaultFlushing": 1}', "FaultFlushing must be true or false"),
    ('{"RestartFaultProcess": "yes"}', "RestartFaultProcess"),
    ('{"GracefulExit": "1"}', "GracefulExit must be 0 or 1"),
    ('{"GracefulExit": 1.0}', "GracefulExit must be 0 or 1"),
    (b'{"RankList": "\xff"}', "is not UTF-8"),
    ('{"RankList": [{"RankId": 1, "Status": "fault"}', "is not valid JSON"),
]


@pytest.mark.parametrize("content,message", MALFORMED)
def test_malformed_content_is_a_value_error(content, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        loads_reset(content)


def test_duplicate_entries_with_the_same_status_are_fine():
    got = parse_reset({"RankList": [{"RankId": 1, "Status": "fault"}, {"RankId": "1", "Status": "fault"}]})
    assert got.statuses == ((1, "fault"),)


# -- reading ------------------------------------------------------------------------------------
def test_missing_or_empty_file_is_none(tmp_path):
    assert read_reset(str(tmp_path / "absent" / "reset.json")) is None
    for blank in ("", "  \n"):
        (tmp_path / "reset.json").write_text(blank)
        assert read_reset(str(tmp_path / "reset.json")) is None


def test_read_from_a_configmap_with_restart_type(tmp_path):
    cm = ConfigMapDir(tmp_path, {"reset.json": json.dumps(FULL), "restartType": "podReschedule"})
    assert read_reset(cm.path("reset.json")) == parse_reset(FULL, "podReschedule")
    cm.update({"reset.json": json.dumps({"RetryTime": 3}), "restartType": "hotReset"})
    assert read_reset(cm.path("reset.json")) == ResetState(retry_time=3, restart_type="hotReset")


def test_read_malformed_names_the_file(tmp_path):
    (tmp_path / "reset.json").write_text('{"RankList": [{"RankId": "x", "Status": "fault"}]}')
    with pytest.raises(ValueError, match="reset.json: RankList"):
        read_reset(str(tmp_path / "reset.json"))


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
    caplog.set_level(logging.WARNING, logger="launcher.resetjson")
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
