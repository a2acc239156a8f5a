"""Generating rank tables, round trips through the parser, and torchrun-style local tables."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.errors import UsageError
from launcher.jobspec.ranktable import (RankTableNotReady, build_local_table, generate_rank_table, parse_rank_table,
                                        validate_rank_table)

SHAPES = st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=24)


def test_generated_table_is_all_strings_and_valid():
    data = generate_rank_table([("10.0.0.1", 2), ("10.0.0.2", 1)])
    assert data == {
        "status": "completed", "version": "1.0", "server_count": "2",
        "server_list": [
            {"server_id": "10.0.0.1", "device": [{"device_id": "0", "rank_id": "0"},
                                                 {"device_id": "1", "rank_id": "1"}]},
            {"server_id": "10.0.0.2", "device": [{"device_id": "0", "rank_id": "2"}]},
        ]}
    assert validate_rank_table(data) == []


def test_generated_initializing_table_is_not_ready():
    with pytest.raises(RankTableNotReady):
        parse_rank_table(generate_rank_table([("a", 1)], status="initializing"))


@pytest.mark.parametrize("servers, fragment", [
    ([], "no servers given"),
    ([("a", 1), ("a", 2)], "server a is listed twice"),
    ([("a", 0)], "device count 0 must be a positive integer"),
    ([("a", True)], "device count True must be a positive integer"),
    ([("", 1)], "server address '' must be a non-empty string"),
])
def test_generate_rejects_bad_servers(servers, fragment):
    with pytest.raises(UsageError) as info:
        generate_rank_table(servers)
    assert any(fragment in p for p in info.value.problems)


def _shuffled(data, permutation, reverse_devices):
    shuffled = copy.deepcopy(data)
    shuffled["server_list"] = [shuffled["server_list"][i] for i in permutation]
    if reverse_devices:
        for server in shuffled["server_list"]:
            server["device"].reverse()
    return shuffled


def _as_v12(data):
    table = copy.deepcopy(data)
    table["version"] = "1.2"
    for server in table["server_list"]:
        for device in server["device"]:
            device["super_device_id"] = str(1000 + int(device["rank_id"]))
    table["super_pod_list"] = [{"super_pod_id": "0", "server_list": [
        {"server_id": s["server_id"]} for s in table["server_list"]]}]
    return table


def _as_v20(data):
    ranks = [{"rank_id": int(d["rank_id"]), "device_id": int(d["device_id"]), "local_id": int(d["device_id"]),
              "level_list": [{"net_layer": 1, "net_instance_id": "cluster"},
                             {"net_layer": 0, "net_instance_id": s["server_id"],
                              "net_type": "TOPO_FILE_DESC"}]}
             for s in data["server_list"] for d in s["device"]]
    return {"version": "2.0", "status": "completed", "rank_count": len(ranks), "rank_list": ranks[::-1]}


def _shape(table):
    return [(s.server_id, [(d.rank_id, d.device_id) for d in s.devices]) for s in table.servers]


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_round_trip_keeps_shape_and_order(shape, data):
    servers = [(f"10.0.{i // 250}.{i % 250 + 1}", n) for i, n in enumerate(shape)]
    document = generate_rank_table(servers)
    table = parse_rank_table(document)
    assert table.world_size == sum(shape)
    assert [s.server_id for s in table.servers] == [a for a, _ in servers]
    assert [len(s.devices) for s in table.servers] == shape
    assert [r for s in table.servers for r in s.ranks] == list(range(sum(shape)))
    assert all([d.device_id for d in s.devices] == list(range(len(s.devices))) for s in table.servers)

    permutation = data.draw(st.permutations(range(len(shape))))
    shuffled = _shuffled(document, permutation, data.draw(st.booleans()))
    assert parse_rank_table(shuffled) == table


@settings(max_examples=40, deadline=None)
@given(shape=SHAPES)
def test_same_shape_in_every_format(shape):
    """1.2 names each server twice and 2.0 lists ranks, not servers: same servers, same ranks."""
    document = generate_rank_table([(f"node{i}", n) for i, n in enumerate(shape)])
    reference = _shape(parse_rank_table(document))
    v12 = parse_rank_table(_as_v12(document))
    assert _shape(v12) == reference and v12.world_size == sum(shape)
    assert {s.super_pod_id for s in v12.servers} == {"0"}
    v20 = parse_rank_table(_as_v20(document))
    assert _shape(v20) == reference and v20.format_version == "2.0"


def test_build_local_table_single_node():
    table = build_local_table(4)
    assert table.format_version == "generated"
    assert (table.master_addr, table.master_port) == ("127.0.0.1", 29500)
    (server,) = table.servers
    assert (server.server_id, server.host_ip, server.container_ip) == ("node0", None, None)
    assert [(d.rank_id, d.device_id) for d in server.devices] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_build_local_table_multi_node():
    table = build_local_table(nproc_per_node=2, nnodes=3, node_rank=2, master_addr="10.1.1.1",
                              master_port=1234)
    assert [s.server_id for s in table.servers] == ["node0", "node1", "node2"]
    assert table.servers[2].ranks == (4, 5)
    assert [d.device_id for d in table.servers[2].devices] == [0, 1]
    assert (table.world_size, table.master_addr, table.master_port) == (6, "10.1.1.1", 1234)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"nproc_per_node": 0}, "nproc_per_node must be a positive integer"),
    ({"nproc_per_node": 2, "nnodes": -1}, "nnodes must be a positive integer"),
    ({"nproc_per_node": 2, "nnodes": 2, "node_rank": 2}, "node_rank must be in 0..nnodes-1"),
    ({"nproc_per_node": 2, "node_rank": -1}, "node_rank must be in 0..nnodes-1"),
    ({"nproc_per_node": True}, "nproc_per_node must be a positive integer"),
    ({"nproc_per_node": 2, "master_addr": ""}, "master_addr must be a non-empty address"),
    ({"nproc_per_node": 2, "master_port": 70000}, "master_port must be in 1..65535"),
])
def test_build_local_table_rejects_bad_arguments(kwargs, fragment):
    with pytest.raises(UsageError) as info:
        build_local_table(**kwargs)
    assert info.value.exit_code == 2
    assert any(fragment in p for p in info.value.problems)
