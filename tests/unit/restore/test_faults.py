"""Fault sources: the three fault-npus generations, reset.json, merging and bad input."""

import json

import pytest

from launcher.common.errors import UsageError
from launcher.restore.faults import (SOURCE_FAULT_NPUS, SOURCE_OPTION, SOURCE_PREVIOUS,
                                     SOURCE_RESET_JSON, collect_faults, parse_fault_npus,
                                     parse_reset_json)


def write(tmp_path, name, payload):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return str(path)


@pytest.mark.parametrize("payload,expected", [
    ({"status": "initializing"}, []),
    ({"FaultRankIds": ["0", "3"], "CreatTime": 1700000000, "checkCode": "abc"}, [0, 3]),
    ({"FaultRankIds": ["5"], "CreateTime": 1700000000}, [5]),
    ({"FaultRank": [0, 3], "UpdateTime": 1700000000, "checkCode": "abc"}, [0, 3]),
    ({"FaultRank": [], "UpdateTime": 1700000000}, []),
    ({"FaultRank": None}, []),
])
def test_fault_npus_generations(payload, expected):
    assert parse_fault_npus(payload) == expected


@pytest.mark.parametrize("payload", [
    [], {"status": "completed"}, {"FaultRank": "0,3"}, {"FaultRank": [True]},
    {"FaultRankIds": ["x"]}, {"FaultRank": [1.5]},
])
def test_fault_npus_bad_shapes(payload):
    with pytest.raises(ValueError):
        parse_fault_npus(payload)


def test_reset_json_statuses():
    payload = {"RankList": [
        {"RankId": 1, "Status": "unrecovered", "Policy": "x"},
        {"RankId": "2", "Status": "recovered"},
        {"RankId": 3, "Status": "failed"},
        {"RankId": 4, "Status": "fault"},
        {"RankId": 5, "Status": "Puzzled"},
    ], "UpdateTime": 1, "RetryTime": 0, "FaultFlushing": False, "GracefulExit": 0}
    ranks, notes = parse_reset_json(payload)
    assert sorted(ranks) == [1, 3, 4, 5]
    assert notes == ["rank 5 has unknown status 'puzzled'; treated as faulty"]


def test_merge_records_every_origin(tmp_path):
    report = collect_faults(
        8, write(tmp_path, "fault-npus", {"FaultRankIds": ["3"], "CreatTime": 1}),
        write(tmp_path, "reset.json", {"RankList": [{"RankId": 3, "Status": "fault"},
                                                    {"RankId": 6, "Status": "unrecovered"}]}),
        extra_fault_ranks=(5, 3), previous_failed_ranks=(7,))
    assert report.ranks == {3, 5, 6, 7}
    assert report.trusted and not report.warnings
    assert report.origins == (
        (3, tuple(sorted([SOURCE_FAULT_NPUS, SOURCE_OPTION, SOURCE_RESET_JSON]))),
        (5, (SOURCE_OPTION,)), (6, (SOURCE_RESET_JSON,)), (7, (SOURCE_PREVIOUS,)))


def test_missing_files_mean_no_faults(tmp_path):
    report = collect_faults(4, str(tmp_path / "absent"), str(tmp_path / "absent2"))
    assert report.ranks == frozenset() and report.trusted and not report.warnings


def test_skipped_sources(tmp_path):
    assert collect_faults(4, None, None).ranks == frozenset()


@pytest.mark.parametrize("content", ["{not json", "", '{"FaultRank": "3"}'])
def test_unreadable_report_is_not_trusted(tmp_path, content):
    report = collect_faults(4, write(tmp_path, "fault-npus", content), None, extra_fault_ranks=(1,))
    assert not report.trusted
    assert report.ranks == {1}
    assert len(report.warnings) == 1 and "fault-npus" in report.warnings[0]


def test_out_of_range_report_ids_are_dropped_and_distrusted(tmp_path):
    report = collect_faults(4, write(tmp_path, "f", {"FaultRank": [2, 4, -1]}), None)
    assert report.ranks == {2}
    assert not report.trusted
    assert "[-1, 4]" in report.warnings[0]


def test_out_of_range_previous_failures_are_distrusted():
    report = collect_faults(4, None, None, previous_failed_ranks=(9,))
    assert report.ranks == frozenset() and not report.trusted


def test_out_of_range_option_is_a_usage_error():
    with pytest.raises(UsageError, match="--fault-ranks"):
        collect_faults(4, None, None, extra_fault_ranks=(4,))


def test_unreadable_path_is_a_warning(tmp_path):
    report = collect_faults(4, str(tmp_path), None)  # a directory: open() fails
    assert not report.trusted and report.warnings
