"""Every option the installed torchrun (torch 2.13) and msrun (MindSpore 2.10) list in ``--help`` is a
row of the option table, and ``launcher run`` does with it what the row says: the launcher's own option
or mapped onto one (exit 0), accepted with one info line (exit 0), or refused with what to do (exit 2).

The help is parsed from the real programs next to this interpreter, so a new torchrun or msrun option
fails here until the table says what it becomes.
"""

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from launcher.commands import optiontable
from launcher.commands.cli import main
from launcher.commands.torchrun import normalize_token

BIN = Path(sys.executable).parent
#: A value each option that takes one is tried with (torchrun's and msrun's own examples).
SAMPLES = {
    "--nnodes": "1", "--nproc-per-node": "1", "--rdzv-backend": "static", "--rdzv-endpoint": "localhost:0",
    "--rdzv-id": "job7", "--rdzv-conf": "join_timeout=5", "--max-restarts": "1", "--monitor-interval": "0.1",
    "--start-method": "spawn", "--event-log-handler": "null", "--role": "trainer", "--log-dir": "{tmp}/logs",
    "--redirects": "3", "--tee": "0:3", "--local-ranks-filter": "0", "--duplicate-stdout-filters": "loss",
    "--duplicate-stderr-filters": "loss", "--node-rank": "0", "--master-addr": "127.0.0.1",
    "--master-port": "29500", "--local-addr": "127.0.0.1", "--logs-specs": "default", "--numa-binding": "node",
    "--signals-to-handle": "SIGTERM,SIGINT", "--shutdown-timeout": "5",
    # msrun
    "--worker_num": "1", "--local_worker_num": "1", "--master_addr": "127.0.0.1", "--master_port": "8118",
    "--node_rank": "0", "--log_dir": "{tmp}/logs", "--join": "True", "--cluster_time_out": "60",
    "--bind_core": "True", "--bind_numa": "True", "--sim_level": "1", "--sim_rank_id": "0",
    "--rank_table_file": "{tmp}/hccl.json", "--worker_log_name": "worker_{{ip}}", "--tail_worker_log": "0",
}


def help_options(program: str) -> List[Tuple[Tuple[str, ...], bool]]:
    """``[(spellings, takes_value), ...]`` of the options ``program --help`` lists (without -h/--help)."""
    proc = subprocess.run([str(BIN / program), "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.split("options:", 1)[1]
    found = []
    for line in text.splitlines():
        match = re.match(r"^  (-[-\w]+.*?)(?:  |$)", line)
        if not match:
            continue
        parts = [p.strip() for p in match.group(1).split(", ")]
        spellings = tuple(p.split(" ")[0] for p in parts)
        if "--help" in spellings:
            continue
        found.append((spellings, any(" " in p for p in parts)))
    return found


def row_for(tool: str, spellings: Tuple[str, ...]) -> optiontable.Row:
    wanted = {normalize_token(s) for s in spellings}
    for row in optiontable.ROWS:
        column = row.torchrun if tool == "torchrun" else row.msrun
        if column and normalize_token(column) in wanted:
            return row
    raise AssertionError(f"{tool} {'/'.join(spellings)} is not in the option table")


@pytest.fixture(scope="module")
def torchrun_help():
    if not (BIN / "torchrun").exists():
        pytest.skip("torchrun is not installed next to this interpreter")
    return help_options("torchrun")


@pytest.fixture(scope="module")
def msrun_help():
    if not (BIN / "msrun").exists():
        pytest.skip("msrun is not installed next to this interpreter")
    return help_options("msrun")


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger, monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))
    (tmp_path / "hccl.json").write_text("{}")


def launch(capsys, *args: str) -> Tuple[int, str]:
    code = main(["run", "--dry-run", *args, "--", "true"])
    _out, err = capsys.readouterr()
    return code, err


def expect(row: optiontable.Row, spelling: str, code: int, err: str) -> None:
    """What the row promises: exit 0 (and an info line for INFO rows), or exit 2 with its note."""
    if row.handling == optiontable.REFUSED:
        errors = [line for line in err.splitlines() if not line.startswith("[launcher")]
        assert code == 2 and errors == [f"launcher: {row.flag} is {row.tool}'s: {row.note}"], err
    else:
        assert code == 0, f"{spelling}: {err}"
        if row.handling == optiontable.INFO:
            assert f"{row.flag} is {row.tool}'s: {row.note}" in err


def test_torchrun_help_is_parsed(torchrun_help):
    flat = {s for spellings, _ in torchrun_help for s in spellings}
    assert {"--nproc-per-node", "--nproc_per_node", "--rdzv-endpoint", "-r", "--tee", "-m", "--run-path"} <= flat
    assert len(torchrun_help) >= 30


def test_every_torchrun_option_is_mapped_accepted_or_refused(capsys, tmp_path, torchrun_help):
    for spellings, takes_value in torchrun_help:
        row = row_for("torchrun", spellings)
        for spelling in spellings:
            value = [SAMPLES[normalize_token(spellings[-1]) if spellings[-1].startswith("--") else spellings[-1]]
                     .format(tmp=tmp_path)] if takes_value else []
            base = [] if "nproc" in spelling else ["--nproc-per-node", "1"]
            code, err = launch(capsys, *base, spelling, *value)
            expect(row, spelling, code, err)


def test_msrun_help_is_parsed(msrun_help):
    flat = {s for spellings, _ in msrun_help for s in spellings}
    assert {"--worker_num", "--local_worker_num", "--join", "--bind_core", "--sim_level", "--tail_worker_log"} <= flat


def test_every_msrun_option_is_mapped_accepted_or_refused(capsys, tmp_path, msrun_help):
    for (spelling,), takes_value in msrun_help:
        row = row_for("msrun", (spelling,))
        value = [SAMPLES[spelling].format(tmp=tmp_path)] if takes_value else []
        base = {"--worker_num": ["--local_worker_num", "1"], "--local_worker_num": ["--worker_num", "1"]}.get(
            spelling, ["--worker_num", "1", "--local_worker_num", "1"])
        code, err = launch(capsys, *base, spelling, *value)
        expect(row, spelling, code, err)


def test_the_table_has_no_spelling_the_tools_do_not_list(torchrun_help, msrun_help):
    listed: Dict[str, set] = {
        "torchrun": {normalize_token(s) for spellings, _ in torchrun_help for s in spellings},
        "msrun": {normalize_token(s) for spellings, _ in msrun_help for s in spellings},
    }
    for row in optiontable.ROWS:
        for tool, column in (("torchrun", row.torchrun), ("msrun", row.msrun)):
            if column:
                assert normalize_token(column) in listed[tool], f"{row.name}: {tool} has no {column}"
