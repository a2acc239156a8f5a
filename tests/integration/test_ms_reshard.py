"""End to end on CPU: a MindSpore step written by 2 ranks, resumed by 4, converted by the launcher.

Semi-auto parallel does not compile on MindSpore's CPU backend (examples/mindspore/README.md, limit 1,
re-measured under msrun for this test), so no CPU job writes a strategy file or sharded checkpoints
itself. Here they are produced the way the compile pass and the ranks would: the strategy files with
MindSpore's own message classes (``mindspore.train.node_strategy_pb2``), the shards with
``mindspore.save_checkpoint``. Then ``launcher run --nproc-per-node 4 --strategy-file dst`` must run
MindSpore's real ``transform_checkpoint_by_rank`` once before the ranks start, hand every rank its
converted file, match MindSpore's whole-directory ``transform_checkpoints`` run on the same input, and
not convert again on the next start (cache).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import Launcher

if importlib.util.find_spec("mindspore") is None:
    pytest.skip("mindspore is not installed", allow_module_level=True)

import numpy as np  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests" / "workers" / "env_probe.py")
# (name, shape, sharded dimension or None for replicated)
PARAMS = (("dense.weight", (8, 4), 0), ("dense.bias", (4,), None), ("head.weight", (4, 8), 1))


def full_params():
    return {name: np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 100 * i
            for i, (name, shape, _) in enumerate(PARAMS)}


def write_strategy(path: Path, world: int) -> None:
    """The strategy file a semi-auto compile on ``world`` devices writes for PARAMS (1-D device matrix)."""
    from mindspore.train import node_strategy_pb2 as pb

    strategy = pb.ParallelStrategyMap(current_stage=0)
    for name, shape, split in PARAMS:
        layouts = strategy.parallel_layout_item.add(param_name=name).parallel_layouts
        layouts.dev_matrix.add().dim.extend([world])
        layouts.tensor_map.add().dim.extend([0 if d == split else -1 for d in range(len(shape))])
        layouts.param_split_shape.add()
        layouts.indices_offset.add()
        layouts.field, layouts.opt_weight_shard_step, layouts.opt_weight_shard_size = 0, 0, 0
    path.write_bytes(strategy.SerializeToString())


def shard(array, split, rank, world):
    return array if split is None else np.split(array, world, axis=split)[rank]


def write_step(ckpt: Path, world: int) -> None:
    """Rank files of step (1, 10) written by ``world`` ranks, the strategy file and the manifest."""
    import mindspore as ms

    full = full_params()
    files = {}
    for rank in range(world):
        path = ckpt / f"rank_{rank}" / "ms-1_10.ckpt"
        path.parent.mkdir(parents=True)
        ms.save_checkpoint([{"name": name, "data": ms.Tensor(shard(full[name], split, rank, world))}
                            for name, _, split in PARAMS], str(path))
        files[str(rank)] = f"rank_{rank}/ms-1_10.ckpt"
    (ckpt / "manifests").mkdir()
    write_strategy(ckpt / "manifests" / "strategy-2.ckpt", world)
    manifest = {"launcher_manifest": 1, "format": "mindspore", "world_size": world, "epoch": 1, "step": 10,
                "strategy_file": "manifests/strategy-2.ckpt", "files": files}
    (ckpt / "manifests" / "step-1_10.json").write_text(json.dumps(manifest))


def launch(tmp: Path, name: str, dst: Path) -> dict:
    proc = Launcher(tmp / name, cwd=REPO)
    code = proc.run(["--nproc-per-node", "4", "--checkpoint-dir", tmp / "ckpt", "--strategy-file", dst],
                    command=[sys.executable, PROBE, "--out", tmp / name / "probe"], timeout=300)
    assert code == 0, f"exit {code}\n{proc.stdout}\n{proc.stderr}"
    assert "resharding 2 -> 4 ranks" in proc.stderr
    run_dir = proc.run_dir
    conversions = proc.events("checkpoint_conversion")
    assert len(conversions) == 1, proc.events()
    envs = {r: json.loads((tmp / name / "probe" / f"{r}.json").read_text())["env"] for r in range(4)}
    return {"conversion": conversions[0], "envs": envs,
            "plan": json.loads((run_dir / "restore_plan.json").read_text())}


def test_two_ranks_resumed_by_four(tmp_path):
    import mindspore as ms

    ckpt = tmp_path / "ckpt"
    write_step(ckpt, 2)
    dst = tmp_path / "strategy-4.ckpt"
    write_strategy(dst, 4)

    first = launch(tmp_path, "first", dst)
    assert first["conversion"]["cached"] is False
    assert first["plan"]["conversion"]["source_world_size"] == 2 and first["plan"]["saved_world_size"] == 2
    output = Path(first["plan"]["conversion"]["output"])

    reference = tmp_path / "reference"
    src_only = tmp_path / "src_only"  # transform_checkpoints wants rank_<r>/ holding one file each
    for rank in range(2):
        (src_only / f"rank_{rank}").mkdir(parents=True)
        os.link(ckpt / f"rank_{rank}" / "ms-1_10.ckpt", src_only / f"rank_{rank}" / "ms-1_10.ckpt")
    ms.transform_checkpoints(str(src_only), str(reference), "ref", str(ckpt / "manifests" / "strategy-2.ckpt"),
                             str(dst))

    full = full_params()
    for rank in range(4):
        path = first["envs"][rank]["LAUNCHER_RESUME_CHECKPOINT"]
        assert path == str(output / f"rank_{rank}" / "ms-1_10.ckpt")
        assert first["envs"][rank]["LAUNCHER_RESUME_STEP"] == "10"
        loaded = {k: v.asnumpy() for k, v in ms.load_checkpoint(path).items()}
        ref_file = next((reference / f"rank_{rank}").iterdir())
        ref = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(ref_file)).items()}
        for name, _, split in PARAMS:
            np.testing.assert_array_equal(loaded[name], shard(full[name], split, rank, 4))
            np.testing.assert_array_equal(loaded[name], ref[name])

    second = launch(tmp_path, "second", dst)
    assert second["conversion"]["cached"] is True and second["plan"]["conversion"]["output"] == str(output)
