"""MindSpore step manifests: completeness, malformed manifests, and the plans made from them."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common import envnames
from launcher.restore import PlanInputs, compute_plan
from launcher.restore.mssteps import MANIFESTS_DIR, newest_ms_step
from launcher.restore.plan import KIND_NONE, KIND_PERIODIC


def write_step(ckpt, world, step=10, epoch=1, strategy="manifests/strategy-src.ckpt", override=None):
    """Per-rank files ``rank_<r>/ms-<epoch>_<step>.ckpt``, the strategy file and the manifest."""
    files = {}
    for rank in range(world):
        path = ckpt / f"rank_{rank}" / f"ms-{epoch}_{step}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"shard %d" % rank)
        files[str(rank)] = f"rank_{rank}/{path.name}"
    (ckpt / MANIFESTS_DIR).mkdir(parents=True, exist_ok=True)
    (ckpt / MANIFESTS_DIR / "strategy-src.ckpt").write_bytes(b"strategy of %d" % world)
    data = {"launcher_manifest": 1, "format": "mindspore", "world_size": world, "epoch": epoch, "step": step,
            "strategy_file": strategy, "files": files, **(override or {})}
    path = ckpt / MANIFESTS_DIR / f"step-{epoch}_{step}.json"
    path.write_text(json.dumps(data))
    return path


def test_no_manifests(tmp_path):
    assert newest_ms_step(str(tmp_path)) == (None, ())


def test_a_complete_step(tmp_path):
    write_step(tmp_path, 2)
    step, warnings = newest_ms_step(str(tmp_path))
    assert warnings == () and (step.epoch, step.step, step.world_size) == (1, 10, 2)
    assert step.strategy_file == str(tmp_path / MANIFESTS_DIR / "strategy-src.ckpt")
    assert step.files == tuple((r, str(tmp_path / f"rank_{r}" / "ms-1_10.ckpt")) for r in range(2))


def test_newest_complete_step_wins_and_an_incomplete_newer_one_warns(tmp_path):
    write_step(tmp_path, 2, step=10)
    write_step(tmp_path, 2, step=20)
    (tmp_path / "rank_1" / "ms-1_20.ckpt").unlink()  # a rank's file gone (rotation, lost node)
    step, warnings = newest_ms_step(str(tmp_path))
    assert step.step == 10 and len(warnings) == 1 and "ms-1_20.ckpt" in warnings[0]


MALFORMED = {
    "not json": "{",
    "format dcp": {"format": "dcp"},
    "world zero": {"world_size": 0},
    "step disagrees": {"step": 11},
    "no strategy": {"strategy_file": ""},
    "strategy missing": {"strategy_file": "manifests/none.ckpt"},
    "files not an object": {"files": ["rank_0/ms-1_10.ckpt"]},
    "a rank without a file": {"files": {"0": "rank_0/ms-1_10.ckpt"}},
    "an extra rank": {"files": {"0": "rank_0/ms-1_10.ckpt", "1": "rank_1/ms-1_10.ckpt", "2": "x"}},
    "a rank spelled 01": {"files": {"0": "rank_0/ms-1_10.ckpt", "01": "rank_1/ms-1_10.ckpt"}},
    "a file missing": {"files": {"0": "rank_0/ms-1_10.ckpt", "1": "rank_1/gone.ckpt"}},
    "a file that is a directory": {"files": {"0": "rank_0/ms-1_10.ckpt", "1": "rank_1"}},
    "a path not a string": {"files": {"0": "rank_0/ms-1_10.ckpt", "1": 7}},
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_manifest_is_skipped_with_one_warning(tmp_path, name):
    write_step(tmp_path, 2, step=5)
    override = MALFORMED[name]
    path = write_step(tmp_path, 2, step=10, override=None if isinstance(override, str) else override)
    if isinstance(override, str):
        path.write_text(override)
    step, warnings = newest_ms_step(str(tmp_path))
    assert step.step == 5
    assert len(warnings) == 1 and "step-1_10.json" in warnings[0]


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300))
def test_any_manifest_bytes_never_crash(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("ms")
    path = write_step(root, 2)
    path.write_bytes(data)
    step, warnings = newest_ms_step(str(root))
    assert step is None and len(warnings) == 1


def plan(tmp_path, world, strategy=None):
    return compute_plan(PlanInputs(world_size=world, checkpoint_dir=str(tmp_path), settle_seconds=0,
                                   strategy_file=strategy))


def test_another_world_with_a_strategy_file_plans_the_conversion(tmp_path):
    write_step(tmp_path, 2)
    dst = tmp_path.parent / f"{tmp_path.name}-dst.ckpt"
    dst.write_bytes(b"strategy of 4")
    result = plan(tmp_path, 4, str(dst))
    assert (result.kind, result.step, result.saved_world_size) == (KIND_PERIODIC, 10, 2)
    conversion = result.conversion
    assert (conversion.format, conversion.source_world_size, conversion.target_world_size) == ("mindspore", 2, 4)
    assert conversion.output == result.transform.output
    assert result.transform.sources == tuple((r, str(tmp_path / f"rank_{r}" / "ms-1_10.ckpt")) for r in range(2))
    env = result.env_for(3)
    assert env[envnames.LAUNCHER_RESUME_CHECKPOINT] == result.transform.file_for(3)
    assert env[envnames.LAUNCHER_RESUME_STEP] == "10" and env[envnames.RESTORE_RANKS] == "-1"
    record = json.loads(json.dumps(result.to_json()))
    assert record["transform"]["dst_strategy"] == str(dst)
    assert "resharding 2 -> 4 ranks" in result.format_table()
    assert result.warnings == ()  # manifests/ is not an unexpected name of the checkpoint directory


def test_another_world_without_a_strategy_file_withdraws_that_step(tmp_path):
    """2 ranks wrote step 10; resumed on 1 rank, rank_0's file is half the model: not loaded."""
    write_step(tmp_path, 2)
    result = plan(tmp_path, 1)
    assert result.kind == KIND_NONE and result.env_for(0) == {}
    assert "--strategy-file" in result.warnings[-1]


def test_same_world_without_a_strategy_file_is_the_per_rank_plan(tmp_path):
    write_step(tmp_path, 2)
    result = plan(tmp_path, 2)
    assert (result.kind, result.saved_world_size, result.conversion) == (KIND_PERIODIC, 2, None)
    assert result.env_for(1)[envnames.LAUNCHER_RESUME_CHECKPOINT] == str(tmp_path / "rank_1" / "ms-1_10.ckpt")


def test_a_newer_per_rank_step_wins_over_an_older_manifest(tmp_path):
    write_step(tmp_path, 4, step=10)
    for rank in range(2):
        (tmp_path / f"rank_{rank}" / "ms-1_20.ckpt").write_bytes(b"newer")
    result = plan(tmp_path, 2)
    assert (result.kind, result.step, result.conversion) == (KIND_PERIODIC, 20, None)


def test_same_world_and_same_strategy_is_not_converted(tmp_path):
    write_step(tmp_path, 2)
    result = plan(tmp_path, 2, str(tmp_path / MANIFESTS_DIR / "strategy-src.ckpt"))
    assert (result.kind, result.saved_world_size, result.conversion, result.transform) == (KIND_PERIODIC, 2, None, None)


@settings(max_examples=60, deadline=None)
@given(saved=st.integers(1, 5), world=st.integers(1, 5), manifest_step=st.integers(1, 30),
       own_step=st.one_of(st.none(), st.integers(1, 30)), with_strategy=st.booleans())
def test_world_changes_plan_consistently(tmp_path_factory, saved, world, manifest_step, own_step, with_strategy):
    """Random M -> N with a manifest step and, maybe, a per-rank step of the current world: the newer
    wins; a step of another world is converted exactly when a strategy file is given, never loaded
    as if it were this world's; every rank's file is the converted one or its own."""
    root = tmp_path_factory.mktemp("ms")
    write_step(root, saved, step=manifest_step)
    if own_step is not None and own_step != manifest_step:
        for rank in range(world):
            (root / f"rank_{rank}").mkdir(exist_ok=True)
            (root / f"rank_{rank}" / f"ms-1_{own_step}.ckpt").write_bytes(b"own")
    dst = root.parent / f"{root.name}-dst.ckpt"
    dst.write_bytes(b"strategy for %d" % world)
    result = plan(root, world, str(dst) if with_strategy else None)
    own = own_step if own_step is not None and own_step != manifest_step else None
    if own is not None and own > manifest_step:
        assert (result.step, result.conversion) == (own, None)
        return
    if saved == world:
        assert result.step == manifest_step and result.saved_world_size == saved
        assert (result.conversion is not None) == with_strategy  # another strategy on the same world
    elif with_strategy:
        assert (result.step, result.conversion.source_world_size, result.conversion.target_world_size) == (
            manifest_step, saved, world)
        files = [result.env_for(r)[envnames.LAUNCHER_RESUME_CHECKPOINT] for r in range(world)]
        assert files == [result.transform.file_for(r) for r in range(world)]
    else:
        assert result.step != manifest_step and result.conversion is None
        assert result.step == own  # an older step of this world, or nothing
        assert any("--strategy-file" in w for w in result.warnings)
