"""Unit tests for ``launcher.run.attempt``: what one (re)start hands the ranks beyond the job-wide env."""

from typing import Dict, Optional

import pytest

from launcher.run.attempt import attempt_specs, checkpoint_index, restore_inputs
from launcher.jobspec.options import RunOptions
from launcher.jobspec.runspec import run_spec
from launcher.jobspec.rankenv import EnvContext
from launcher.jobspec.ranktable.generate import build_local_table
from launcher.jobspec.topology import Topology


def make_ctx(tmp_path, framework: str = "mindspore", base_env: Optional[Dict[str, str]] = None,
             group_info_root: Optional[str] = None) -> EnvContext:
    table = build_local_table(2)
    topo = Topology(table, table.servers[0], "test", None, framework == "mindspore", 8118)
    return EnvContext(framework, topo, "r", 0, str(tmp_path), group_info_root, base_env=base_env or {})


def worker_envs(tmp_path, opts: RunOptions, ctx: EnvContext):
    specs, _ = attempt_specs(run_spec(opts, {}), ctx, 0, (), log_session=str(tmp_path), gasp_allowed=True, rank_env={})
    return [s.env for s in specs if s.rank >= 0]


@pytest.mark.parametrize("graceful_exit, framework, base, expected", [
    (False, "mindspore", {}, None),  # an msrun script runs unchanged: no flag unless asked for
    (True, "mindspore", {}, "1"),
    (True, "mindspore", {"MS_ENABLE_GRACEFUL_EXIT": "0"}, None),  # the operator's value is inherited
    (True, "pytorch", {}, None),
    (True, "tensorflow", {}, None),
])
def test_ms_graceful_exit_only_on_request_and_never_over_the_operator(tmp_path, graceful_exit, framework, base,
                                                                       expected):
    opts = RunOptions(command=("x",), graceful_exit=graceful_exit)
    envs = worker_envs(tmp_path, opts, make_ctx(tmp_path, framework, base))
    assert {e.get("MS_ENABLE_GRACEFUL_EXIT") for e in envs} == {expected}


@pytest.mark.parametrize("framework", ["pytorch", "mindspore", "tensorflow"])
def test_graceful_exit_file_for_every_framework_without_the_flag(tmp_path, framework):
    envs = worker_envs(tmp_path, RunOptions(command=("x",)), make_ctx(tmp_path, framework))
    assert {e["LAUNCHER_GRACEFUL_EXIT_FILE"] for e in envs} == {str(tmp_path / "graceful_exit.json")}


def test_restore_inputs_read_the_given_root_once_ranks_wrote_there(tmp_path):
    root = tmp_path / "gi"
    (root / "device1").mkdir(parents=True)
    ctx = make_ctx(tmp_path, group_info_root=str(root))
    assert restore_inputs(run_spec(RunOptions(command=("x",)), {}).restore, ctx).group_info_root is None  # nothing written yet
    (root / "device1" / "group_info.pb").write_bytes(b"")
    assert restore_inputs(run_spec(RunOptions(command=("x",)), {}).restore, ctx).group_info_root == str(root)


def test_restart_plans_come_from_the_checkpoint_index(tmp_path):
    """With --checkpoint-dir the session's index feeds the plan, kept up to date by its own thread."""
    ckpt = tmp_path / "ckpt"
    for rank in (0, 1):
        (ckpt / f"rank_{rank}").mkdir(parents=True)
        (ckpt / f"rank_{rank}" / "ckpt-1_5_breakpoint.pt").write_bytes(b"x")
    spec = run_spec(RunOptions(command=("x",), checkpoint_dir=str(ckpt)), {})
    assert checkpoint_index(run_spec(RunOptions(command=("x",)), {}).restore, (0,)) is None
    index = checkpoint_index(spec.restore, (0,))
    try:
        assert index.indexer is not None  # the event loop is not involved
        ctx = make_ctx(tmp_path, "pytorch")
        _, plan = attempt_specs(spec, ctx, 1, (), log_session=str(tmp_path), gasp_allowed=True, rank_env={},
                                ckpt_index=index)
        assert (plan.kind, plan.step) == ("breakpoint", 5)
        assert index._ranks  # pylint: disable=protected-access  # the plan was read through the index
    finally:
        index.close()


def test_a_bad_checkpoint_pattern_is_left_to_the_plan_to_report(tmp_path):
    """No index (the session must start and stop cleanly); the first plan exits 2 as before."""
    opts = RunOptions(command=("x",), checkpoint_dir=str(tmp_path), checkpoint_pattern="no step group")
    assert checkpoint_index(run_spec(opts, {}).restore, (0,)) is None
