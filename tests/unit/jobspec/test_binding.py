"""``--bind-cores``: the cpulist parser, the pure ``auto`` planner (properties) and sysfs reading (a fake root)."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from launcher.common.errors import UsageError
from launcher.jobspec import binding
from launcher.jobspec.binding import format_cpulist, parse_bind_cores, parse_cpulist, plan_auto, resolve


# -- cpulists ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, cpus", [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-1,8,10-11", {0, 1, 8, 10, 11}),
                                        (" 2 , 4-5", {2, 4, 5})])
def test_cpulist_parses_the_kernel_format(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "0-", "-1", "0,,1", "1;2", "0-99999"])
def test_malformed_cpulists_are_refused(text):
    with pytest.raises(ValueError):
        parse_cpulist(text)


@given(st.frozensets(st.integers(0, 300), min_size=1))
def test_format_and_parse_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_bind_cores_values():
    assert parse_bind_cores("auto") is None and parse_bind_cores("NONE") is None
    assert parse_bind_cores("0-3;4-7") == (frozenset(range(4)), frozenset(range(4, 8)))
    with pytest.raises(UsageError, match="not a CPU list"):
        parse_bind_cores("0-3;;4")


# -- the auto planner: properties ----------------------------------------------------------------------
@st.composite
def machines(draw):
    """A machine: NUMA nodes of consecutive CPUs, the allowed subset, and each local rank's device node."""
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    node_cpus, start = {}, 0
    for node, size in enumerate(sizes):
        node_cpus[node] = frozenset(range(start, start + size))
        start += size
    every = sorted(frozenset().union(*node_cpus.values()))
    allowed = frozenset(draw(st.lists(st.sampled_from(every), min_size=1, unique=True)))
    ranks = draw(st.integers(1, 10))
    known = draw(st.booleans())
    device_nodes = [draw(st.sampled_from(sorted(node_cpus))) if known else None for _ in range(ranks)]
    return allowed, device_nodes, node_cpus


@settings(max_examples=300)
@given(machines())
def test_auto_sets_are_disjoint_non_empty_and_allowed(machine):
    allowed, device_nodes, node_cpus = machine
    plan = plan_auto(allowed, device_nodes, node_cpus)
    if len(allowed) < len(device_nodes):
        assert plan is None
        return
    assert len(plan.sets) == len(device_nodes)
    assert all(plan.sets) and all(s <= allowed for s in plan.sets)
    assert sum(len(s) for s in plan.sets) == len(frozenset().union(*plan.sets))  # disjoint
    sizes = [len(s) for s in plan.sets]
    if plan.how == "even":
        assert frozenset().union(*plan.sets) == allowed and max(sizes) - min(sizes) <= 1
    if plan.how == "numa":
        assert frozenset().union(*plan.sets) == allowed


@settings(max_examples=300)
@given(machines())
def test_auto_gives_the_ranks_of_a_node_that_nodes_cpus(machine):
    allowed, device_nodes, node_cpus = machine
    plan = plan_auto(allowed, device_nodes, node_cpus)
    if plan is None or plan.how != "device":
        return
    for node in set(device_nodes):
        mine = [plan.sets[i] for i, n in enumerate(device_nodes) if n == node]
        assert frozenset().union(*mine) == node_cpus[node] & allowed  # covering within the node
        sizes = [len(s) for s in mine]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=200)
@given(machines())
def test_device_affinity_is_used_whenever_every_node_can_hold_its_ranks(machine):
    allowed, device_nodes, node_cpus = machine
    plan = plan_auto(allowed, device_nodes, node_cpus)
    fits = all(n is not None and len(node_cpus[n] & allowed) >= device_nodes.count(n) for n in device_nodes)
    if fits:
        assert plan is not None and plan.how == "device"


def test_auto_examples():
    nodes = {0: frozenset(range(0, 4)), 1: frozenset(range(4, 8))}
    every = frozenset(range(8))
    # Devices 0-1 on node 1, 2-3 on node 0 (the order of the sysfs answers, not of the ranks).
    plan = plan_auto(every, [1, 1, 0, 0], nodes)
    assert plan.how == "device" and [format_cpulist(s) for s in plan.sets] == ["4-5", "6-7", "0-1", "2-3"]
    assert [format_cpulist(s) for s in plan_auto(every, [None] * 4, nodes).sets] == ["0-1", "2-3", "4-5", "6-7"]
    assert [format_cpulist(s) for s in plan_auto(every, [None], nodes).sets] == ["0-7"]
    assert plan_auto(every, [None] * 3, {}).how == "even"
    # Both devices on node 0 with one allowed CPU there: no device plan, NUMA spread instead.
    assert plan_auto(frozenset({0, 4, 5}), [0, 0], nodes).how == "numa"
    assert plan_auto(frozenset({0}), [None, None], nodes) is None



GOLDEN = [json.loads(line) for line in (Path(__file__).resolve().parents[2] / "data" / "golden" / "binding.jsonl")
          .read_text().splitlines()]


@pytest.mark.parametrize("case", GOLDEN, ids=[f"binding-{i}" for i in range(len(GOLDEN))])
def test_auto_plans_as_recorded(case):
    """400 random machines (nodes without CPUs, unknown and foreign device nodes, fewer CPUs than ranks)
    and the plans the planner of commit abed7a9 made for them: a rewrite keeps every plan."""
    plan = plan_auto(frozenset(case["allowed"]), case["device_nodes"],
                     {int(n): frozenset(cpus) for n, cpus in case["node_cpus"].items()})
    assert (None if plan is None else {"how": plan.how, "sets": [format_cpulist(s) for s in plan.sets]}) == case["plan"]

# -- sysfs (a fake root) -------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sysfs(root: Path, nodes: dict, devices: dict, klass: str = "davinci") -> str:
    for node, cpulist in nodes.items():
        _write(root / binding.NODE_DIR / f"node{node}" / "cpulist", cpulist)
    _write(root / binding.NODE_DIR / "online", "0-%d" % (len(nodes) - 1))  # not a node directory
    for device, node in devices.items():
        _write(root / "class" / klass / f"davinci{device}" / "device" / "numa_node", str(node))
    return str(root)


def test_resolve_auto_reads_device_nodes_from_sysfs(tmp_path):
    root = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, {4: 1, 5: 1, 6: 0, 7: 0})
    plan = resolve("auto", [4, 5, 6, 7], root, allowed=frozenset(range(8)))
    assert plan.how == "device" and [format_cpulist(s) for s in plan.sets] == ["4-5", "6-7", "0-1", "2-3"]


def test_resolve_auto_reads_the_devdrv_class_too(tmp_path):
    root = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, {0: 1, 1: 0}, klass="devdrv-class")
    plan = resolve("auto", [0, 1], root, allowed=frozenset(range(8)))
    assert plan.how == "device" and [format_cpulist(s) for s in plan.sets] == ["4-7", "0-3"]


@pytest.mark.parametrize("numa_node", ["-1", "garbage", ""])
def test_an_unknown_device_node_falls_back_to_numa_spread(tmp_path, numa_node):
    root = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, {0: 0})
    _write(tmp_path / "class" / "davinci" / "davinci1" / "device" / "numa_node", numa_node)
    plan = resolve("auto", [0, 1], root, allowed=frozenset(range(8)))
    assert plan.how == "numa" and [format_cpulist(s) for s in plan.sets] == ["0-3", "4-7"]


def test_no_sysfs_at_all_splits_evenly(tmp_path):
    plan = resolve("auto", [0, 1, 2], str(tmp_path / "missing"), allowed=frozenset({2, 3, 5, 7}))
    assert plan.how == "even" and [format_cpulist(s) for s in plan.sets] == ["2-3", "5", "7"]


def test_resolve_none_and_list(tmp_path):
    assert resolve("none", [0, 1], str(tmp_path)) is None
    plan = resolve("0-1;2", [0, 1], str(tmp_path), allowed=frozenset(range(4)))
    assert plan.how == "list" and plan.cpus(0) == {0, 1} and plan.cpus(1) == {2} and plan.cpus(-1) is None
    with pytest.raises(UsageError, match=r"2 CPU list\(s\) for 3 local rank\(s\)"):
        resolve("0;1", [0, 1, 2], str(tmp_path), allowed=frozenset(range(4)))
    with pytest.raises(UsageError, match="CPU\\(s\\) 9 outside"):
        resolve("0;9", [0, 1], str(tmp_path), allowed=frozenset(range(4)))


def test_resolve_uses_this_process_affinity_by_default():
    import os

    plan = resolve("auto", [0], "/nonexistent")
    assert plan.sets == (frozenset(os.sched_getaffinity(0)),)


def test_pin_binds_a_running_process(tmp_path):
    import os
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        binding.pin(proc.pid, frozenset({cpu}))
        assert os.sched_getaffinity(proc.pid) == {cpu}
    finally:
        proc.communicate(b"")
    with pytest.raises(OSError):
        binding.pin(proc.pid, frozenset({cpu}))  # reaped: gone
