"""Unit tests for ``launcher.jobspec.rankenv``: the per-rank environment contracts (pure functions).

Tables are built by hand from the data model so these tests do not depend on the rank-table parser.
"""

import copy
import dataclasses
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.errors import UsageError
from launcher.jobspec.rankenv import (ROLE_SCHEDULER, ROLE_WORKER, SCHEDULER_RANK, EnvContext, WorkerSpec,
                                      build_rank_env, check_visible_devices, derived_run_id, scheduler_env,
                                      rendezvous_port, worker_specs)
from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry
from launcher.jobspec.topology import Topology

TABLE_FILE = "/user/serverid/devindex/config/hccl.json"
GI_ROOT = "/ckpt/group_info"
RUN_DIR = "/run/launcher"

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCHELASTIC_SIGNALS_TO_HANDLE")
MS_VARS = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_LOCAL_WORKER", "MS_NODE_RANK",
           "MS_NODE_ID", "MS_SERVER_NUM", "MS_TOPO_TIMEOUT")


# --------------------------------------------------------------------------- helpers

def two_server_table() -> RankTable:
    """2 servers x 4 devices, physical device ids deliberately not 0..3 in order."""
    s0 = ServerEntry("10.0.0.1", (Device(0, 4), Device(1, 5), Device(2, 6), Device(3, 7)),
                     host_ip="10.0.0.1", container_ip="172.16.0.5")
    s1 = ServerEntry("10.0.0.2", (Device(4, 1), Device(5, 3), Device(6, 0), Device(7, 2)),
                     host_ip="10.0.0.2", container_ip="172.16.0.6")
    return RankTable(servers=(s0, s1), source=TABLE_FILE)


def file_topology(server_index: int = 1, table: Optional[RankTable] = None, port: int = 29500) -> Topology:
    table = table or two_server_table()
    return Topology(table, table.servers[server_index], f"rank table {TABLE_FILE}", TABLE_FILE, False, port)


def dynamic_topology(server_index: int, nnodes: int = 2, nproc: int = 2, master: str = "10.1.1.1",
                     port: int = 8118) -> Topology:
    """A launcher-built table (msrun model) of ``nnodes`` x ``nproc``."""
    servers = tuple(ServerEntry(f"node{n}", tuple(Device(n * nproc + i, i) for i in range(nproc)))
                    for n in range(nnodes))
    table = RankTable(servers=servers, format_version="generated", master_host=master, master_port=port)
    return Topology(table, servers[server_index], "--nproc-per-node", None, True, port)


def make_ctx(topology: Topology, framework: str = "pytorch", base_env: Optional[Dict[str, str]] = None,
             extra: Optional[Dict[str, str]] = None, max_restarts: int = 3, run_id: str = "job-42") -> EnvContext:
    return EnvContext(framework=framework, topology=topology, run_id=run_id, max_restarts=max_restarts,
                      run_dir=RUN_DIR, group_info_root=GI_ROOT, base_env=base_env or {}, extra=extra or {})


def env_for(ctx: EnvContext, local_rank: int, attempt: int = 0,
            per_rank: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    return build_rank_env(ctx, ctx.topology.server.devices[local_rank], local_rank, attempt, per_rank)


# --------------------------------------------------------------------------- pytorch (torchrun contract)

def test_pytorch_env_is_exactly_the_torchrun_and_legacy_contract():
    ctx = make_ctx(file_topology(1), base_env={})
    env = env_for(ctx, 2, attempt=1)
    assert env == {
        # torchrun
        "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "6", "ROLE_WORLD_SIZE": "8",
        "ROLE_NAME": "default", "MASTER_ADDR": "172.16.0.5", "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "job-42", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP",
        "OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # legacy Ascend
        "RANK_ID": "6", "RANK_SIZE": "8", "DEVICE_ID": "2", "ASCEND_DEVICE_ID": "2", "DEVICE_NUM": "4",
        "SERVER_ID": "1", "SERVER_NUM": "2", "JOB_ID": "job-42", "RANK_TABLE_FILE": TABLE_FILE,
        "GROUP_INFO_FILE": os.path.join(GI_ROOT, "device6", "group_info.pb"),
        # launcher
        "LAUNCHER_RUN_DIR": RUN_DIR, "LAUNCHER_ATTEMPT": "1", "LAUNCHER_PHYSICAL_DEVICE_ID": "0",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.parametrize("server_index, expected_ranks", [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])])
def test_pytorch_rank_and_group_rank_per_server(server_index, expected_ranks):
    ctx = make_ctx(file_topology(server_index))
    envs = [env_for(ctx, i) for i in range(4)]
    assert [e["RANK"] for e in envs] == [str(r) for r in expected_ranks]
    assert [e["ROLE_RANK"] for e in envs] == [str(r) for r in expected_ranks]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["GROUP_RANK"] for e in envs} == {str(server_index)}
    assert {e["MASTER_ADDR"] for e in envs} == {"172.16.0.5"}  # server hosting rank 0, by pod address


def test_pytorch_master_addr_falls_back_to_server_id_and_follows_rank0():
    # rank 0 lives on the *second* server entry and there is no container_ip
    s0 = ServerEntry("10.0.0.7", (Device(2, 0), Device(3, 1)))
    s1 = ServerEntry("10.0.0.8", (Device(0, 0), Device(1, 1)))
    table = RankTable(servers=(s0, s1), source=TABLE_FILE)
    env = env_for(make_ctx(file_topology(0, table)), 0)
    assert env["MASTER_ADDR"] == "10.0.0.8"


def test_pytorch_master_addr_and_port_of_a_built_table():
    topo = dynamic_topology(0, master="192.168.9.9", port=23456)
    topo = Topology(topo.table, topo.server, topo.source, None, False, 23456)
    env = env_for(make_ctx(topo), 1)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("192.168.9.9", "23456")
    assert "RANK_TABLE_FILE" not in env  # built table: no file to point at


def test_restart_count_and_max_restarts_follow_attempt_and_budget():
    ctx = make_ctx(file_topology(0), max_restarts=17)
    env = env_for(ctx, 0, attempt=5)
    assert env["TORCHELASTIC_RESTART_COUNT"] == "5"
    assert env["LAUNCHER_ATTEMPT"] == "5"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "17"


def test_omp_num_threads_set_to_1_when_unset_and_several_local_ranks():
    env = env_for(make_ctx(file_topology(0), base_env={"PATH": "/bin"}), 0)
    assert env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("value", ["8", ""])
def test_omp_num_threads_left_alone_when_already_set(value):
    env = env_for(make_ctx(file_topology(0), base_env={"OMP_NUM_THREADS": value}), 0)
    assert "OMP_NUM_THREADS" not in env  # the spawned rank inherits the user's value


@pytest.mark.parametrize("value", ["0", "3"])
def test_nccl_async_error_handling_left_alone_when_already_set(value):
    env = env_for(make_ctx(file_topology(0), base_env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": value}), 0)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env  # torchrun too keeps the user's value


def test_omp_num_threads_not_set_with_a_single_local_rank():
    table = RankTable(servers=(ServerEntry("10.0.0.1", (Device(0, 3),)), ServerEntry("10.0.0.2", (Device(1, 3),))))
    env = env_for(make_ctx(file_topology(1, table)), 0)
    assert env["LOCAL_WORLD_SIZE"] == "1"
    assert "OMP_NUM_THREADS" not in env


# --------------------------------------------------------------------------- legacy Ascend variables

@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
def test_legacy_ascend_variables_for_every_framework(framework):
    ctx = make_ctx(file_topology(1), framework=framework, run_id="uid-1")
    envs = [env_for(ctx, i) for i in range(4)]
    assert [e["RANK_ID"] for e in envs] == ["4", "5", "6", "7"]
    assert [e["LAUNCHER_PHYSICAL_DEVICE_ID"] for e in envs] == ["1", "3", "0", "2"]  # the table's ids
    assert [e["DEVICE_ID"] for e in envs] == ["0", "1", "2", "3"]  # visibility unknown: the local index
    assert [e["ASCEND_DEVICE_ID"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    for e in envs:
        assert e["RANK_SIZE"] == "8"
        assert e["DEVICE_NUM"] == "4"
        assert e["SERVER_ID"] == "1"
        assert e["SERVER_NUM"] == "2"
        assert e["JOB_ID"] == "uid-1"
        assert e["RANK_TABLE_FILE"] == TABLE_FILE


def test_rank_table_file_only_for_a_file_table():
    assert "RANK_TABLE_FILE" not in env_for(make_ctx(dynamic_topology(0), "mindspore"), 0)
    topo = dynamic_topology(0)
    built_pt = Topology(topo.table, topo.server, "--nproc-per-node", None, False, 29500)
    assert "RANK_TABLE_FILE" not in env_for(make_ctx(built_pt), 0)
    assert env_for(make_ctx(file_topology(0)), 0)["RANK_TABLE_FILE"] == TABLE_FILE


def test_devices_per_server_may_differ():
    s0 = ServerEntry("a", (Device(0, 0), Device(1, 1)))
    s1 = ServerEntry("b", (Device(2, 0), Device(3, 1), Device(4, 2)))
    table = RankTable(servers=(s0, s1))
    env0 = env_for(make_ctx(file_topology(0, table)), 1)
    env1 = env_for(make_ctx(file_topology(1, table)), 2)
    assert (env0["DEVICE_NUM"], env0["LOCAL_WORLD_SIZE"], env0["RANK_SIZE"]) == ("2", "2", "5")
    assert (env1["DEVICE_NUM"], env1["LOCAL_WORLD_SIZE"], env1["RANK_SIZE"]) == ("3", "3", "5")
    assert (env1["RANK"], env1["RANK_ID"], env1["WORLD_SIZE"]) == ("4", "4", "5")


# --------------------------------------------------------------------------- tensorflow

def test_tensorflow_device_index_is_the_global_rank_not_device_id_plus_8_per_server():
    ctx = make_ctx(file_topology(1), framework="tensorflow")
    envs = [env_for(ctx, i) for i in range(4)]
    assert [e["DEVICE_INDEX"] for e in envs] == ["4", "5", "6", "7"]
    legacy = [str(int(e["LAUNCHER_PHYSICAL_DEVICE_ID"]) + 8 * 1) for e in envs]  # the defect-8 formula
    assert legacy == ["9", "11", "8", "10"]
    assert all(e["DEVICE_INDEX"] != old for e, old in zip(envs, legacy))
    assert [e["DEVICE_INDEX"] for e in envs] == [e["RANK_ID"] for e in envs]


def test_tensorflow_gets_no_torchrun_or_mindspore_variables():
    env = env_for(make_ctx(file_topology(0), framework="tensorflow"), 0)
    assert not set(TORCHRUN_VARS + MS_VARS + ("OMP_NUM_THREADS",)) & set(env)


def test_device_index_only_for_tensorflow():
    assert "DEVICE_INDEX" not in env_for(make_ctx(file_topology(0), "pytorch"), 0)
    assert "DEVICE_INDEX" not in env_for(make_ctx(file_topology(0), "mindspore"), 0)


# --------------------------------------------------------------------------- mindspore

def test_mindspore_with_a_rank_table_has_no_dynamic_cluster_variables_and_no_scheduler():
    ctx = make_ctx(file_topology(0), framework="mindspore")
    specs = worker_specs(ctx, ["python", "train.py"], 0)
    assert [s.role for s in specs] == [ROLE_WORKER] * 4
    for spec in specs:
        assert not set(MS_VARS) & set(spec.env)
        assert not set(TORCHRUN_VARS) & set(spec.env)
        assert spec.env["RANK_TABLE_FILE"] == TABLE_FILE


def test_mindspore_dynamic_cluster_scheduler_only_on_the_server_hosting_rank0():
    ctx0 = make_ctx(dynamic_topology(0), framework="mindspore", run_id="ms-job")
    ctx1 = make_ctx(dynamic_topology(1), framework="mindspore", run_id="ms-job")
    specs0 = worker_specs(ctx0, ["python", "net.py"], 2)
    specs1 = worker_specs(ctx1, ["python", "net.py"], 2)

    assert [(s.role, s.rank, s.local_rank, s.device_id) for s in specs0] == [
        (ROLE_SCHEDULER, SCHEDULER_RANK, -1, -1), (ROLE_WORKER, 0, 0, 0), (ROLE_WORKER, 1, 1, 1)]
    assert [(s.role, s.rank, s.local_rank, s.device_id) for s in specs1] == [
        (ROLE_WORKER, 2, 0, 0), (ROLE_WORKER, 3, 1, 1)]
    assert specs0[0].label == "scheduler"
    assert specs1[1].label == "rank 3"
    assert specs0[0].argv == ("python", "net.py")  # the scheduler runs the same user script

    sched = specs0[0].env
    assert sched == {
        "MS_ROLE": "MS_SCHED", "MS_SCHED_HOST": "10.1.1.1", "MS_SCHED_PORT": "8118", "MS_WORKER_NUM": "4",
        "MS_LOCAL_WORKER": "2", "MS_NODE_RANK": "0", "MS_SERVER_NUM": "0", "MS_TOPO_TIMEOUT": "600",
        "RANK_ID": "0", "RANK_SIZE": "4", "LAUNCHER_RUN_DIR": RUN_DIR, "LAUNCHER_ATTEMPT": "2", "JOB_ID": "ms-job",
        "PYTHONUNBUFFERED": "1",
    }


def test_mindspore_dynamic_cluster_worker_variables():
    ctx = make_ctx(dynamic_topology(1, nnodes=3, nproc=2, master="10.9.0.1", port=9100), framework="mindspore")
    workers = [s for s in worker_specs(ctx, ["python"], 0) if s.role == ROLE_WORKER]
    assert [s.env["MS_NODE_ID"] for s in workers] == ["2", "3"]  # node_rank * local_worker_num + i
    assert [s.env["RANK_ID"] for s in workers] == ["2", "3"]
    assert [s.env["LOCAL_RANK"] for s in workers] == ["0", "1"]
    assert [s.env["DEVICE_ID"] for s in workers] == ["0", "1"]
    for s in workers:
        assert s.env["MS_ROLE"] == "MS_WORKER"
        assert s.env["MS_WORKER_NUM"] == "6"
        assert s.env["MS_LOCAL_WORKER"] == "2"
        assert s.env["MS_NODE_RANK"] == "1"
        assert s.env["MS_SCHED_HOST"] == "10.9.0.1"
        assert s.env["MS_SCHED_PORT"] == "9100"
        assert s.env["MS_SERVER_NUM"] == "0"
        assert s.env["RANK_SIZE"] == "6"
        assert "RANK_TABLE_FILE" not in s.env
        assert not set(TORCHRUN_VARS) & set(s.env)


def test_mindspore_topo_timeout_taken_from_the_launcher_environment():
    ctx = make_ctx(dynamic_topology(0), framework="mindspore", base_env={"MS_TOPO_TIMEOUT": "60"})
    specs = worker_specs(ctx, ["x"], 0)
    assert {s.env["MS_TOPO_TIMEOUT"] for s in specs} == {"60"}


def test_scheduler_env_gets_context_extra_and_msruns_rank_variables():
    ctx = make_ctx(dynamic_topology(0), framework="mindspore", extra={"LAUNCHER_GRACEFUL_EXIT_FILE": "/g.json"})
    env = scheduler_env(ctx, 0)
    assert env["LAUNCHER_GRACEFUL_EXIT_FILE"] == "/g.json"
    # msrun: "For Scheduler, 'RANK_ID' is always 0" (process_entity/_api.py), and RANK_SIZE is exported.
    assert (env["RANK_ID"], env["RANK_SIZE"]) == ("0", env["MS_WORKER_NUM"])
    assert not {"DEVICE_ID", "LOCAL_RANK", "MS_NODE_ID", "RANK_TABLE_FILE"} & set(env)


# --------------------------------------------------------------------------- group info, HCCL_IF_IP

@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
def test_no_group_info_file_unless_a_group_info_root_is_given(framework):
    # MindSpore reads GROUP_INFO_FILE as "semi-auto parallel restore": a data-parallel job then fails.
    ctx = dataclasses.replace(make_ctx(file_topology(0), framework), group_info_root=None)
    assert not any("GROUP_INFO_FILE" in s.env for s in worker_specs(ctx, ["x"], 0))


@pytest.mark.parametrize("server_index, local_rank, rank", [(0, 0, 0), (0, 3, 3), (1, 1, 5)])
def test_group_info_file_uses_the_global_rank_id(server_index, local_rank, rank):
    env = env_for(make_ctx(file_topology(server_index)), local_rank)
    assert env["GROUP_INFO_FILE"] == f"{GI_ROOT}/device{rank}/group_info.pb"
    assert env["RANK_ID"] == str(rank)


@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
@pytest.mark.parametrize("base_env, local, expected", [
    ({"XDL_IP": "10.0.0.1", "POD_IP": "10.0.0.1"}, (), "10.0.0.1"),  # hostNetwork: pod IP = node IP
    ({"XDL_IP": "10.0.0.1"}, ("127.0.0.1", "10.0.0.1"), "10.0.0.1"),  # no POD_IP, node IP is ours
    ({"XDL_IP": "10.0.0.1", "POD_IP": "172.16.0.5"}, ("172.16.0.5",), None),  # pod networking
    ({"XDL_IP": "10.0.0.1"}, ("172.16.0.5",), None),  # the node IP is no address of this container
    ({"XDL_IP": ""}, (), None),
    ({"POD_IP": "172.16.0.5"}, ("172.16.0.5",), None),
])
def test_hccl_if_ip_from_xdl_ip_only_with_host_networking(framework, base_env, local, expected):
    ctx = dataclasses.replace(make_ctx(file_topology(0), framework, base_env=base_env), local_addresses=local)
    assert env_for(ctx, 0).get("HCCL_IF_IP") == expected


@pytest.mark.parametrize("hccl_if_ip", [None, "10.9.9.9"])
def test_an_operators_hccl_if_ip_is_inherited_never_replaced(hccl_if_ip):
    base = {"HCCL_IF_IP": "192.168.1.1", "XDL_IP": "10.0.0.1", "POD_IP": "10.0.0.1"}
    ctx = dataclasses.replace(make_ctx(file_topology(0), base_env=base), hccl_if_ip=hccl_if_ip)
    assert "HCCL_IF_IP" not in env_for(ctx, 0)  # the rank inherits 192.168.1.1


def test_hccl_if_ip_when_asked_for():
    base = {"XDL_IP": "10.0.0.1", "POD_IP": "172.16.0.5"}
    ctx = dataclasses.replace(make_ctx(file_topology(0), base_env=base), hccl_if_ip="172.16.0.5")
    assert env_for(ctx, 0)["HCCL_IF_IP"] == "172.16.0.5"


# --------------------------------------------------------------------------- device ids

def visible_ctx(visible, server_index: int = 1, framework: str = "pytorch") -> EnvContext:
    return dataclasses.replace(make_ctx(file_topology(server_index), framework), visible_devices=visible)


def test_device_id_is_the_logical_id_among_the_visible_npus():
    # server 1 drives physical NPUs 1, 3, 0, 2 (ranks 4..7); the container sees 0-3
    envs = [env_for(visible_ctx((0, 1, 2, 3)), i) for i in range(4)]
    assert [e["DEVICE_ID"] for e in envs] == ["1", "3", "0", "2"]
    assert [e["ASCEND_DEVICE_ID"] for e in envs] == ["1", "3", "0", "2"]
    assert [e["LAUNCHER_PHYSICAL_DEVICE_ID"] for e in envs] == ["1", "3", "0", "2"]


def test_a_container_given_npus_1_3_5_7_sees_them_as_0_to_3():
    s0 = ServerEntry("10.0.0.1", (Device(0, 1), Device(1, 3), Device(2, 5), Device(3, 7)))
    ctx = dataclasses.replace(make_ctx(file_topology(0, RankTable(servers=(s0,), source=TABLE_FILE))),
                              visible_devices=(1, 3, 5, 7))
    envs = [env_for(ctx, i) for i in range(4)]
    assert [e["DEVICE_ID"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LAUNCHER_PHYSICAL_DEVICE_ID"] for e in envs] == ["1", "3", "5", "7"]


def test_a_built_table_numbers_logical_ids_and_maps_them_to_the_visible_npus():
    ctx = dataclasses.replace(make_ctx(dynamic_topology(0), "mindspore"), visible_devices=(4, 6))
    workers = [s for s in worker_specs(ctx, ["x"], 0) if s.role == ROLE_WORKER]
    assert [s.env["DEVICE_ID"] for s in workers] == ["0", "1"]
    assert [s.env["LAUNCHER_PHYSICAL_DEVICE_ID"] for s in workers] == ["4", "6"]


def test_a_built_table_without_npus_physical_is_the_local_index():
    workers = [s for s in worker_specs(make_ctx(dynamic_topology(1), "mindspore"), ["x"], 0)]
    assert [(s.env["DEVICE_ID"], s.env["LAUNCHER_PHYSICAL_DEVICE_ID"]) for s in workers] == [("0", "0"), ("1", "1")]


def test_rank_table_npus_the_container_does_not_see_are_refused():
    with pytest.raises(UsageError) as exc:
        check_visible_devices(visible_ctx((0, 1, 2)))  # physical 3 (rank 5) missing
    assert "visible: 0,1,2" in exc.value.message
    assert exc.value.problems[0] == "rank 5: device_id 3"


@pytest.mark.parametrize("visible", [None, (0, 1, 2, 3), (0, 1, 2, 3, 4, 5, 6, 7)])
def test_rank_table_npus_all_visible_or_visibility_unknown_pass(visible):
    check_visible_devices(visible_ctx(visible))


def test_built_tables_are_never_refused_for_visibility():
    check_visible_devices(dataclasses.replace(make_ctx(dynamic_topology(1)), visible_devices=(7,)))


# --------------------------------------------------------------------------- unbuffered output

@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
def test_every_rank_and_the_scheduler_run_unbuffered(framework):
    topo = dynamic_topology(0) if framework == "mindspore" else file_topology(0)
    specs = worker_specs(make_ctx(topo, framework), ["python", "t.py"], 0)
    assert {s.env["PYTHONUNBUFFERED"] for s in specs} == {"1"}


@pytest.mark.parametrize("value", ["", "0", "x"])
def test_a_users_pythonunbuffered_is_inherited(value):
    specs = worker_specs(make_ctx(dynamic_topology(0), "mindspore", base_env={"PYTHONUNBUFFERED": value}), ["x"], 0)
    assert not any("PYTHONUNBUFFERED" in s.env for s in specs)


# --------------------------------------------------------------------------- derived run id

def test_every_node_of_a_rank_table_job_derives_the_same_run_id():
    ids = {derived_run_id(file_topology(i), ["python", "train.py"]) for i in (0, 1)}
    assert len(ids) == 1 and ids.pop().startswith("job-")


def test_every_node_of_a_built_table_job_derives_the_same_run_id():
    ids = {derived_run_id(dynamic_topology(i, nnodes=3), ["python", "t.py"]) for i in range(3)}
    assert len(ids) == 1


@pytest.mark.parametrize("other", [
    lambda: derived_run_id(file_topology(0), ["python", "other.py"]),
    lambda: derived_run_id(file_topology(0, RankTable(servers=two_server_table().servers[:1], source=TABLE_FILE)),
                           ["python", "train.py"]),
    lambda: derived_run_id(dynamic_topology(0), ["python", "train.py"]),
    lambda: derived_run_id(dynamic_topology(0, port=9000), ["python", "train.py"]),
])
def test_a_different_job_derives_a_different_run_id(other):
    assert other() != derived_run_id(file_topology(0), ["python", "train.py"])



def test_the_run_id_is_the_same_digest_on_every_python(monkeypatch):
    """Pinned ids: a launcher must derive what the other nodes' launchers (any version, any Python,
    with CPython's own SHA-256 module or hashlib's) derive."""

    def ids():
        return (derived_run_id(dynamic_topology(0), ["python", "train.py"]),
                derived_run_id(file_topology(0), ["python", "train.py"]))

    assert ids() == ("job-fb2735332eda", "job-d208695f27c2")
    for name in ("_sha256", "_sha2"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails: hashlib's SHA-256
    assert ids() == ("job-fb2735332eda", "job-d208695f27c2")


# --------------------------------------------------------------------------- extra / per-rank overrides

def test_extra_goes_to_every_rank_and_per_rank_overrides_everything():
    ctx = make_ctx(file_topology(1), extra={"LAUNCHER_GRACEFUL_EXIT_FILE": "/g.json", "MASTER_PORT": "1"})
    per_rank = {6: {"RESTORE_RANKS": "0,4", "TORCHELASTIC_ERROR_FILE": "/err/6.json", "RANK": "99",
                    "LAUNCHER_GRACEFUL_EXIT_FILE": "/other.json"}}
    specs = worker_specs(ctx, ["true"], 0, per_rank)
    by_rank = {s.rank: s.env for s in specs}
    assert by_rank[6]["RESTORE_RANKS"] == "0,4"
    assert by_rank[6]["TORCHELASTIC_ERROR_FILE"] == "/err/6.json"
    assert by_rank[6]["RANK"] == "99"
    assert by_rank[6]["LAUNCHER_GRACEFUL_EXIT_FILE"] == "/other.json"
    for rank in (4, 5, 7):
        assert "RESTORE_RANKS" not in by_rank[rank]
        assert by_rank[rank]["RANK"] == str(rank)
        assert by_rank[rank]["LAUNCHER_GRACEFUL_EXIT_FILE"] == "/g.json"
    assert {e["MASTER_PORT"] for e in by_rank.values()} == {"1"}  # extra overrides computed values


def test_build_rank_env_per_rank_argument():
    ctx = make_ctx(file_topology(0))
    env = env_for(ctx, 1, per_rank={"DEVICE_ID": "7", "NEW": "x"})
    assert (env["DEVICE_ID"], env["NEW"], env["ASCEND_DEVICE_ID"]) == ("7", "x", "1")


# --------------------------------------------------------------------------- worker_specs

def test_worker_specs_one_per_local_device_in_order():
    ctx = make_ctx(file_topology(1))
    specs = worker_specs(ctx, ["python", "train.py", "--lr", "0.1"], 0)
    assert all(isinstance(s, WorkerSpec) for s in specs)
    assert [(s.rank, s.local_rank, s.device_id, s.role) for s in specs] == [
        (4, 0, 1, ROLE_WORKER), (5, 1, 3, ROLE_WORKER), (6, 2, 0, ROLE_WORKER), (7, 3, 2, ROLE_WORKER)]
    assert {s.argv for s in specs} == {("python", "train.py", "--lr", "0.1")}
    assert [s.label for s in specs] == ["rank 4", "rank 5", "rank 6", "rank 7"]
    assert [s.env["LAUNCHER_PHYSICAL_DEVICE_ID"] for s in specs] == [str(s.device_id) for s in specs]


def test_worker_specs_attempt_is_propagated():
    specs = worker_specs(make_ctx(file_topology(0)), ["true"], 4)
    assert {s.env["TORCHELASTIC_RESTART_COUNT"] for s in specs} == {"4"}
    assert {s.env["LAUNCHER_ATTEMPT"] for s in specs} == {"4"}


def test_no_scheduler_for_pytorch_even_on_a_built_table():
    topo = dynamic_topology(0)
    topo = Topology(topo.table, topo.server, topo.source, None, False, 29500)
    assert [s.role for s in worker_specs(make_ctx(topo), ["x"], 0)] == [ROLE_WORKER, ROLE_WORKER]


# --------------------------------------------------------------------------- purity

@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
def test_same_inputs_same_outputs_and_inputs_not_mutated(framework):
    base = {"XDL_IP": "10.0.0.2", "PATH": "/usr/bin", "MS_TOPO_TIMEOUT": "30"}
    extra = {"E": "1"}
    per_rank = {5: {"P": "2"}}
    topo = dynamic_topology(0) if framework == "mindspore" else file_topology(1)
    ctx = make_ctx(topo, framework=framework, base_env=base, extra=extra)
    snapshot = (copy.deepcopy(base), copy.deepcopy(extra), copy.deepcopy(per_rank))
    first = worker_specs(ctx, ["python", "a.py"], 1, per_rank)
    first[0].env["JOB_ID"] = "mutated by the caller"  # returned dicts are fresh each call
    second = worker_specs(ctx, ["python", "a.py"], 1, per_rank)
    third = worker_specs(ctx, ["python", "a.py"], 1, per_rank)
    assert second == third
    assert second[0].env["JOB_ID"] == "job-42"
    assert (base, extra, per_rank) == snapshot
    assert "OMP_NUM_THREADS" not in base and "HCCL_IF_IP" not in base


def test_build_rank_env_is_deterministic_and_does_not_touch_os_environ(monkeypatch):
    monkeypatch.setenv("XDL_IP", "10.99.99.99")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ctx = make_ctx(file_topology(0), base_env={})
    before = dict(os.environ)
    a = env_for(ctx, 0)
    b = env_for(ctx, 0)
    assert a == b
    assert "HCCL_IF_IP" not in a  # reads ctx.base_env only, never os.environ
    assert dict(os.environ) == before


# --------------------------------------------------------------------------- invariants (hypothesis)

@st.composite
def tables(draw) -> Tuple[RankTable, int]:
    counts: List[int] = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    servers = []
    next_rank = 0
    for n, count in enumerate(counts):
        physical: Sequence[int] = draw(st.permutations(range(8)))[:count]
        devices = tuple(Device(next_rank + i, physical[i]) for i in range(count))
        next_rank += count
        servers.append(ServerEntry(f"10.0.{n}.1", devices, container_ip=f"172.16.{n}.1"))
    index = draw(st.integers(0, len(counts) - 1))
    return RankTable(servers=tuple(servers), source=TABLE_FILE), index


@settings(max_examples=60, deadline=None, database=None)
@given(tables(), st.sampled_from(["pytorch", "mindspore", "tensorflow"]), st.integers(0, 5))
def test_invariants_over_random_table_shapes(table_and_index, framework, attempt):
    table, index = table_and_index
    ctx = make_ctx(file_topology(index, table), framework=framework)
    specs = worker_specs(ctx, ["x"], attempt)
    server = table.servers[index]
    world = sum(len(s.devices) for s in table.servers)
    n = len(server.devices)

    assert len(specs) == n
    rank_ids = [s.env["RANK_ID"] for s in specs]
    assert len(set(rank_ids)) == n
    assert rank_ids == [str(d.rank_id) for d in server.devices]
    assert [s.env["LOCAL_RANK"] for s in specs] == [str(i) for i in range(n)]
    assert [s.env["LAUNCHER_PHYSICAL_DEVICE_ID"] for s in specs] == [str(d.device_id) for d in server.devices]
    assert [s.env["DEVICE_ID"] for s in specs] == [s.env["LOCAL_RANK"] for s in specs]
    assert {s.env["RANK_SIZE"] for s in specs} == {str(world)}
    assert {s.env["DEVICE_NUM"] for s in specs} == {str(n)}
    assert {s.env["SERVER_ID"] for s in specs} == {str(index)}
    assert {s.env["SERVER_NUM"] for s in specs} == {str(len(table.servers))}
    for s in specs:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.env.items())
        assert s.env["GROUP_INFO_FILE"] == f"{GI_ROOT}/device{s.env['RANK_ID']}/group_info.pb"
    if framework == "pytorch":
        assert {s.env["WORLD_SIZE"] for s in specs} == {str(world)}
        assert [s.env["RANK"] for s in specs] == rank_ids
        assert {s.env["LOCAL_WORLD_SIZE"] for s in specs} == {str(n)}
        assert {s.env["MASTER_ADDR"] for s in specs} == {"172.16.0.1"}
    if framework == "tensorflow":
        assert [s.env["DEVICE_INDEX"] for s in specs] == rank_ids


@settings(max_examples=30, deadline=None, database=None)
@given(st.integers(1, 4), st.integers(1, 4))
def test_dynamic_cluster_node_ids_cover_the_world_exactly_once(nnodes, nproc):
    seen: List[str] = []
    schedulers = 0
    for node in range(nnodes):
        specs = worker_specs(make_ctx(dynamic_topology(node, nnodes, nproc), "mindspore"), ["x"], 0)
        schedulers += sum(s.role == ROLE_SCHEDULER for s in specs)
        workers = [s for s in specs if s.role == ROLE_WORKER]
        assert [s.env["MS_NODE_ID"] for s in workers] == [str(node * nproc + i) for i in range(nproc)]
        seen.extend(s.env["MS_NODE_ID"] for s in workers)
    assert schedulers == 1
    assert sorted(seen, key=int) == [str(r) for r in range(nnodes * nproc)]


# --------------------------------------------------------------------------- the rendezvous host


def test_global_rank_0_of_a_torch_job_serves_the_store_at_master_port():
    specs0 = worker_specs(make_ctx(file_topology(0, port=29611)), ["python", "train.py"], 1)
    specs1 = worker_specs(make_ctx(file_topology(1, port=29611)), ["python", "train.py"], 1)
    assert [(s.rank, s.serves) for s in specs0] == [(0, 29611)] + [(s.rank, None) for s in specs0[1:]]
    assert all(s.serves is None for s in specs1)  # the server without global rank 0 hosts nothing


def test_mindspores_scheduler_serves_the_rendezvous_and_its_workers_nothing():
    """Its workers register with it at MS_SCHED_PORT and retry 0.5 s later when it is not listening yet."""
    ctx = make_ctx(dynamic_topology(0), framework="mindspore")
    specs = worker_specs(ctx, ["python", "net.py"], 0)
    [scheduler] = [s for s in specs if s.role == "scheduler"]
    assert scheduler.serves == int(scheduler.env["MS_SCHED_PORT"]) > 0
    assert all(s.serves is None for s in specs if s is not scheduler)


@pytest.mark.parametrize("env", [
    {"RANK": "1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "False"},
    {"RANK": "0", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"},  # an agent hosts it
    {"RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "False"},
    *({"RANK": "0", "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "False"}
      for port in ("", "0", "65536", "-1", " 29500", "２９５００", "²", "29500x")),
    {"MS_ROLE": "MS_WORKER", "MS_SCHED_PORT": "8118"},
    {"MS_ROLE": "MS_SCHED", "MS_SCHED_PORT": "x"},
    {"MS_ROLE": "MS_SCHED", "RANK": "0", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "False"},
])
def test_no_rendezvous_port_without_a_host_at_a_usable_port(env):
    assert rendezvous_port(env) is None


@given(st.dictionaries(st.sampled_from(["RANK", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "MS_ROLE",
                                        "MS_SCHED_PORT"]), st.text()))
def test_rendezvous_port_never_raises(env):
    port = rendezvous_port(env)
    assert port is None or 0 < port < 65536
