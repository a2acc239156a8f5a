"""Plans across world sizes: which step wins, the conversion, the environment, the record."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common import envnames
from launcher.restore import PlanInputs, compute_plan
from launcher.restore.dcpsteps import FROM_MANIFEST, FROM_SHARD_NAMES, SavedStep
from launcher.restore.plan import KIND_BREAKPOINT, KIND_NONE, KIND_PERIODIC, RestorePlan
from launcher.restore.reshard import DCP_METHOD, target_layout, with_dcp

from tests.unit.restore.test_dcpsteps import make_step, manifest


def per_rank_plan(world, kind=KIND_NONE, step=None):
    files = () if kind == KIND_NONE else tuple((r, f"/c/rank_{r}/ckpt-0_{step}.pt") for r in range(world))
    return RestorePlan(world_size=world, kind=kind, reason="per-rank", epoch=0 if step is not None else None,
                       step=step, groups=tuple((r,) for r in range(world)), groups_source="none",
                       fault_ranks=(), fault_origins=(), sources=tuple(range(world)) if files else (),
                       files=files)


def layout_of(world, tp):
    return (("dp", world // tp), ("tp", tp), ("pp", 1))


def test_target_layout():
    assert target_layout(8, None, None, None) == ""
    assert target_layout(8, None, 2, None) == "dp=4 tp=2 pp=1"
    assert target_layout(8, 2, 2, 2) == "dp=2 tp=2 pp=2"


def test_same_world_no_conversion_but_dcp_env():
    step = SavedStep("/c/dcp/step-20", None, 20, 4, (), FROM_SHARD_NAMES)
    plan = with_dcp(per_rank_plan(4), step, ())
    assert plan.conversion is None and plan.saved_world_size == 4
    assert plan.env_for(3)[envnames.LAUNCHER_RESUME_DCP_DIR] == "/c/dcp/step-20"


def test_unknown_world_is_said_and_not_converted():
    plan = with_dcp(per_rank_plan(2), SavedStep("/c/dcp/step-5", None, 5, None), ())
    assert plan.conversion is None and plan.saved_world_size is None
    assert "unknown number of ranks" in plan.reason
    assert envnames.LAUNCHER_RESUME_SAVED_WORLD_SIZE not in plan.env_for(0)


def test_newer_per_rank_plan_wins_and_says_why():
    plan = with_dcp(per_rank_plan(2, KIND_BREAKPOINT, 30), SavedStep("/c/dcp/step-20", None, 20, 4), ("w",))
    assert plan.kind == KIND_BREAKPOINT and plan.dcp_dir is None
    assert plan.warnings[0] == "w" and "older" in plan.warnings[1]


def test_layout_change_on_the_same_world_is_a_conversion():
    step = SavedStep("/c/dcp/step-20", None, 20, 4, layout_of(4, 2), FROM_MANIFEST)
    plan = with_dcp(per_rank_plan(4), step, (), "dp=4 tp=1 pp=1")
    assert plan.conversion.summary() == "4 -> 4 ranks (dp=2 tp=2 pp=1 -> dp=4 tp=1 pp=1)"


@settings(max_examples=300, deadline=None)
@given(saved=st.integers(1, 64), world=st.integers(1, 64), saved_tp=st.sampled_from([1, 2, 4]),
       tp=st.sampled_from([None, 1, 2]), dcp_key=st.tuples(st.integers(0, 3), st.integers(0, 50)),
       per_rank=st.one_of(st.none(), st.tuples(st.sampled_from([KIND_BREAKPOINT, KIND_PERIODIC]),
                                               st.integers(0, 60))),
       known=st.sampled_from([FROM_MANIFEST, FROM_SHARD_NAMES, ""]))
def test_planned_conversion_is_consistent(saved, world, saved_tp, tp, dcp_key, per_rank, known):
    """Random M -> N, layouts and steps: the DCP step wins exactly when it is at least as new; a
    conversion is planned exactly when the world or a known layout differs; every rank gets the one
    directory; the record says the same as the environment."""
    layout = layout_of(saved, saved_tp) if known == FROM_MANIFEST and saved % saved_tp == 0 else ()
    step = SavedStep(f"/c/dcp/step-{dcp_key[0]}_{dcp_key[1]}", dcp_key[0], dcp_key[1],
                     saved if known else None, layout, known)
    base = per_rank_plan(world, *per_rank) if per_rank else per_rank_plan(world)
    now = target_layout(world, None, tp, None) if tp and world % tp == 0 else ""
    plan = with_dcp(base, step, (), now)
    if per_rank and (0, per_rank[1]) > dcp_key:
        assert plan == base.__class__(**{**base.__dict__, "warnings": plan.warnings})
        return
    assert (plan.kind, plan.dcp_dir, (plan.epoch, plan.step)) == (KIND_PERIODIC, step.path, dcp_key)
    assert plan.saved_world_size == (saved if known else None)
    layout_differs = bool(layout and now and step.layout and dict(layout) != dict(
        (a, int(v)) for a, v in (p.split("=") for p in now.split())))
    expect = bool(known) and (saved != world or layout_differs)
    assert (plan.conversion is not None) == expect
    if expect:
        c = plan.conversion
        assert (c.source_world_size, c.target_world_size, c.source, c.method) == (
            saved, world, step.path, DCP_METHOD)
        assert c.summary().startswith(f"{saved} -> {world} ranks")
    envs = [plan.env_for(r) for r in range(world)]
    assert all(e == envs[0] for e in envs)
    assert envs[0][envnames.LAUNCHER_RESUME_CHECKPOINT] == step.path
    assert envs[0][envnames.LAUNCHER_RESUME_STEP] == str(dcp_key[1])
    assert envs[0][envnames.RESTORE_RANKS] == "-1"
    record = json.loads(json.dumps(plan.to_json()))
    assert record["dcp_dir"] == step.path and record["saved_world_size"] == plan.saved_world_size
    assert record["conversion"] == (plan.conversion.to_json() if expect else None)
    assert step.path in plan.format_table()


def test_compute_plan_reads_the_dcp_steps(tmp_path):
    make_step(tmp_path, "step-10", shards=(0, 1, 2, 3), manifest=manifest(step=10, layout={"dp": 4}))
    (tmp_path / "rank_0").mkdir()
    plan = compute_plan(PlanInputs(world_size=2, checkpoint_dir=str(tmp_path), settle_seconds=0, dp=2))
    assert plan.dcp_dir == str(tmp_path / "dcp" / "step-10")
    assert plan.conversion.summary() == "4 -> 2 ranks (dp=4 tp=1 pp=1 -> dp=2 tp=1 pp=1)"
    assert plan.warnings == ()  # dcp/ is not an unexpected name of the checkpoint directory
    assert "resharding 4 -> 2 ranks" in plan.format_table()


def test_compute_plan_warns_about_a_bad_manifest_and_still_plans(tmp_path):
    make_step(tmp_path, "step-10", shards=(0, 1, 2), manifest="{")
    plan = compute_plan(PlanInputs(world_size=2, checkpoint_dir=str(tmp_path), settle_seconds=0))
    assert plan.saved_world_size == 3 and plan.conversion.known_from == FROM_SHARD_NAMES
    assert len(plan.warnings) == 1 and "launcher-manifest.json" in plan.warnings[0]


def test_console_line_names_the_resharding():
    from launcher.run.session import resume_summary

    step = SavedStep("/c/dcp/step-20", None, 20, 4, (), FROM_MANIFEST)
    assert resume_summary(with_dcp(per_rank_plan(2), step, ())) == (
        "resuming from the step-20 DCP checkpoint /c/dcp/step-20, resharding 4 -> 2 ranks")
    assert resume_summary(with_dcp(per_rank_plan(4), step, ())) == (
        "resuming from the step-20 DCP checkpoint /c/dcp/step-20")
