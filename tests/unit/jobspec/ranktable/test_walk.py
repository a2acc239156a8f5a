"""The walk shared by the parser (strict: first problem) and the validator (lenient: every problem)."""

import copy
import json
from pathlib import Path

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


SUPERPOD = json.loads((Path(__file__).resolve().parents[3] / "data" / "ranktables" / "good" / "v1.2-superpod.json")
                      .read_text())
_POD = "$.super_pod_list[0]"
_UNKNOWN = "{}.server_list[{}].server_id: unknown server {!r} (not in $.server_list)"


@pytest.mark.parametrize("pods, lenient, problems, strict", [
    # pods (None: no super_pod_list), the lenient walk's map and problems, the strict walk's map or problem
    (None, {}, [], {}),
    ([], {}, [], {}),
    ({"0": []}, {}, [], "$.super_pod_list: expected an array, got {'0': []}"),
    (["0"], {}, [], f"{_POD}: expected an object, got '0'"),
    ([{"server_list": [{"server_id": "node_0"}]}], {}, [], f"{_POD}.super_pod_id: missing"),
    ([{"super_pod_id": 0, "server_list": [{"server_id": "node_0"}]}], {}, [],
     f"{_POD}.super_pod_id: expected a non-empty string, got 0"),
    ([{"super_pod_id": "0"}], {}, [], f"{_POD}.server_list: missing"),
    ([{"super_pod_id": "0", "server_list": {"server_id": "node_0"}}], {}, [],
     f"{_POD}.server_list: expected an array, got {{'server_id': 'node_0'}}"),
    ([{"super_pod_id": "0", "server_list": ["node_0", {"server_id": "node_1"}]}], {"node_1": "0"}, [],
     f"{_POD}.server_list[0]: expected an object, got 'node_0'"),
    ([{"super_pod_id": "0", "server_list": [{"server_id": "node_9"}, "x"]}], {}, [_UNKNOWN.format(_POD, 0, "node_9")],
     _UNKNOWN.format(_POD, 0, "node_9")),  # the strict walk stops at the first problem in document order
    ([{"super_pod_id": "0", "server_list": [{}, {"server_id": "node_1"}]}], {"node_1": "0"}, [],
     f"{_POD}.server_list[0].server_id: missing"),
    ([{"super_pod_id": "0", "server_list": [{"server_id": "node_9"}, {"server_id": "node_1"}]}], {"node_1": "0"},
     [_UNKNOWN.format(_POD, 0, "node_9")], _UNKNOWN.format(_POD, 0, "node_9")),
    ([{"super_pod_id": "0", "server_list": [{"server_id": "node_0"}]},
      {"super_pod_id": "1", "server_list": [{"server_id": "node_0"}, {"server_id": "node_1"}]}],
     {"node_0": "0", "node_1": "1"},
     ["$.super_pod_list[1].server_list[0].server_id: server 'node_0' is already in super pod '0'"],
     "$.super_pod_list[1].server_list[0].server_id: server 'node_0' is already in super pod '0'"),
    ([{"super_pod_id": "0", "server_list": [{"server_id": "node_0"}]},
      {"super_pod_id": "1", "server_list": [{"server_id": "node_1"}]}],
     {"node_0": "0", "node_1": "1"}, [], {"node_0": "0", "node_1": "1"}),
    ([{"super_pod_id": 5, "server_list": [{"server_id": "node_9"}]},
      {"super_pod_id": "1", "server_list": [{"server_id": "node_8"}]}],
     {}, [_UNKNOWN.format("$.super_pod_list[1]", 0, "node_8")], f"{_POD}.super_pod_id: expected a non-empty string, got 5"),
])
def test_super_pod_list(pods, lenient, problems, strict):
    """A 1.2 table's super_pod_list: what each walk makes of it (a pod or member the schema rejects is
    skipped by the lenient walk; servers are named a second time and must be known, once)."""
    data = copy.deepcopy(SUPERPOD)
    if pods is None:
        del data["super_pod_list"]
    else:
        data["super_pod_list"] = pods
    walk = Walk(strict=False)
    assert (extract(walk, data)[2], walk.problems) == (lenient, problems)
    try:
        assert extract(Walk(strict=True), data)[2] == strict
    except Invalid as exc:
        assert str(exc) == strict


@pytest.mark.parametrize("servers, lenient, problems", [
    # a server_id that is not text does not make the server known
    ([{"server_id": "node_0"}, {"server_id": 7}], {"node_0": "0"}, [_UNKNOWN.format(_POD, 1, "node_1")]),
    ("x", {}, [_UNKNOWN.format(_POD, 0, "node_0"), _UNKNOWN.format(_POD, 1, "node_1")]),
])
def test_super_pods_know_only_the_servers_listed(servers, lenient, problems):
    data = copy.deepcopy(SUPERPOD)
    if isinstance(servers, list):
        for entry, changed in zip(data["server_list"], servers):
            entry.update(changed)
    else:
        data["server_list"] = servers
    walk = Walk(strict=False)
    assert (extract(walk, data)[2], walk.problems) == (lenient, problems)
