"""Parsing rank tables: formats 1.0, 1.2 and 2.0, semantic checks, speed, robustness."""

import copy
import json
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.common.errors import LauncherError, UsageError
from launcher.jobspec.ranktable import (RankTableError, RankTableNotReady, generate_rank_table, load_rank_table,
                                        parse_rank_table, validate_rank_table)
from launcher.jobspec.ranktable import parse as parse_module
from tests.helpers.paths import DATA as TEST_DATA, REPO

DATA = TEST_DATA / "ranktables"
GOOD = DATA / "good"


def good(name):
    return json.loads((GOOD / name).read_text())


def test_contract_example_parses():
    table = parse_rank_table(good("v1.0-two-servers.json"), source="hccl.json", revision="7")
    assert table.format_version == "1.0"
    assert table.status == "completed"
    assert (table.source, table.revision) == ("hccl.json", "7")
    assert table.world_size == 4 and table.server_count == 2
    first = table.servers[0]
    assert (first.server_id, first.host_ip, first.container_ip) == ("10.0.0.1", "10.0.0.1", "172.16.0.5")
    assert [(d.rank_id, d.device_id, d.device_ip) for d in first.devices] == [
        (0, 0, "192.168.0.1"), (1, 1, "192.168.0.2")]
    assert table.master_addr == "172.16.0.5"  # the pod address of the server hosting rank 0


@pytest.mark.parametrize("path", sorted(GOOD.glob("*.json")), ids=lambda p: p.name)
def test_every_good_table_parses_with_contiguous_ranks(path):
    table = load_rank_table(path)
    assert table.format_version == path.name[1:4]
    ranks = [r for s in table.servers for r in s.ranks]
    assert ranks == list(range(table.world_size))
    assert all(list(s.ranks) == sorted(s.ranks) for s in table.servers)


def test_devices_per_server_may_differ():
    table = load_rank_table(GOOD / "v1.0-uneven-devices.json")
    assert [len(s.devices) for s in table.servers] == [8, 4, 2]
    assert table.servers[2].ranks == (12, 13)
    assert table.servers[0].host_ip is None and table.servers[0].container_ip is None


def test_servers_and_devices_are_sorted_by_rank():
    table = load_rank_table(GOOD / "v1.0-unsorted.json")
    assert [s.server_id for s in table.servers] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert table.servers[1].ranks == (2, 3, 4)


def test_v12_is_not_double_counted():
    """Legacy defect 1: grep/awk counted server_id twice on 1.2 tables (super_pod_list)."""
    table = load_rank_table(GOOD / "v1.2-superpod.json")
    assert table.server_count == 2 and table.world_size == 4
    assert {s.super_pod_id for s in table.servers} == {"0"}
    assert table.servers[1].devices[0].super_device_id == "102"
    assert table.servers[1].devices[0].device_id == 0


def test_v20_groups_ranks_by_node_layer_instance():
    table = load_rank_table(GOOD / "v2.0-two-servers.json")
    assert [s.server_id for s in table.servers] == ["10.1.0.1", "10.1.0.2"]
    assert [d.local_id for d in table.servers[1].devices] == [0, 1]
    assert table.servers[1].ranks == (2, 3)


def test_v20_accepts_strings_and_no_status():
    table = load_rank_table(GOOD / "v2.0-strings-uneven.json")
    assert table.status == "completed"
    assert [(s.server_id, len(s.devices)) for s in table.servers] == [("superpod0_0", 4), ("superpod0_1", 1)]


def test_v20_accepts_integral_floats_like_json_schema():
    data = good("v2.0-two-servers.json")
    data["rank_count"] = 4.0
    data["rank_list"][1]["rank_id"] = 1.0
    assert validate_rank_table(data) == []
    assert parse_rank_table(data).servers[0].ranks == (0, 1)


def test_find_servers_matches_addresses_exactly():
    """Legacy defect 1: an unanchored grep made 10.0.0.1 match 10.0.0.11."""
    table = load_rank_table(GOOD / "v1.0-similar-addresses.json")
    assert [s.server_id for s in table.find_servers(["10.0.0.1"])] == ["10.0.0.1"]
    assert [s.server_id for s in table.find_servers(["10.0.0.11"])] == ["10.0.0.11"]
    assert table.find_servers(["10.0.0"]) == []
    assert [s.server_id for s in table.find_servers(["172.16.0.6"])] == ["10.0.0.1"]  # by pod address


@pytest.mark.parametrize("status", ["initializing", "", "failed"])
def test_status_other_than_completed_is_not_ready(status):
    data = good("v1.0-two-servers.json")
    data["status"] = status
    with pytest.raises(RankTableNotReady) as info:
        parse_rank_table(data, source="x.json")
    assert info.value.status == status
    assert not isinstance(info.value, UsageError) and isinstance(info.value, LauncherError)
    assert "x.json" in info.value.message


def test_initializing_placeholder_is_not_ready():
    with pytest.raises(RankTableNotReady):
        load_rank_table(DATA / "initializing.json")


def test_problems_come_from_validate_with_json_paths():
    data = good("v1.0-two-servers.json")
    data["server_list"][1]["device"][1]["rank_id"] = "1"
    data["server_count"] = "9"
    with pytest.raises(RankTableError) as info:
        parse_rank_table(data, source="t.json")
    assert info.value.exit_code == 2
    assert info.value.message == "invalid rank table t.json"
    assert info.value.problems == validate_rank_table(data)
    assert "$.server_count: says 9 but server_list has 2 servers" in info.value.problems
    duplicate = "$.server_list[1].device[1].rank_id: duplicate rank_id 1"
    assert any(p.startswith(duplicate) for p in info.value.problems)


def test_non_object_is_rejected():
    with pytest.raises(RankTableError) as info:
        parse_rank_table(["not", "a", "table"])
    assert info.value.problems == ["$: expected a JSON object, got list"]


def test_parse_error_text_is_the_fallback(monkeypatch):
    monkeypatch.setattr("launcher.jobspec.ranktable.parse.validate_rank_table", lambda data: [])
    data = good("v1.0-two-servers.json")
    data["server_list"][0]["device"][0]["rank_id"] = 0
    with pytest.raises(RankTableError) as info:
        parse_rank_table(data)
    assert info.value.problems == ["$.server_list[0].device[0].rank_id: expected a decimal string, got 0"]


def test_many_problems_are_capped():
    data = generate_rank_table([(f"h{i}", 8) for i in range(10)])
    for server in data["server_list"]:
        for device in server["device"]:
            device["rank_id"] = int(device["rank_id"])
    with pytest.raises(RankTableError) as info:
        parse_rank_table(data)
    problems = info.value.problems
    assert len(problems) == parse_module.MAX_REPORTED_PROBLEMS + 1
    assert problems[-1].startswith("... and 30 more")


def test_parse_does_not_import_jsonschema():
    code = ("import sys, json; from launcher.jobspec.ranktable import load_rank_table; "
            f"load_rank_table({str(GOOD / 'v1.2-superpod.json')!r}); "
            "assert 'jsonschema' not in sys.modules and 'tenacity' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_large_table_parses_fast():
    data = generate_rank_table([(f"10.0.{i // 256}.{i % 256}", 16) for i in range(512)])
    for server in data["server_list"]:
        server["host_ip"] = server["server_id"]
        for device in server["device"]:
            device["device_ip"] = f"192.168.0.{device['device_id']}"
    best = float("inf")
    for _ in range(5):  # CPU time, best of 5: the bound is about our code, not a busy machine
        start = time.process_time()
        table = parse_rank_table(data)
        best = min(best, time.process_time() - start)
    assert table.world_size == 8192
    assert best < 0.1, f"512x16 parse took {best * 1000:.0f} ms"


def _locations(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _locations(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _locations(item, path + (index,))


_SCALARS = (st.none() | st.booleans() | st.integers(-3, 20) | st.floats(allow_nan=False)
            | st.sampled_from(["", "0", "1", "7", "-1", "x", "completed", "initializing", "1.0", "2.0"]))
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(p.name for p in GOOD.glob("*.json"))), data=st.data())
def test_mutated_tables_fail_only_with_rank_table_errors(name, data):
    """Whatever is wrong, parse raises RankTableError (with validator messages) or RankTableNotReady."""
    table = good(name)
    locations = list(_locations(table))
    target = data.draw(st.sampled_from(locations))
    mutated = copy.deepcopy(table)
    if not target:
        mutated = data.draw(_JSON)
    else:
        parent = mutated
        for key in target[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[target[-1]]
        else:
            parent[target[-1]] = data.draw(_JSON)
    try:
        parse_rank_table(mutated)
    except RankTableNotReady:
        pass
    except RankTableError as exc:
        expected = validate_rank_table(mutated)
        assert expected, "parse found a problem the validator missed"
        assert exc.problems == expected[:parse_module.MAX_REPORTED_PROBLEMS]
        assert all(p.startswith("$") for p in exc.problems)
