"""Malformed input files through the real CLI: exit 2 (or a warning) with one line, never a traceback
or a hang; during a run, one warning line, the last good state stands and the ranks finish normally.

The corpus is ``tests/data/malformed`` (see its README) plus what cannot be committed, made here: a FIFO
(``open`` blocked until a writer came, SIGTERM could not end it), a symlink to ``/dev/zero`` (read until
MemoryError), a directory, a symlink loop and a sparse file one byte over the size limit. Every command
runs under a subprocess timeout: a hang fails the test instead of stalling the suite.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import launch
from tests.helpers.configmap import ConfigMapDir
from tests.helpers.procs import wait_until
from tests.helpers.paths import REPO

CORPUS = REPO / "tests" / "data" / "malformed"
FILES = sorted(p.name for p in CORPUS.iterdir() if p.name != "README.md")
#: What a writer that has not finished could explain: the rank-table wait retries these.
UNFINISHED = {"truncated.json", "empty.json", "blank.json", "nul-byte.json", "yaml-alias-bomb.yaml",
              "yaml-deep-indent.yaml", "yaml-long-integer.yaml", "yaml-bad-date.yaml"}
SPECIAL = ["fifo", "dev-zero", "directory", "oversize", "symlink-loop"]
RANK_TABLE_LIMIT = 16 * 1024 * 1024
HANG = 60  # seconds: far beyond any honest answer on a loaded machine


def make(tmp_path: Path, case: str) -> Path:
    """The input file of ``case`` (a corpus file name or a SPECIAL kind) under ``tmp_path``."""
    path = tmp_path / "in" / "input"
    path.parent.mkdir()
    if case == "fifo":
        os.mkfifo(path)
    elif case == "dev-zero":
        path.symlink_to("/dev/zero")
    elif case == "directory":
        path.mkdir()
    elif case == "symlink-loop":
        path.symlink_to(path)
    elif case == "oversize":
        with open(path, "wb") as fh:
            fh.truncate(RANK_TABLE_LIMIT + 1)  # sparse
    else:
        path.write_bytes((CORPUS / case).read_bytes())
    return path


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``launcher ARGS`` in ``tmp_path``; a hang is a failure, never a stalled suite."""
    return launch.cli(*args, cwd=tmp_path, errors="replace", timeout=HANG)


def one_problem_line(result: subprocess.CompletedProcess, needle: str) -> str:
    """Exit 2, no traceback, and exactly one stderr line: it names ``needle``.

    A directory given for an option typed ``click.Path(dir_okay=False)`` is refused by click itself,
    with its usage message, before the launcher reads anything: that is accepted too.
    """
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    if f"File '{needle}' is a directory." in result.stderr:
        return ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    return lines[0]


def run_dirs(tmp_path: Path):
    return ["--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs")]


# -- at start: exit 2 with one line ---------------------------------------------------------------
@pytest.mark.parametrize("case", FILES + SPECIAL)
def test_ranktable_validate(tmp_path, case):
    path = make(tmp_path, case)
    line = one_problem_line(cli(tmp_path, "ranktable", "validate", str(path)), str(path))
    assert line.startswith(("", "launcher: rank table ", "launcher: cannot read rank table "))


@pytest.mark.parametrize("case", sorted(set(FILES) - UNFINISHED) + ["fifo", "dev-zero", "directory", "oversize"])
def test_run_with_a_bad_rank_table_fails_at_once(tmp_path, case):
    """Not a wait of --rank-table-timeout: nothing the cluster writes later can fix these."""
    path = make(tmp_path, case)
    result = cli(tmp_path, "run", *run_dirs(tmp_path), "--rank-table", str(path), "--rank-table-timeout",
                      "600", "--", "true")
    assert one_problem_line(result, str(path)).startswith(("", f"launcher: rank table {path} "))


def test_run_with_a_rank_table_in_a_missing_directory_fails_at_once(tmp_path):
    """A mistyped --rank-table used to wait 300 s printing 60 lines."""
    path = tmp_path / "no-such-dir" / "hccl.json"
    result = cli(tmp_path, "run", *run_dirs(tmp_path), "--rank-table", str(path), "--", "true")
    line = one_problem_line(result, str(path))
    assert f"directory {path.parent} does not exist" in line


@pytest.mark.parametrize("case", sorted(set(FILES) - {"empty.json", "blank.json"}) + SPECIAL)
def test_run_with_a_bad_config(tmp_path, case):
    path = make(tmp_path, case)
    result = cli(tmp_path, "run", *run_dirs(tmp_path), "--config", str(path), "--nproc-per-node", "1",
                      "--dry-run", "--", "true")
    line = one_problem_line(result, str(path))
    assert line.startswith(("", f"launcher: config file {path} ", f"launcher: cannot read config file {path}"))


@pytest.mark.parametrize("case", FILES + SPECIAL)
def test_plan_with_bad_reports_and_groups(tmp_path, case):
    """Cluster reports and a groups file the plan cannot trust are one warning each, not a failure:
    the plan falls back (no groups, breakpoint restore refused), as it does for other bad content."""
    path = make(tmp_path, case)
    result = cli(tmp_path, "plan", "--world-size", "4", "--fault-npus", str(path), "--reset-json", str(path),
                      "--groups-file", str(path), "--json")
    if case == "symlink-loop":  # refused before anything is read, as a missing file is
        assert one_problem_line(result, str(path)).endswith("does not exist")
        return
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    for source in ("fault-npus", "reset.json", "groups file"):
        found = [w for w in warnings if source in w and str(path) in w]
        assert len(found) == 1 and "\n" not in found[0], warnings


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "directory", "oversize", "deep-arrays.json",
                                  "long-integer.json"])
def test_plan_with_a_bad_group_info_file(tmp_path, case):
    source = make(tmp_path, case)
    root = tmp_path / "groups"
    (root / "device0").mkdir(parents=True)
    os.rename(source, root / "device0" / "group_info.pb")
    result = cli(tmp_path, "plan", "--world-size", "2", "--group-info-root", str(root), "--json")
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr
    assert any("device0" in w for w in json.loads(result.stdout)["warnings"])


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "deep-arrays.json", "long-integer.json", "utf16-bom.json"])
def test_run_with_a_bad_reset_json_at_start_warns_and_runs(tmp_path, case):
    """reset.json is the cluster's: a bad one is a warning, and the ranks start and finish."""
    path = make(tmp_path, case)
    result = cli(tmp_path, "run", *run_dirs(tmp_path), "--nproc-per-node", "1", "--reset-json", str(path),
                      "--", "true")
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr
    assert len([line for line in result.stderr.splitlines() if "WARNING" in line and str(path) in line]) == 1


# -- during a run: one warning, the last good state stands ----------------------------------------
def reset(retry=0, graceful=0):
    return json.dumps({"RankList": [], "RetryTime": retry, "FaultFlushing": False, "GracefulExit": graceful})


def swap_link(root: Path, name: str, target: str) -> None:
    """Point ``root/name`` at ``target`` atomically, as the kubelet swaps ConfigMap symlinks."""
    tmp = root / f".{name}.swap"
    tmp.symlink_to(target)
    os.rename(tmp, root / name)


def test_bad_reset_json_during_a_run_keeps_the_last_good_state(launcher, tmp_path):
    """Deep nesting once killed the job through the watcher; a FIFO froze the supervisor."""
    cm = ConfigMapDir(tmp_path / "reset-config", {"reset.json": reset(retry=1)})
    launcher.start(["--nproc-per-node", "2", "--reset-json", cm.path("reset.json")], ["--poll-exit"])
    launcher.wait_ready(2)
    root = Path(cm.root)
    os.mkfifo(tmp_path / "fifo")
    bad = [lambda: cm.write("reset.json", "[" * 100_000 + "]" * 100_000),
           lambda: cm.write("reset.json", '{"RetryTime": ' + "9" * 5000 + "}"),
           lambda: swap_link(root, "reset.json", str(tmp_path / "fifo")),
           lambda: swap_link(root, "reset.json", "/dev/zero")]
    needles = ["nests arrays or objects deeper", "integer of more than 4300 digits", "is a FIFO", "character device"]
    for write, needle in zip(bad, needles):
        write()
        assert wait_until(lambda: needle in launcher.stderr, 30), launcher.stderr
        assert launcher.proc.poll() is None, launcher.stderr
    swap_link(root, "reset.json", "..data/reset.json")
    # RetryTime 1 again: no restart if the state of RetryTime 1 stood through the bad files.
    cm.write("reset.json", reset(retry=1, graceful=1))
    assert launcher.wait(30) == 0, launcher.stderr
    stderr = launcher.stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert len([line for line in stderr.splitlines() if needle in line]) == 1, stderr
    assert not [e for e in launcher.events() if e["event"] in ("stop_group", "restart")]
    assert len(launcher.ready_lines(".exit")) == 2  # both ranks finished by the graceful exit


def rank_table(ranks):
    return json.dumps({"status": "completed", "version": "1.0", "server_count": "1",
                       "server_list": [{"server_id": "10.0.0.1", "container_ip": "10.0.0.1",
                                        "device": [{"device_id": str(r), "rank_id": str(r)} for r in ranks]}]})


@pytest.mark.parametrize("case", ["version-garbage", "version-fifo", "fault-npus-nested", "fault-npus-long-integer"])
def test_bad_file_before_a_restart_is_a_warning(launcher, tmp_path, case):
    """Files read again before a restart: the restart happens, with the last good table."""
    table_dir = tmp_path / "rings"
    table_dir.mkdir()
    (table_dir / "hccl.json").write_text(rank_table([0, 1]))
    (table_dir / "version").write_text("100")
    fault_npus = tmp_path / "fault-npus"
    fault_npus.write_text(json.dumps({"FaultRankIds": []}))
    (tmp_path / "ckpt").mkdir()
    trigger = tmp_path / "fail-now"
    launcher.start(["--rank-table", str(table_dir / "hccl.json"), "--server-id", "10.0.0.1",
                         "--max-restarts", "1", "--checkpoint-dir", str(tmp_path / "ckpt"),
                         "--fault-npus", str(fault_npus)],
                        ["--fail-rank", "1", "--fail-when", str(trigger), "--run", "1.0"])
    launcher.wait_ready(2)
    if case == "version-garbage":
        (table_dir / "version").write_bytes(b"\xff\xfe\x00garbage\x00")
        (table_dir / "hccl.json").write_text(rank_table([0, 1, 2]))  # never read: the version is unusable
        needle = f"rank table version file {table_dir / 'version'} is UTF-16 text"
    elif case == "version-fifo":
        (table_dir / "version").unlink()
        os.mkfifo(table_dir / "version")
        needle = f"rank table version file {table_dir / 'version'} is a FIFO"
    elif case == "fault-npus-nested":
        fault_npus.write_text('{"FaultRankIds": ' + "[" * 100_000 + "]" * 100_000 + "}")
        needle = f"fault-npus {fault_npus} nests arrays or objects deeper"
    else:
        fault_npus.write_text('{"FaultRank": [' + "7" * 5000 + "]}")
        needle = f"fault-npus {fault_npus} has an integer of more than 4300 digits"
    trigger.touch()
    assert launcher.wait(60) == 0, launcher.stderr
    stderr = launcher.stderr
    assert "Traceback" not in stderr
    assert len([line for line in stderr.splitlines() if needle in line]) == 1, stderr
    # The restart ran the same two ranks (the last good table), and both finished normally.
    assert sorted(int(line[0]) for line in launcher.ready_lines() if line[1] == "1") == [0, 1]
