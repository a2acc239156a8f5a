"""Validating rank tables: schemas per version, semantic rules, JSON paths, the malformed corpus."""

import json
import re
from pathlib import Path

import jsonschema
import pytest

from launcher.common.errors import UsageError
from launcher.jobspec.ranktable import RankTableError, generate_rank_table, load_rank_table, validate_rank_table
from launcher.jobspec.ranktable.validate import json_path
from launcher.common.resources import load_schema

DATA = Path(__file__).resolve().parents[1] / "data" / "ranktables"
BAD = DATA / "bad"
EXPECTED = json.loads((BAD / "expected.json").read_text())
PATH_PREFIX = re.compile(r"^\$(\.[A-Za-z_]\w*|\[\d+\])*: ")


@pytest.mark.parametrize("version", ["1.0", "1.2", "2.0"])
def test_schemas_are_valid_json_schemas(version):
    schema = load_schema(f"ranktable-{version}.schema.json")
    jsonschema.validators.validator_for(schema).check_schema(schema)


@pytest.mark.parametrize("path", sorted((DATA / "good").glob("*.json")), ids=lambda p: p.name)
def test_good_tables_have_no_problems(path):
    assert validate_rank_table(json.loads(path.read_text())) == []


def test_corpus_is_complete():
    assert sorted(EXPECTED) == sorted(p.name for p in BAD.glob("*.json") if p.name != "expected.json")


def _matches(problems, fragments):
    """One problem per expected fragment, in order: nothing missing, nothing extra."""
    return len(problems) == len(fragments) and all(f in p for p, f in zip(problems, fragments))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_table_reports_exactly_its_problems_with_json_paths(name):
    problems = validate_rank_table(json.loads((BAD / name).read_text()))
    assert _matches(problems, EXPECTED[name]), problems
    assert all(PATH_PREFIX.match(p) for p in problems), problems


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_table_fails_to_load_with_a_usage_error(name):
    with pytest.raises(UsageError) as info:
        load_rank_table(BAD / name)
    assert isinstance(info.value, RankTableError) and info.value.exit_code == 2
    assert str(BAD / name) in info.value.message
    assert _matches(info.value.problems, EXPECTED[name]), info.value.problems


def test_every_problem_is_reported_in_natural_order():
    data = generate_rank_table([(f"h{i}", 1) for i in range(12)])
    for index in (10, 2):
        data["server_list"][index]["device"][0]["device_id"] = "x"
    data["server_count"] = "5"
    assert validate_rank_table(data) == [
        "$.server_count: says 5 but server_list has 12 servers",
        "$.server_list[2].device[0].device_id: 'x' does not match '^[0-9]+$'",
        "$.server_list[10].device[0].device_id: 'x' does not match '^[0-9]+$'",
    ]


def test_not_ready_table_is_a_problem():
    data = generate_rank_table([("a", 1)], status="initializing")
    assert validate_rank_table(data) == [
        '$.status: the table is not ready: status "initializing" (expected "completed")']


def test_unknown_version_stops_validation():
    assert validate_rank_table({"version": "0.9", "server_list": 3}) == [
        "$.version: unsupported rank table version '0.9' (supported: 1.0, 1.2, 2.0)"]


def test_non_object_document():
    assert validate_rank_table(None) == ["$: expected a JSON object, got null"]


def test_large_values_are_abbreviated():
    data = generate_rank_table([(f"h{i}", 8) for i in range(50)])
    data["server_list"] = {"servers": data["server_list"]}
    (problem,) = validate_rank_table(data)
    assert problem.startswith("$.server_list: {'servers': [{") and problem.endswith("is not of type 'array'")
    assert len(problem) < 120


def test_long_messages_are_cut():
    data = generate_rank_table([("a", 1)])
    data["server_list"][0]["server_id"] = ""
    data["server_list"][0]["device"][0]["device_id"] = "x" * 300
    problems = validate_rank_table(data)
    assert all(len(p) < 260 for p in problems)
    assert any(p.endswith("...") for p in problems)


def test_duplicate_server_ids_are_allowed_for_pods_on_one_node():
    """Two pods on one node share server_id (the node IP) and differ by container_ip."""
    data = generate_rank_table([("10.0.0.1", 2), ("10.0.0.2", 2)])
    data["server_list"][1]["server_id"] = "10.0.0.1"
    data["server_list"][0]["container_ip"] = "172.16.0.1"
    data["server_list"][1]["container_ip"] = "172.16.0.2"
    assert validate_rank_table(data) == []


def test_problems_after_a_skipped_entry_are_still_found():
    data = generate_rank_table([("a", 2), ("b", 2)])
    data["server_list"][0]["device"][0]["rank_id"] = 0  # wrong type: reported by the schema
    data["server_list"][1]["device"][1]["device_id"] = "0"  # duplicate: found by the semantic walk
    problems = validate_rank_table(data)
    assert "$.server_list[0].device[0].rank_id: 0 is not of type 'string'" in problems
    assert any(p.startswith("$.server_list[1].device[1].device_id: duplicate device_id 0") for p in problems)


@pytest.mark.parametrize("parts, expected", [
    ((), "$"),
    (("server_list", 1, "device", 0, "rank_id"), "$.server_list[1].device[0].rank_id"),
    (("odd key", 2), "$['odd key'][2]"),
])
def test_json_path(parts, expected):
    assert json_path(parts) == expected
