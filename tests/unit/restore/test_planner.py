"""Planning: breakpoint sources, periodic fallback, regressions of the vendor code, properties, scale."""

import json
import random
from typing import Dict, Iterable, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.restore import PlanInputs, build_plan, compute_plan
from launcher.restore.checkpoints import KIND_BREAKPOINT, KIND_PERIODIC, Checkpoint, ScanResult
from launcher.restore.faults import FaultReport
from launcher.restore.groups import ReplicaGroups, groups_from_layout, partition, singletons

Files = Dict[int, List[Tuple[str, int, int]]]  # rank -> [(kind, step, size)]


def faults(*ranks: int, trusted: bool = True) -> FaultReport:
    return FaultReport(frozenset(ranks), tuple((r, ("--fault-ranks",)) for r in sorted(ranks)),
                       (), trusted)


def make_scan(world: int, files: Files) -> ScanResult:
    per_rank = []
    for rank in range(world):
        items = []
        for kind, step, size in files.get(rank, []):
            suffix = "_breakpoint" if kind == KIND_BREAKPOINT else ""
            items.append(Checkpoint(rank, f"/ckpt/rank_{rank}/ckpt-0_{step}{suffix}.pt", kind, 0,
                                    step, size))
        per_rank.append(tuple(items))
    return ScanResult(tuple(per_rank))


def plan_for(world, groups, files, fault_set=faults()):
    if not isinstance(groups, ReplicaGroups):
        groups = ReplicaGroups(tuple(groups), "test")
    return build_plan(world, groups, fault_set, make_scan(world, files))


def everyone(world: int, kind: str, steps: Iterable[int], size: int = 100) -> Files:
    return {r: [(kind, s, size) for s in steps] for r in range(world)}


def test_breakpoint_picks_lowest_healthy_rank_per_group():
    groups = groups_from_layout(24, None, 8, None)  # {0,8,16}, {1,9,17}, ...
    plan = plan_for(24, groups, everyone(24, KIND_BREAKPOINT, [30]), faults(0, 9, 17))
    assert plan.kind == KIND_BREAKPOINT
    assert plan.restore_ranks == (1, 2, 3, 4, 5, 6, 7, 8)
    assert plan.restore_ranks_map["0,8,16"] == 8
    assert plan.restore_ranks_map["1,9,17"] == 1
    env = plan.env_for(16)
    assert env == {
        envnames.RESTORE_RANKS: "1,2,3,4,5,6,7,8",
        envnames.RESTORE_RANKS_MAP: json.dumps(plan.restore_ranks_map, separators=(",", ":")),
        envnames.LAUNCHER_RESUME_SOURCE_RANK: "8",
        envnames.LAUNCHER_RESUME_CHECKPOINT: "/ckpt/rank_8/ckpt-0_30_breakpoint.pt",
        envnames.LAUNCHER_RESUME_STEP: "30",
        envnames.LAUNCHER_RESUME_KIND: "breakpoint",
    }


def test_vendor_substring_bug_regression():
    # The vendor looked a rank up with `"1" in "0,10"`-style matching, so rank 1 could load rank 0's
    # checkpoint. Groups {0,10}, {1,11}, ...: rank 1 must get its own group's source.
    groups = tuple((r, r + 10) for r in range(10))
    plan = plan_for(20, groups, everyone(20, KIND_BREAKPOINT, [5]), faults(0))
    assert plan.env_for(1)[envnames.LAUNCHER_RESUME_SOURCE_RANK] == "1"
    assert plan.env_for(0)[envnames.LAUNCHER_RESUME_SOURCE_RANK] == "10"
    mapping = json.loads(plan.env_for(1)[envnames.RESTORE_RANKS_MAP])
    matching = [key for key in mapping if "1" in key.split(",")]
    assert matching == ["1,11"] and mapping["1,11"] == 1


def test_group_with_only_faulty_ranks_means_no_breakpoint():
    files = everyone(4, KIND_BREAKPOINT, [30])
    for rank in range(4):
        files[rank].append((KIND_PERIODIC, 20, 100))
    plan = plan_for(4, [(0, 2), (1, 3)], files, faults(1, 3))
    assert plan.kind == KIND_PERIODIC
    assert plan.env_for(0)[envnames.RESTORE_RANKS] == "-1"
    assert plan.env_for(0)[envnames.RESTORE_RANKS_MAP] == "{}"
    assert plan.env_for(3)[envnames.LAUNCHER_RESUME_STEP] == "20"
    assert any("{1,3} have no healthy rank" in w for w in plan.warnings)


def test_breakpoint_sizes_must_agree_within_group():
    files = {0: [(KIND_BREAKPOINT, 30, 100)], 1: [(KIND_BREAKPOINT, 30, 99)]}
    plan = plan_for(2, [(0, 1)], files)
    assert plan.kind == "none"
    assert any("differ in size" in w and "rank 1: 99 B" in w for w in plan.warnings)


def test_breakpoint_sizes_may_differ_between_groups():
    # Tensor-parallel shards differ in size; only replicas must match (the vendor compared all).
    files = {0: [(KIND_BREAKPOINT, 30, 100)], 1: [(KIND_BREAKPOINT, 30, 50)]}
    assert plan_for(2, [(0,), (1,)], files).kind == KIND_BREAKPOINT


def test_breakpoint_uses_newest_step_common_to_all_groups():
    files = {0: [(KIND_BREAKPOINT, 30, 1), (KIND_BREAKPOINT, 40, 1)], 1: [(KIND_BREAKPOINT, 30, 1)]}
    plan = plan_for(2, [(0,), (1,)], files)
    assert (plan.kind, plan.step) == (KIND_BREAKPOINT, 30)


def test_stale_breakpoint_loses_to_newer_periodic():
    files = {r: [(KIND_BREAKPOINT, 100, 1), (KIND_PERIODIC, 400, 2)] for r in range(2)}
    plan = plan_for(2, [(0, 1)], files)
    assert (plan.kind, plan.step) == (KIND_PERIODIC, 400)
    assert any("older than the periodic" in w for w in plan.warnings)


def test_untrusted_faults_disable_breakpoint():
    files = {r: [(KIND_BREAKPOINT, 30, 1), (KIND_PERIODIC, 20, 2)] for r in range(2)}
    plan = plan_for(2, [(0, 1)], files, faults(trusted=False))
    assert (plan.kind, plan.step) == (KIND_PERIODIC, 20)
    assert any("breakpoint restore disabled" in w for w in plan.warnings)


def test_periodic_one_rank_missing_newest_step():
    files = everyone(3, KIND_PERIODIC, [10, 20])
    files[2] = [(KIND_PERIODIC, 10, 100)]
    plan = plan_for(3, singletons(3), files)
    assert (plan.kind, plan.step) == (KIND_PERIODIC, 10)
    assert any("newest periodic checkpoints (epoch 0 step 20) are missing for replica groups {2}"
               in w for w in plan.warnings)


def test_periodic_replica_covers_missing_rank():
    files = everyone(4, KIND_PERIODIC, [10, 20])
    files[2] = [(KIND_PERIODIC, 10, 100)]
    plan = plan_for(4, [(0, 2), (1, 3)], files)
    assert (plan.kind, plan.step) == (KIND_PERIODIC, 20)
    assert plan.sources == (0, 1, 0, 3)
    assert plan.env_for(2)[envnames.LAUNCHER_RESUME_CHECKPOINT] == "/ckpt/rank_0/ckpt-0_20.pt"


def test_periodic_faulty_rank_prefers_healthy_replica():
    plan = plan_for(2, [(0, 1)], everyone(2, KIND_PERIODIC, [10]), faults(0))
    assert plan.sources == (1, 1)


def test_periodic_size_mismatch_needs_own_files():
    files = {0: [(KIND_PERIODIC, 10, 5), (KIND_PERIODIC, 20, 5)],
             1: [(KIND_PERIODIC, 10, 5), (KIND_PERIODIC, 20, 6)]}
    own = plan_for(2, [(0, 1)], files)
    assert (own.step, own.sources) == (20, (0, 1))
    files[2] = [(KIND_PERIODIC, 10, 5), (KIND_PERIODIC, 20, 7)]
    files[3] = [(KIND_PERIODIC, 10, 5)]
    fallback = plan_for(4, [(0, 1, 2, 3)], files)
    assert (fallback.step, fallback.sources) == (10, (0, 1, 2, 3))
    assert any("differ in size" in w for w in fallback.warnings)


def test_nothing_to_resume_from():
    plan = plan_for(3, singletons(3), {})
    assert plan.kind == "none"
    assert all(plan.env_for(r) == {} for r in range(3))
    no_dir = build_plan(3, ReplicaGroups(singletons(3), "t"), faults(), None)
    assert no_dir.kind == "none" and no_dir.reason == "no checkpoint directory given"


def test_oversized_env_values_shrink_to_own_group():
    world = 12000  # singleton groups: the whole-world map is ~150 KB, over Linux's 128 KiB
    plan = plan_for(world, singletons(world), everyone(world, KIND_BREAKPOINT, [1], 1))
    assert not plan.full_env_maps
    assert plan.env_for(11111)[envnames.RESTORE_RANKS_MAP] == '{"11111":11111}'
    assert plan.env_for(11111)[envnames.RESTORE_RANKS] == "11111"
    assert any("per-variable limit" in w for w in plan.warnings)


def test_compute_plan_end_to_end(tmp_path):
    for rank in range(4):
        directory = tmp_path / "ckpt" / f"rank_{rank}"
        directory.mkdir(parents=True)
        (directory / "net-1_5.ckpt").write_bytes(b"p" * 10)
        if rank != 2:
            (directory / "net-1_7_breakpoint.ckpt").write_bytes(b"b" * 10)
    (tmp_path / "fault-npus").write_text('{"FaultRank": [0], "UpdateTime": 1, "checkCode": "x"}')
    inputs = PlanInputs(world_size=4, fault_npus_path=str(tmp_path / "fault-npus"), tp=2,
                        checkpoint_dir=str(tmp_path / "ckpt"), settle_seconds=0)
    plan = compute_plan(inputs)
    # Groups {0,2}, {1,3}; rank 0 faulty and rank 2 has no breakpoint file: periodic fallback.
    assert (plan.kind, plan.step, plan.epoch, plan.fault_ranks) == (KIND_PERIODIC, 5, 1, (0,))
    assert plan.sources == (2, 1, 2, 3)
    assert compute_plan(inputs).to_json() == plan.to_json()


@pytest.mark.parametrize("inputs", [
    PlanInputs(world_size=0),
    PlanInputs(world_size=4, dp=3),
    PlanInputs(world_size=4, extra_fault_ranks=(4,)),
    PlanInputs(world_size=4, groups_file="g.json", group_info_root="gi"),
    PlanInputs(world_size=4, checkpoint_pattern="no-step"),
])
def test_option_mistakes_are_usage_errors(inputs):
    with pytest.raises(UsageError):
        compute_plan(inputs)


# --- properties -------------------------------------------------------------------------------

@st.composite
def scenarios(draw):
    """A random layout, fault set and checkpoint population (sizes equal per group and step)."""
    tp = draw(st.integers(1, 4))
    pp = draw(st.integers(1, 3))
    dp = draw(st.integers(1, 4))
    world = dp * tp * pp
    groups = groups_from_layout(world, dp, tp, pp).groups
    fault_set = draw(st.sets(st.integers(0, world - 1), max_size=world))
    files: Files = {}
    for index, group in enumerate(groups):
        for rank in group:
            for kind in (KIND_BREAKPOINT, KIND_PERIODIC):
                steps = draw(st.sets(st.integers(1, 4), max_size=3))
                files.setdefault(rank, []).extend((kind, s, 10 * index + s) for s in steps)
    return world, groups, fault_set, files


def shuffled_inputs(world, groups, fault_set, files, seed):
    """The same inputs, every collection in a different order."""
    rng = random.Random(seed)
    candidates = [list(g) for g in groups]
    for group in candidates:
        rng.shuffle(group)
    rng.shuffle(candidates)
    parts = partition(world, candidates, "test").groups
    order = list(fault_set)
    rng.shuffle(order)
    shuffled_files = {}
    for rank in rng.sample(list(files), len(files)):
        items = list(files[rank])
        rng.shuffle(items)
        shuffled_files[rank] = items
    return ReplicaGroups(parts, "test"), faults(*order), shuffled_files


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.integers(0, 2 ** 32))
def test_plan_properties(scenario, seed):
    world, groups, fault_set, files = scenario
    plan = plan_for(world, groups, files, faults(*fault_set))
    if plan.kind == KIND_BREAKPOINT:
        mapping = plan.restore_ranks_map
        covered = sorted(int(r) for key in mapping for r in key.split(","))
        assert covered == list(range(world))  # every rank exactly once
        for key, source in mapping.items():
            group = [int(r) for r in key.split(",")]
            assert source in group and source not in fault_set  # a healthy member is the source
            assert all(plan.sources[r] == source for r in group)
        assert plan.restore_ranks == tuple(sorted(set(mapping.values())))
        assert plan.env_for(0)[envnames.RESTORE_RANKS] == ",".join(map(str, plan.restore_ranks))
    elif plan.kind == KIND_PERIODIC:
        assert all(plan.env_for(r)[envnames.RESTORE_RANKS] == "-1" for r in range(world))
    else:
        assert all(plan.env_for(r) == {} for r in range(world))
    if plan.kind != "none":
        group_of = {r: g for g in groups for r in g}
        for rank in range(world):
            env = plan.env_for(rank)
            source = plan.sources[rank]
            assert source in group_of[rank]  # only a replica may stand in
            assert env[envnames.LAUNCHER_RESUME_STEP] == str(plan.step)
            suffix = "_breakpoint.pt" if plan.kind == KIND_BREAKPOINT else ".pt"
            assert env[envnames.LAUNCHER_RESUME_CHECKPOINT] == \
                f"/ckpt/rank_{source}/ckpt-0_{plan.step}{suffix}"
    shuffled_groups, shuffled_faults, shuffled_files = shuffled_inputs(world, groups, fault_set,
                                                                       files, seed)
    again = plan_for(world, shuffled_groups, shuffled_files, shuffled_faults)
    assert again.to_json() == plan.to_json()  # independent of input order


def newest_common_step(groups, files, kind, excluded=frozenset()):
    """Oracle: the newest step at which every group has a non-excluded rank with a ``kind`` file."""
    def steps(rank):
        return {s for k, s, _ in files.get(rank, []) if k == kind}

    common = None
    for group in groups:
        have = set().union(*(steps(r) for r in group if r not in excluded))
        common = have if common is None else common & have
    return max(common) if common else None


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_plan_matches_oracle(scenario):
    """With consistent sizes: breakpoint at the newest common healthy step unless a periodic step
    common to all groups is newer; else periodic; else nothing."""
    world, groups, fault_set, files = scenario
    plan = plan_for(world, groups, files, faults(*fault_set))
    breakpoint_step = newest_common_step(groups, files, KIND_BREAKPOINT, fault_set)
    periodic_step = newest_common_step(groups, files, KIND_PERIODIC)
    if breakpoint_step is not None and (periodic_step is None or breakpoint_step >= periodic_step):
        assert (plan.kind, plan.step) == (KIND_BREAKPOINT, breakpoint_step)
    elif periodic_step is not None:
        assert (plan.kind, plan.step) == (KIND_PERIODIC, periodic_step)
    else:
        assert plan.kind == "none"


# --- scale ------------------------------------------------------------------------------------

def scale_inputs(world: int = 16384, dp: int = 8) -> Tuple[ReplicaGroups, FaultReport, ScanResult]:
    """16,384 ranks, replica groups of 8, 4 fault ranks, 2 periodic + 1 breakpoint file per rank."""
    groups = groups_from_layout(world, dp, world // dp, None)
    files = {r: [(KIND_PERIODIC, 100, 7), (KIND_PERIODIC, 200, 7), (KIND_BREAKPOINT, 250, 7)]
             for r in range(world)}
    return groups, faults(3, 2050, 9000, 16383), make_scan(world, files)


def test_plan_for_16384_ranks():
    """The plan at scale is right; how fast it is, `python -m bench scale` measures (no timed assertion
    here: a loaded CI machine is not a benchmark)."""
    groups, fault_set, scan = scale_inputs()
    plan = build_plan(16384, groups, fault_set, scan)
    envs = [plan.env_for(r) for r in range(16384)]
    assert plan.kind == KIND_BREAKPOINT and len(plan.restore_ranks) == 2048
    assert plan.full_env_maps and len(envs) == 16384



def test_breakpoint_minority_size_is_dropped():
    # Four replicas, rank 0's breakpoint truncated: the majority's file is the source, not a fallback.
    files = everyone(4, KIND_BREAKPOINT, [30])
    files[0] = [(KIND_BREAKPOINT, 30, 50)]
    plan = plan_for(4, [(0, 1, 2, 3)], files)
    assert (plan.kind, plan.step, plan.sources) == (KIND_BREAKPOINT, 30, (1, 1, 1, 1))
    assert any("differs from the majority's" in w and "rank 0: 50 B" in w for w in plan.warnings)


def test_periodic_minority_size_borrows_majority_replica():
    files = everyone(4, KIND_PERIODIC, [10, 20])
    files[0] = [(KIND_PERIODIC, 10, 100), (KIND_PERIODIC, 20, 50)]
    plan = plan_for(4, [(0, 1, 2, 3)], files)
    assert (plan.kind, plan.step, plan.sources) == (KIND_PERIODIC, 20, (1, 1, 2, 3))
    assert any("differs from the majority's" in w and "rank 0: 50 B" in w for w in plan.warnings)


def test_digest_sidecar_mismatch_is_skipped(tmp_path):
    import hashlib

    from launcher.restore import PlanInputs, compute_plan

    for rank in range(2):
        d = tmp_path / f"rank_{rank}"
        d.mkdir()
        data = b"state at step 30"
        (d / "ckpt-0_30_breakpoint.pt").write_bytes(data)
        (d / "ckpt-0_30_breakpoint.pt.sha256").write_text(hashlib.sha256(data).hexdigest() + "  x\n")
    (tmp_path / "rank_0" / "ckpt-0_30_breakpoint.pt").write_bytes(b"state at step 3X")  # same size
    plan = compute_plan(PlanInputs(world_size=2, dp=2, checkpoint_dir=str(tmp_path), settle_seconds=0))
    assert (plan.kind, plan.sources) == (KIND_BREAKPOINT, (1, 1))
    assert any("digest does not match" in w and "rank_0/ckpt-0_30_breakpoint.pt" in w for w in plan.warnings)
    assert not any("unexpected" in w for w in plan.warnings)


def test_a_missing_checkpoint_dir_is_the_reason_not_a_warning(tmp_path):
    """A job's first start: the directory does not exist yet; that is normal, said as the plan's reason."""
    from launcher.restore.planner import PlanInputs, compute_plan

    result = compute_plan(PlanInputs(world_size=2, checkpoint_dir=str(tmp_path / "ckpt")))
    assert result.kind == "none"
    assert result.reason == f"no checkpoints: {tmp_path / 'ckpt'} does not exist yet"
    assert result.warnings == ()


def test_breakpoint_plan_has_no_warnings_about_older_periodic_steps():
    """A periodic step older than the breakpoint one is never used: no "...; using <step>" warning."""
    files = everyone(3, KIND_BREAKPOINT, [30])
    for rank in range(3):
        files[rank] += [(KIND_PERIODIC, 10, 100)] + ([(KIND_PERIODIC, 20, 100)] if rank != 2 else [])
    plan = plan_for(3, singletons(3), files)
    assert (plan.kind, plan.step) == (KIND_BREAKPOINT, 30)
    assert not [w for w in plan.warnings if "periodic" in w], plan.warnings
