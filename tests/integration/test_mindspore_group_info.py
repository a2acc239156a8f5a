"""The restore planner on hybrid-parallel ``group_info.pb`` files made with MindSpore's own classes.

MindSpore writes ``GROUP_INFO_FILE`` when it compiles a semi-auto / auto / data-parallel graph, and
on CPU that compile fails ("Invalid communication backend: CPU for semi_auto_parallel/auto_parallel
mode", examples/mindspore/README.md), so no CPU run can produce a hybrid layout's files. They are made
here the way that compile pass makes them: a ``mindspore.train.node_strategy_pb2.ParallelGroupMap``
whose ``ckpt_restore_rank_list`` is the rank's common mirror group (``FindCommonMirrorGroup``: the
intersection of the groups that all-reduce each weight's gradient). For ``dp x mp`` with every weight
sharded ``mp`` ways, that is the ``dp`` ranks holding the same shard: ``{m, m + mp, ...}``.
MindSpore's own reader (``restore_group_info_list``) must read them back, and the launcher's planner
must turn them into the vendor's ``RESTORE_RANKS`` / ``RESTORE_RANKS_MAP``.
"""

import importlib.util
from pathlib import Path
from typing import Dict, List

import pytest

if importlib.util.find_spec("mindspore") is None:
    pytest.skip("mindspore is not installed", allow_module_level=True)

from launcher.restore import PlanInputs, compute_plan  # noqa: E402
from launcher.restore.groupinfo import parse_restore_rank_list  # noqa: E402

pytestmark = pytest.mark.slow

DP, MP = 2, 2
WORLD = DP * MP
STEP_NAME = "ms-1_5_breakpoint.ckpt"


def mirror_group(rank: int) -> List[int]:
    """Device matrix ``[dp, mp]``, rank = d * mp + m: the replicas of rank's shard."""
    return list(range(rank % MP, WORLD, MP))


def model_group(rank: int) -> List[int]:
    first = rank - rank % MP
    return list(range(first, first + MP))


def write_group_info(root: Path) -> Dict[int, Path]:
    """``<root>/device<r>/group_info.pb`` for every rank, serialized by MindSpore's protobuf class."""
    from mindspore.train.node_strategy_pb2 import ParallelGroupMap

    paths = {}
    for rank in range(WORLD):
        message = ParallelGroupMap()
        for ranks in (mirror_group(rank), model_group(rank)):
            item = message.parallel_group_item.add()
            # MindSpore names a group "<size>-<hash of the rank list>"; the planner ignores the items.
            item.group_name = f"{len(ranks)}-{'-'.join(map(str, ranks))}"
            item.parallel_group_ranks.dim.extend(ranks)
        message.ckpt_restore_rank_list.dim.extend(mirror_group(rank))
        path = root / f"device{rank}" / "group_info.pb"
        path.parent.mkdir(parents=True)
        path.write_bytes(message.SerializeToString())
        paths[rank] = path
    return paths


def write_breakpoints(ckpt: Path) -> None:
    """One breakpoint per rank at the same step; replicas of one shard have one size."""
    for rank in range(WORLD):
        folder = ckpt / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / STEP_NAME).write_bytes(b"x" * (100 + rank % MP))


def test_mindspore_and_launcher_read_the_same_restore_lists(tmp_path):
    """MindSpore's reader and the launcher's parser agree on every file's ckpt_restore_rank_list."""
    from mindspore.parallel import restore_group_info_list

    for rank, path in write_group_info(tmp_path).items():
        assert restore_group_info_list(str(path)) == mirror_group(rank)
        assert list(parse_restore_rank_list(path.read_bytes())) == mirror_group(rank)


@pytest.mark.parametrize("faults, restore_ranks, restore_map, sources", [
    ((), "0,1", {"0,2": 0, "1,3": 1}, [0, 1, 0, 1]),
    ((2,), "0,1", {"0,2": 0, "1,3": 1}, [0, 1, 0, 1]),
    ((0, 3), "1,2", {"0,2": 2, "1,3": 1}, [2, 1, 2, 1]),
])
def test_breakpoint_plan_from_hybrid_group_info(tmp_path, faults, restore_ranks, restore_map, sources):
    """Replica groups {0,2} and {1,3} from the files: each group's lowest healthy rank is its source,
    and every rank gets the vendor variables and the file of its group's source."""
    write_group_info(tmp_path / "group_info")
    write_breakpoints(tmp_path / "ckpt")
    plan = compute_plan(PlanInputs(world_size=WORLD, group_info_root=str(tmp_path / "group_info"),
                                   extra_fault_ranks=faults, checkpoint_dir=str(tmp_path / "ckpt"),
                                   settle_seconds=0))
    assert (plan.kind, plan.groups, list(plan.sources)) == ("breakpoint", ((0, 2), (1, 3)), sources), plan
    assert plan.warnings == ()
    for rank in range(WORLD):
        env = plan.env_for(rank)
        assert (env["RESTORE_RANKS"], env["LAUNCHER_RESUME_SOURCE_RANK"]) == (restore_ranks, str(sources[rank]))
        assert env["RESTORE_RANKS_MAP"] == "{" + ",".join(f'"{k}":{v}' for k, v in restore_map.items()) + "}"
        assert env["LAUNCHER_RESUME_CHECKPOINT"] == str(tmp_path / "ckpt" / f"rank_{sources[rank]}" / STEP_NAME)


def test_a_group_without_a_healthy_breakpoint_means_no_breakpoint_restore(tmp_path):
    """Both replicas of shard 0 (ranks 0 and 2) faulty: that shard is lost, so no breakpoint plan
    (the vendor's RESTORE_RANKS=-1), although ranks 1 and 3 are fine."""
    write_group_info(tmp_path / "group_info")
    write_breakpoints(tmp_path / "ckpt")
    plan = compute_plan(PlanInputs(world_size=WORLD, group_info_root=str(tmp_path / "group_info"),
                                   extra_fault_ranks=(0, 2), checkpoint_dir=str(tmp_path / "ckpt"),
                                   settle_seconds=0))
    assert plan.kind == "none" and plan.groups == ((0, 2), (1, 3)), plan
    assert any("{0,2}" in warning for warning in plan.warnings), plan.warnings
