"""The walk shared by the parser (strict: first problem) and the validator (lenient: every problem)."""

import pytest

from launcher.jobspec.ranktable.generate import generate_rank_table
from launcher.jobspec.ranktable.walk import Invalid, Walk, extract, semantic_problems, version_problem


def two_servers():
    return generate_rank_table([("10.0.0.1", 2), ("10.0.0.2", 2)])


@pytest.mark.parametrize("data, problem", [
    ({}, "$: 'version' is a required property"),
    ({"version": "3.0"}, "$.version: unsupported rank table version '3.0'"),
    ({"version": 1.0}, "$.version: unsupported rank table version 1.0"),
])
def test_version_problems(data, problem):
    assert version_problem(data).startswith(problem)


def test_a_supported_version_has_no_problem():
    assert version_problem(two_servers()) is None


def test_a_good_table_walks_to_its_servers():
    version, drafts, pods = extract(Walk(strict=True), two_servers())
    assert version == "1.0" and pods == {}
    assert [[d.rank_id for d in draft.devices] for draft in drafts] == [[0, 1], [2, 3]]


def table_with_two_problems():
    data = two_servers()
    data["server_list"][1]["device"][0]["rank_id"] = "0"  # duplicate of server 0's rank 0
    data["server_list"][1]["device"][1]["device_id"] = data["server_list"][1]["device"][0]["device_id"]
    return data


def test_the_strict_walk_stops_at_the_first_problem():
    with pytest.raises(Invalid):
        extract(Walk(strict=True), table_with_two_problems())


def test_the_lenient_walk_records_every_problem():
    problems = semantic_problems(table_with_two_problems())
    assert len(problems) == 3  # the duplicate rank 0 also leaves rank 2 missing
    assert problems[0].startswith("$.server_list[1].device[0].rank_id: duplicate rank_id 0")
    assert any("duplicate device_id" in p for p in problems)
    assert all(p.startswith("$.server_list") for p in problems)
