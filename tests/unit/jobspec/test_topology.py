"""Unit tests for ``launcher.jobspec.topology``: where the ranks come from and which server is this one."""

import pytest
from hypothesis import given, settings, strategies as st

from launcher.jobspec import topology
from launcher.common.errors import UsageError
from launcher.jobspec.options import RunOptions
from launcher.jobspec.runspec import ClusterSpec, cluster_spec
from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry
from launcher.jobspec.ranktable.generate import build_local_table
from launcher.jobspec.topology import Topology, locate_server, rank_table_path, regroup, resolve


_REAL_HOST_ADDRESSES = topology.host_addresses


def opts(**kwargs) -> ClusterSpec:
    return cluster_spec(RunOptions(command=("true",), **kwargs))


@pytest.fixture
def default_table(tmp_path, monkeypatch):
    """Point the MindCluster default rank-table path at a tmp file (not created yet)."""
    path = tmp_path / "default" / "hccl.json"
    monkeypatch.setattr("launcher.jobspec.options.DEFAULT_RANK_TABLE", str(path))
    monkeypatch.setattr("launcher.jobspec.topology.DEFAULT_RANK_TABLE", str(path))
    return path


@pytest.fixture(autouse=True)
def no_host_lookup(monkeypatch):
    """Tests never look at the real host's interfaces unless they say so."""
    def fail():
        raise AssertionError("host_addresses() must not be consulted here")
    monkeypatch.setattr(topology, "host_addresses", fail)


def table3() -> RankTable:
    """Three servers whose addresses are prefixes of each other (10.0.0.1 / 10.0.0.11)."""
    return RankTable(servers=(
        ServerEntry("10.0.0.1", (Device(0, 0), Device(1, 1)), host_ip="10.0.0.1", container_ip="172.16.0.1"),
        ServerEntry("10.0.0.11", (Device(2, 0), Device(3, 1)), host_ip="192.168.0.11", container_ip="172.16.0.11"),
        ServerEntry("10.0.0.2", (Device(4, 0), Device(5, 1)), container_ip="172.16.0.2"),
    ), source="/cfg/hccl.json")


def message(exc_info) -> str:
    return "\n".join(exc_info.value.lines())


# --------------------------------------------------------------------------- rank_table_path

def test_rank_table_option_wins_over_env_and_default(default_table):
    default_table.parent.mkdir()
    default_table.write_text("{}")
    env = {"RANK_TABLE_FILE": "/env/hccl.json"}
    assert rank_table_path(opts(rank_table="/opt/hccl.json"), env) == "/opt/hccl.json"


def test_rank_table_option_wins_even_with_nproc_per_node(default_table):
    assert rank_table_path(opts(rank_table="/opt/hccl.json", nproc_per_node=2), {}) == "/opt/hccl.json"


def test_env_wins_over_default(default_table):
    default_table.parent.mkdir()
    default_table.write_text("{}")
    assert rank_table_path(opts(), {"RANK_TABLE_FILE": "/env/hccl.json"}) == "/env/hccl.json"


def test_default_path_used_only_when_it_exists(default_table):
    assert rank_table_path(opts(), {}) is None
    default_table.parent.mkdir()
    default_table.write_text("{}")
    assert rank_table_path(opts(), {}) == str(default_table)
    assert rank_table_path(opts(), {"RANK_TABLE_FILE": ""}) == str(default_table)  # empty = unset


def test_nproc_per_node_disables_env_and_default_lookup(default_table):
    default_table.parent.mkdir()
    default_table.write_text("{}")
    assert rank_table_path(opts(nproc_per_node=2), {"RANK_TABLE_FILE": "/env/hccl.json"}) is None
    assert rank_table_path(opts(nproc_per_node=2), {}) is None


# --------------------------------------------------------------------------- resolve: --nproc-per-node

@pytest.mark.parametrize("framework, dynamic", [("pytorch", False), ("mindspore", True), ("tensorflow", False)])
def test_nproc_per_node_single_local_node_by_default(framework, dynamic, monkeypatch):
    monkeypatch.setattr("launcher.jobspec.topology.free_port", lambda host: 40123 if host == "127.0.0.1" else None)
    port = 40123
    topo = resolve(opts(nproc_per_node=4), framework, {})
    assert isinstance(topo, Topology)
    assert topo.table.world_size == 4
    assert topo.table.server_count == 1
    assert topo.server_index == 0
    assert topo.server.ranks == (0, 1, 2, 3)
    assert [d.device_id for d in topo.server.devices] == [0, 1, 2, 3]
    assert topo.table.master_addr == "127.0.0.1"
    assert topo.master_port == port
    assert topo.table_file is None
    assert topo.dynamic_cluster is dynamic
    assert topo.hosts_rank0 is True
    assert topo.source == "--nproc-per-node"


def test_nproc_per_node_with_nnodes_and_node_rank():
    topo = resolve(opts(nproc_per_node=4, nnodes=3, node_rank=2, master_addr="10.1.0.1", master_port=1234),
                   "pytorch", {})
    assert topo.table.world_size == 12
    assert topo.table.server_count == 3
    assert topo.server_index == 2
    assert topo.server.ranks == (8, 9, 10, 11)
    assert topo.hosts_rank0 is False
    assert (topo.table.master_addr, topo.master_port) == ("10.1.0.1", 1234)


@pytest.mark.parametrize("node_rank, nnodes", [(1, 1), (3, 2), (5, 5)])
def test_node_rank_not_below_nnodes_is_a_usage_error(node_rank, nnodes):
    with pytest.raises(UsageError) as exc:
        resolve(opts(nproc_per_node=2, nnodes=nnodes, node_rank=node_rank), "pytorch", {})
    assert "--node-rank" in message(exc) and "--nnodes" in message(exc)
    assert exc.value.exit_code == 2


def test_nproc_per_node_ignores_operator_env_shape_but_uses_its_master():
    env = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "1", "MASTER_ADDR": "10.3.3.3",
           "MASTER_PORT": "4444"}
    topo = resolve(opts(nproc_per_node=2), "pytorch", env)
    assert topo.table.world_size == 2
    assert topo.server_index == 0
    assert (topo.table.master_addr, topo.master_port) == ("10.3.3.3", 4444)


def test_options_beat_env_master():
    env = {"MASTER_ADDR": "10.3.3.3", "MASTER_PORT": "4444"}
    topo = resolve(opts(nproc_per_node=1, master_addr="10.4.4.4", master_port=5555), "pytorch", env)
    assert (topo.table.master_addr, topo.master_port) == ("10.4.4.4", 5555)


def test_mindspore_master_from_ms_sched_host_not_master_addr():
    env = {"MASTER_ADDR": "10.3.3.3", "MASTER_PORT": "4444", "MS_SCHED_HOST": "10.5.5.5", "MS_SCHED_PORT": "9999"}
    topo = resolve(opts(nproc_per_node=1), "mindspore", env)
    assert (topo.table.master_addr, topo.master_port) == ("10.5.5.5", 9999)
    pt = resolve(opts(nproc_per_node=1), "pytorch", env)
    assert (pt.table.master_addr, pt.master_port) == ("10.3.3.3", 4444)


# --------------------------------------------------------------------------- resolve: operator env

def test_pytorch_operator_env_rank_is_the_node_index():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "1", "MASTER_ADDR": "job-master-0",
           "MASTER_PORT": "23456"}
    topo = resolve(opts(), "pytorch", env)
    assert topo.table.world_size == 8
    assert topo.table.server_count == 2
    assert topo.server_index == 1
    assert topo.server.ranks == (4, 5, 6, 7)
    assert (topo.table.master_addr, topo.master_port) == ("job-master-0", 23456)
    assert topo.dynamic_cluster is False
    assert topo.table_file is None
    assert "WORLD_SIZE" in topo.source


def test_tensorflow_uses_the_pytorch_operator_names():
    topo = resolve(opts(), "tensorflow", {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "RANK": "0"})
    assert (topo.table.world_size, topo.server_index, topo.master_port) == (2, 0, 29500)


def test_mindspore_operator_env():
    env = {"MS_WORKER_NUM": "6", "MS_LOCAL_WORKER": "2", "MS_NODE_RANK": "2", "MS_SCHED_HOST": "10.0.9.9",
           "MS_SCHED_PORT": "9123", "MS_ROLE": "MS_WORKER", "MS_SERVER_NUM": "0"}
    topo = resolve(opts(), "mindspore", env)
    assert topo.table.world_size == 6
    assert topo.server_index == 2
    assert topo.server.ranks == (4, 5)
    assert topo.dynamic_cluster is True
    assert topo.hosts_rank0 is False
    assert (topo.table.master_addr, topo.master_port) == ("10.0.9.9", 9123)
    assert "MS_WORKER_NUM" in topo.source


def test_mindspore_does_not_read_the_pytorch_names():
    with pytest.raises(UsageError) as exc:
        resolve(opts(), "mindspore", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "0"})
    assert "MS_WORKER_NUM" in message(exc)


@pytest.mark.parametrize("framework, env, names", [
    ("pytorch", {"WORLD_SIZE": "abc", "LOCAL_WORLD_SIZE": "4", "RANK": "0"}, ["WORLD_SIZE", "'abc'"]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "four", "RANK": "0"}, ["LOCAL_WORLD_SIZE"]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "1.0"}, ["RANK="]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "3", "RANK": "0"}, ["WORLD_SIZE=8", "LOCAL_WORLD_SIZE=3"]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "0", "RANK": "0"}, ["LOCAL_WORLD_SIZE=0"]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "2"}, ["RANK=2"]),
    ("pytorch", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "0", "MASTER_PORT": "http"},
     ["MASTER_PORT"]),
    ("mindspore", {"MS_WORKER_NUM": "x", "MS_LOCAL_WORKER": "1", "MS_NODE_RANK": "0"}, ["MS_WORKER_NUM"]),
    ("mindspore", {"MS_WORKER_NUM": "4", "MS_LOCAL_WORKER": "2", "MS_NODE_RANK": "2"}, ["MS_NODE_RANK=2"]),
    ("mindspore", {"MS_WORKER_NUM": "4", "MS_LOCAL_WORKER": "2", "MS_NODE_RANK": "0", "MS_SCHED_PORT": "p"},
     ["MS_SCHED_PORT"]),
])
def test_bad_operator_values_name_the_variable(framework, env, names):
    with pytest.raises(UsageError) as exc:
        resolve(opts(), framework, env)
    for name in names:
        assert name in message(exc)


@pytest.mark.parametrize("env, name", [
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "-1"}, "RANK=-1"),
    ({"WORLD_SIZE": "-4", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=-4"),
])
def test_negative_operator_values_name_the_variable(env, name):
    with pytest.raises(UsageError) as exc:
        resolve(opts(), "pytorch", env)
    assert name in message(exc)


@pytest.mark.parametrize("env", [{}, {"WORLD_SIZE": "8"}, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
                                 {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": ""}])
def test_no_source_of_ranks_is_a_usage_error(env):
    with pytest.raises(UsageError) as exc:
        resolve(opts(), "pytorch", env)
    text = message(exc)
    assert "no ranks to start" in text
    assert "--nproc-per-node" in text and "--rank-table" in text and "RANK_TABLE_FILE" in text
    assert exc.value.exit_code == 2


# --------------------------------------------------------------------------- resolve: with a table

def test_resolve_with_a_loaded_table():
    table = table3()
    topo = resolve(opts(), "pytorch", {"XDL_IP": "10.0.0.11"}, table)
    assert topo.server is table.servers[1]
    assert topo.server_index == 1
    assert topo.table_file == "/cfg/hccl.json"
    assert topo.source == "rank table /cfg/hccl.json"
    assert topo.dynamic_cluster is False
    assert topo.master_port == 29500


def test_resolve_with_table_is_never_a_dynamic_cluster_for_mindspore():
    topo = resolve(opts(), "mindspore", {"XDL_IP": "10.0.0.1"}, table3())
    assert topo.dynamic_cluster is False
    assert topo.master_port == 8118
    assert topo.hosts_rank0 is True


def test_resolve_with_table_port_precedence():
    env = {"XDL_IP": "10.0.0.1", "MASTER_PORT": "30001"}
    assert resolve(opts(), "pytorch", env, table3()).master_port == 30001
    assert resolve(opts(master_port=30002), "pytorch", env, table3()).master_port == 30002


# --------------------------------------------------------------------------- locate_server

def test_server_id_option_beats_xdl_ip_and_pod_ip():
    table = table3()
    env = {"XDL_IP": "10.0.0.1", "POD_IP": "172.16.0.2"}
    assert locate_server(table, "10.0.0.11", env) is table.servers[1]


def test_xdl_ip_beats_pod_ip():
    table = table3()
    assert locate_server(table, None, {"XDL_IP": "10.0.0.2", "POD_IP": "172.16.0.1"}) is table.servers[2]


def test_pod_ip_matches_container_ip():
    table = table3()
    assert locate_server(table, None, {"POD_IP": "172.16.0.11"}) is table.servers[1]


def test_host_ip_is_matched_too():
    table = table3()
    assert locate_server(table, "192.168.0.11", {}) is table.servers[1]


def test_host_addresses_are_the_last_resort(monkeypatch):
    table = table3()
    monkeypatch.setattr(topology, "host_addresses", lambda: ["127.0.0.1", "::1", "172.16.0.2"])
    assert locate_server(table, None, {"XDL_IP": "", "POD_IP": ""}) is table.servers[2]


@pytest.mark.parametrize("xdl_ip, index", [("10.0.0.1", 0), ("10.0.0.11", 1), ("10.0.0.2", 2)])
def test_exact_matching_prefixes_do_not_match(xdl_ip, index):
    # legacy defect 1: an unanchored grep made 10.0.0.1 also match 10.0.0.11
    table = table3()
    assert locate_server(table, None, {"XDL_IP": xdl_ip}) is table.servers[index]


@pytest.mark.parametrize("value", ["10.0.0", "10.0.0.", "0.0.1", "10.0.0.1 ", "10.0.0.111", "172.16.0"])
def test_no_match_is_a_usage_error_naming_the_candidates(value):
    with pytest.raises(UsageError) as exc:
        locate_server(table3(), None, {"XDL_IP": value})
    text = message(exc)
    assert "XDL_IP" in text and value in text
    assert "10.0.0.1/172.16.0.1" in text
    assert "10.0.0.11/192.168.0.11/172.16.0.11" in text
    assert "10.0.0.2/172.16.0.2" in text
    assert "--server-id" in text
    assert exc.value.exit_code == 2


def test_no_match_from_host_addresses(monkeypatch):
    monkeypatch.setattr(topology, "host_addresses", lambda: ["127.0.0.1", "10.9.9.9"])
    with pytest.raises(UsageError) as exc:
        locate_server(table3(), None, {})
    assert "this host's addresses" in message(exc)
    assert "10.9.9.9" in message(exc)


def test_several_matches_is_a_usage_error_naming_them(monkeypatch):
    monkeypatch.setattr(topology, "host_addresses", lambda: ["10.0.0.1", "172.16.0.2"])
    with pytest.raises(UsageError) as exc:
        locate_server(table3(), None, {})
    text = message(exc)
    assert "several servers" in text
    assert "10.0.0.1/172.16.0.1; 10.0.0.2/172.16.0.2" in text
    assert "10.0.0.11" not in text


def test_several_matches_on_one_node_name_the_pod_addresses():
    table = RankTable(servers=(
        ServerEntry("10.0.0.1", (Device(0, 0), Device(1, 1)), container_ip="172.16.0.5"),
        ServerEntry("10.0.0.1", (Device(2, 2), Device(3, 3)), container_ip="172.16.0.6"),
    ))
    with pytest.raises(UsageError) as exc:
        locate_server(table, None, {"XDL_IP": "10.0.0.1"})
    assert "172.16.0.5" in message(exc) and "172.16.0.6" in message(exc)


def test_pods_on_one_node_are_told_apart_by_server_id_option():
    table = RankTable(servers=(
        ServerEntry("10.0.0.1", (Device(0, 0),), container_ip="172.16.0.5"),
        ServerEntry("10.0.0.1", (Device(1, 1),), container_ip="172.16.0.6"),
    ))
    assert locate_server(table, "172.16.0.6", {"XDL_IP": "10.0.0.1"}) is table.servers[1]


def test_host_addresses_returns_unique_strings_without_scope_ids():
    result = _REAL_HOST_ADDRESSES()  # the real function; the autouse fixture only replaced the module attribute
    assert isinstance(result, list)
    assert len(result) == len(set(result))
    assert all(isinstance(a, str) and "%" not in a for a in result)


def test_xdl_ip_shared_by_two_pods_is_narrowed_by_pod_ip():
    """Two pods of the job on one node: XDL_IP matches both, POD_IP picks this one."""
    from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry

    table = RankTable(servers=(
        ServerEntry("10.0.0.1", (Device(0, 0), Device(1, 1)), container_ip="172.16.0.5"),
        ServerEntry("10.0.0.1", (Device(2, 0), Device(3, 1)), container_ip="172.16.0.6"),
    ))
    server = locate_server(table, None, {"XDL_IP": "10.0.0.1", "POD_IP": "172.16.0.6"})
    assert server.ranks == (2, 3)


def test_master_addr_option_overrides_a_file_table():
    """--master-addr is honoured with a rank table file too (the rank-0 server's table address
    may not be reachable, e.g. several launchers on one machine)."""
    from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry
    from launcher.jobspec.topology import resolve

    table = RankTable(servers=(ServerEntry("10.0.0.1", (Device(0, 0),)), ServerEntry("10.0.0.2", (Device(1, 0),))),
                      source="/x/hccl.json")
    topo = resolve(opts(server_id="10.0.0.2", master_addr="127.0.0.1"), "pytorch", {}, table)
    assert topo.table.master_addr == "127.0.0.1"
    assert resolve(opts(server_id="10.0.0.2"), "pytorch", {}, table).table.master_addr == "10.0.0.1"


# --------------------------------------------------------------------------- free port (issue #10.3)

def test_single_node_jobs_get_a_free_port_each():
    import socket

    first = resolve(opts(nproc_per_node=2), "pytorch", {}).master_port
    with socket.socket() as held:  # the port of a running job
        held.bind(("127.0.0.1", first))
        held.listen()
        second = resolve(opts(nproc_per_node=2), "mindspore", {}).master_port
    assert first != 29500 and second not in (first, 8118)


@pytest.mark.parametrize("framework, default", [("pytorch", 29500), ("mindspore", 8118)])
def test_multi_node_and_explicit_ports_keep_their_values(framework, default):
    assert resolve(opts(nproc_per_node=2, nnodes=2), framework, {}).master_port == default
    assert resolve(opts(nproc_per_node=2, master_port=1234), framework, {}).master_port == 1234
    env = {"MASTER_PORT": "2345", "MS_SCHED_PORT": "2345"}
    assert resolve(opts(nproc_per_node=2), framework, env).master_port == 2345


def test_free_port_on_a_foreign_address_falls_back_to_the_default():
    from launcher.jobspec.topology import free_port

    assert free_port("192.0.2.1") is None  # TEST-NET-1: never an address of this host
    assert resolve(opts(nproc_per_node=1, master_addr="192.0.2.1"), "pytorch", {}).master_port == 29500



@pytest.mark.parametrize("host", ["a..b", ".x", "a" * 64 + ".b"])
def test_a_master_address_that_is_no_host_name_is_a_usage_error_not_a_traceback(host):
    with pytest.raises(UsageError, match="is not a host name: label empty or too long"):
        resolve(opts(nproc_per_node=1, master_addr=host), "pytorch", {})
    with pytest.raises(UsageError, match="is not a host name"):
        resolve(opts(nproc_per_node=1), "pytorch", {"MASTER_ADDR": host})


_HOST_TEXT = st.text(st.sampled_from("ab9.-:é"), max_size=80) | st.builds(
    ".".join, st.lists(st.text("ab", min_size=0, max_size=70), max_size=4))


@settings(max_examples=300, deadline=None, database=None)
@given(_HOST_TEXT)
def test_free_ports_host_reaches_getaddrinfo_as_the_idna_codec_makes_it(host):
    """The bytes ``free_port`` hands ``getaddrinfo`` itself are the codec's; what the codec would
    refuse (an empty or long label) or change (not ASCII) still goes to the codec."""
    given_host = topology._idna_ascii(host)
    if isinstance(given_host, bytes):
        assert given_host == host.encode("idna")
    else:
        assert given_host == host
        if host.isascii():
            with pytest.raises(UnicodeError):
                host.encode("idna")

# -- regroup: elastic membership ---------------------------------------------------------------------
@given(nnodes=st.integers(1, 6), nproc=st.integers(1, 4), data=st.data())
def test_regroup_renumbers_the_kept_servers_contiguously(nnodes, nproc, data):
    table = build_local_table(nproc, nnodes=nnodes)
    own = data.draw(st.integers(0, nnodes - 1))
    kept = sorted(set(data.draw(st.lists(st.integers(0, nnodes - 1)))) | {own})
    topo = Topology(table, table.servers[own], "--nproc-per-node", "/t.json", False, 29500)
    new = regroup(topo, kept)
    assert new.table.world_size == len(kept) * nproc
    assert [d.rank_id for s in new.table.servers for d in s.devices] == list(range(len(kept) * nproc))
    assert [s.server_id for s in new.table.servers] == [f"node{i}" for i in kept]
    assert new.server_index == kept.index(own) and new.table_file is None
    assert [d.device_id for d in new.server.devices] == list(range(nproc))


def test_regroup_refuses_a_group_without_this_server():
    table = build_local_table(2, nnodes=3)
    topo = Topology(table, table.servers[2], "--nproc-per-node", None, False, 29500)
    with pytest.raises(ValueError):
        regroup(topo, [0, 1])


def test_regroup_keeps_the_master_while_its_server_is_kept():
    table = build_local_table(2, nnodes=3, master_addr="10.0.0.1", master_port=29400)
    topo = Topology(table, table.servers[2], "--nproc-per-node", None, False, 29400)
    new = regroup(topo, [0, 2], {0: "10.0.0.9", 2: "10.0.0.3"})
    assert (new.table.master_addr, new.master_port) == ("10.0.0.1", 29400)


def test_regroup_without_the_master_moves_it_to_the_new_rank_0_server():
    """The defect: MASTER_ADDR stayed the lost node's; now it is the registered address of node 1."""
    table = build_local_table(2, nnodes=3, master_addr="10.0.0.1", master_port=29400)
    topo = Topology(table, table.servers[2], "--nproc-per-node", None, False, 29400)
    new = regroup(topo, [1, 2], {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"})
    assert (new.table.master_addr, new.master_port) == ("10.0.0.2", 29400)
    assert 0 in new.table.servers[0].ranks and new.table.servers[0].server_id == "node1"


def test_regroup_of_a_file_table_without_registrations_uses_the_table_address():
    table = table3()
    topo = Topology(table, table.servers[2], "rank table", table.source, False, 29500)
    assert regroup(topo, [1, 2]).table.master_addr == "172.16.0.11"
    assert regroup(topo, [0, 2]).table.master_addr == "172.16.0.1"


def test_regroup_uses_the_endpoint_the_new_master_published_only_when_the_master_moved():
    table = build_local_table(2, nnodes=3, master_addr="10.0.0.1", master_port=29400)
    topo = Topology(table, table.servers[2], "--nproc-per-node", None, False, 29400)
    addresses = {1: "10.0.0.2", 2: "10.0.0.3"}
    assert topology.moved_master(topo, [1, 2], addresses) == (1, "10.0.0.2")
    assert topology.moved_master(topo, [0, 2], addresses) is None
    new = regroup(topo, [1, 2], addresses, ("10.0.0.2", 31000))
    assert (new.table.master_addr, new.master_port) == ("10.0.0.2", 31000)
    assert (regroup(topo, [0, 2], addresses, ("10.0.0.2", 31000)).master_port) == 29400


# -- the port of a master that moved: a bind test on its new host -------------------------------------
def test_master_port_kept_when_free():
    port = topology.free_port("127.0.0.1")
    assert topology.master_port_on("127.0.0.1", port) == (port, f"port {port} is free on 127.0.0.1")


@pytest.mark.parametrize("listen_on", ["127.0.0.1", "0.0.0.0"])
def test_master_port_taken_on_its_address_or_any_gets_another_free_one(listen_on):
    """Something listens on the port (on the master's address, or on every address: either keeps a
    TCPStore, which listens on every address, from binding it): another port, free, and why."""
    import socket

    with socket.socket() as listener:
        listener.bind((listen_on, 0))
        listener.listen()
        taken = listener.getsockname()[1]
        port, reason = topology.master_port_on("127.0.0.1", taken)
        assert port != taken and topology.port_in_use("127.0.0.1", port) is None
        assert reason == f"port {taken} is in use on 127.0.0.1 (Address already in use): took free port {port}"


def test_a_port_taken_on_another_address_of_the_host_blocks_the_store_too():
    """On one machine 127.0.0.2 is this host too: the store's wildcard bind would fail."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen()
        assert topology.port_in_use("127.0.0.3", listener.getsockname()[1]) == "Address already in use"


def test_master_port_of_an_address_not_on_this_host_checks_every_address():
    """A registered address that is not this host's (NAT, a name that resolves elsewhere): the
    wildcard bind alone decides."""
    port = topology.free_port("127.0.0.1")
    assert topology.port_in_use("192.0.2.1", port) is None
    assert topology.port_in_use("no-such-host.invalid", port) is None


@given(nnodes=st.integers(2, 6), nproc=st.integers(1, 3), data=st.data())
def test_regroup_master_is_the_host_of_new_rank_0_on_every_node(nnodes, nproc, data):
    """For any kept subset: the master is rank 0's server (the original master while it is kept),
    and every kept node computes the same address and port."""
    table = build_local_table(nproc, nnodes=nnodes, master_addr="10.1.0.0", master_port=29400)
    kept = sorted(set(data.draw(st.lists(st.integers(0, nnodes - 1), min_size=1))))
    addresses = {i: f"10.1.0.{i}" for i in range(nnodes)}
    masters = set()
    for own in kept:
        new = regroup(Topology(table, table.servers[own], "--nproc-per-node", None, False, 29400), kept, addresses)
        host = next(s for s in new.table.servers if 0 in s.ranks)
        assert new.table.master_addr == addresses[int(host.server_id[4:])]
        assert new.server.server_id == f"node{own}" and new.hosts_rank0 == (own == kept[0])
        masters.add((new.table.master_addr, new.master_port))
    assert masters == {(addresses[kept[0]], 29400)}


def test_advertised_address_of_a_built_table_and_of_a_file_table(monkeypatch):
    table = build_local_table(2, nnodes=2)
    built = Topology(table, table.servers[1], "--nproc-per-node", None, False, 29500)
    assert topology.advertised_address(built, {"XDL_IP": "10.0.0.2", "POD_IP": "172.16.0.2"}) == "172.16.0.2"
    assert topology.advertised_address(built, {"XDL_IP": "10.0.0.2"}) == "10.0.0.2"
    monkeypatch.setattr(topology.socket, "getfqdn", lambda: "node-b.example")
    assert topology.advertised_address(built, {}) == "node-b.example"
    filed = Topology(table3(), table3().servers[2], "rank table", "/cfg/hccl.json", False, 29500)
    assert topology.advertised_address(filed, {"XDL_IP": "10.0.0.2"}) == "172.16.0.2"
