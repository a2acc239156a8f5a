"""reset.json: parsing every field, the malformed corpus, and reading."""

import json

import pytest

from launcher.restore.faults import parse_reset_json
from launcher.cluster.resetjson import EMPTY, ResetState, loads_reset, parse_reset, read_reset
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
