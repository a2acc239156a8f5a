"""`launcher plan`: option parsing, table and JSON output, option mistakes as UsageError."""

import json

import pytest
from click.testing import CliRunner

from launcher.commands.plan import plan
from launcher.jobspec.options import parse_rank_list
from launcher.common.errors import UsageError
from tests.helpers.paths import DATA

GROUP_INFO = DATA / "restore" / "group_info_dp2_tp2"


@pytest.fixture
def ckpt_dir(tmp_path):
    """4 ranks with periodic checkpoints at epoch 1 step 10 and breakpoints at step 12 (not rank 2)."""
    for rank in range(4):
        directory = tmp_path / "ckpt" / f"rank_{rank}"
        directory.mkdir(parents=True)
        (directory / "ckpt-1_10.pt").write_bytes(b"p" * 8)
        if rank != 2:
            (directory / "ckpt-1_12_breakpoint.pt").write_bytes(b"b" * 8)
    return tmp_path / "ckpt"


def run(*args):
    return CliRunner().invoke(plan, [str(a) for a in args])


@pytest.fixture
def reports(tmp_path):
    """Options pointing at empty cluster reports, so a host's real ones never leak in."""
    (tmp_path / "fault-npus").write_text('{"status": "initializing"}')
    (tmp_path / "reset.json").write_text('{"RankList": []}')
    return ["--fault-npus", tmp_path / "fault-npus", "--reset-json", tmp_path / "reset.json"]


def base_args(ckpt_dir, reports):
    return ["--world-size", 4, "--checkpoint-dir", ckpt_dir, "--settle-seconds", 0] + reports


def test_table_with_group_info(ckpt_dir, reports):
    result = run(*base_args(ckpt_dir, reports), "--group-info-root", GROUP_INFO,
                 "--fault-ranks", "0", "--rank", 2)
    assert result.exit_code == 0, result.output
    # Groups {0,2}, {1,3}; rank 0 faulty, rank 2 lacks a breakpoint: periodic fallback.
    assert "Restore plan: periodic restore from epoch 1 step 10" in result.output
    assert "replica groups: 2, from group_info.pb files under" in result.output
    assert "environment of rank 2:" in result.output
    assert "  LAUNCHER_RESUME_SOURCE_RANK=2" in result.output
    assert "  RESTORE_RANKS=-1" in result.output


def test_json_output(ckpt_dir, reports):
    result = run(*base_args(ckpt_dir, reports), "--tp", 2, "--json", "--rank", 2)
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["kind"] == "breakpoint" and record["step"] == 12
    assert record["restore_ranks"] == [0, 1] and record["restore_ranks_map"] == {"0,2": 0, "1,3": 1}
    assert record["env"]["variables"]["LAUNCHER_RESUME_SOURCE_RANK"] == "0"


def test_default_report_paths_may_be_absent(ckpt_dir):
    result = run("--world-size", 4, "--checkpoint-dir", ckpt_dir, "--settle-seconds", 0, "--json")
    assert result.exit_code == 0, result.output


def test_fresh_start_without_checkpoint_dir(reports):
    result = run("--world-size", 2, "--rank", 1, *reports)
    assert result.exit_code == 0, result.output
    assert "nothing to resume from" in result.output
    assert "environment of rank 1: (none: fresh start)" in result.output


@pytest.mark.parametrize("args,message", [
    (["--fault-ranks", "3,x"], "is not a rank id"),
    (["--fault-ranks", "9"], "outside 0..3"),
    (["--dp", 3], "does not match world size 4"),
    (["--dp", 2, "--groups-file", "g.json"], "one replica-group source"),
    (["--checkpoint-pattern", "nostep"], "no named group"),
    (["--rank", 4], "--rank 4 outside"),
    (["--strategy-file", "/nonexistent/strategy.ckpt"], "--strategy-file: /nonexistent/strategy.ckpt is not a file"),
])
def test_option_mistakes(reports, args, message):
    result = run("--world-size", 4, *reports, *args)
    assert isinstance(result.exception, UsageError)
    assert message in result.exception.message


def test_named_report_must_exist(tmp_path):
    result = run("--world-size", 4, "--fault-npus", tmp_path / "absent")
    assert isinstance(result.exception, UsageError)
    assert "does not exist" in result.exception.message


def test_parse_rank_list():
    assert parse_rank_list(" 3, 5,,", "--x") == (3, 5)
    assert parse_rank_list("", "--x") == ()
    with pytest.raises(UsageError):
        parse_rank_list("-1", "--x")


def test_world_size_change_shows_the_conversion(ckpt_dir, reports):
    """A DCP step written by 4 ranks planned for 2: the table and the JSON name the resharding."""
    step = ckpt_dir / "dcp" / "step-1_20"
    step.mkdir(parents=True)
    for rank in range(4):
        (step / f"__{rank}_0.distcp").write_bytes(b"x")
    (step / ".metadata").write_bytes(b"m")
    args = ["--world-size", 2, "--checkpoint-dir", ckpt_dir, "--settle-seconds", 0, "--tp", 2, *reports]
    result = run(*args, "--rank", 1)
    assert result.exit_code == 0, result.output
    assert "resharding 4 -> 2 ranks (now dp=1 tp=2 pp=1)" in result.output
    assert f"LAUNCHER_RESUME_DCP_DIR={step}" in result.output
    record = json.loads(run(*args, "--json").output)
    assert record["conversion"]["source_world_size"] == 4 and record["dcp_dir"] == str(step)

