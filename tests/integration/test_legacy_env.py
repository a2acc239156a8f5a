"""The legacy MindX DL scripts' per-rank variables (tests/data/legacy_env.yaml) against ``--dry-run --json``.

The table holds, per framework, each variable the scripts document: the value they gave on one rank
table (measured by running the real train_start.sh, or read from main.sh) and whether the launcher
gives the same value or, deliberately, another one and why.
"""

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from tests.helpers.launch import cli

DATA = Path(__file__).resolve().parents[1] / "data"
TABLE = yaml.safe_load((DATA / "legacy_env.yaml").read_text())
REPO = DATA.parents[1]


def dry_run(framework: str, tmp_path: Path) -> Dict[int, Dict[str, str]]:
    """``launcher run --dry-run --json`` on the table's rank table, from a directory where its path is
    relative (the ranks must still get an absolute RANK_TABLE_FILE); rank -> env."""
    # Without the variables the launcher reads or inherits: the dry run shows only what it sets itself.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK_TABLE_FILE", "MINDX_TASK_ID", "framework", "PYTHONUNBUFFERED", "HCCL_IF_IP")}
    env.update(XDL_IP=TABLE["server_ip"], POD_IP=TABLE["server_ip"],
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    proc = cli("run", "--dry-run", "--json", "--framework", framework, "--rank-table", TABLE["rank_table"],
               "--run-id", TABLE["run_id"], "--run-dir", tmp_path / "run", "--", sys.executable, "train.py",
               cwd=DATA, env=env)
    assert proc.returncode == 0, proc.stderr
    return {r["rank"]: r["env"] for r in json.loads(proc.stdout)["ranks"] if r["role"] == "worker"}


def per_rank(value) -> List:
    """A table value as one entry per rank of ``ranks`` (a scalar applies to every rank)."""
    return list(value) if isinstance(value, list) else [value] * len(TABLE["ranks"])


def expected_values(entry: dict) -> List:
    legacy = entry["measured"] if "measured" in entry else entry["read"]
    if entry["launcher"] == "same":
        return per_rank(legacy)
    assert entry.get("why"), "a deliberate difference says why"
    launcher = entry["launcher"]
    if isinstance(launcher, str):
        launcher = launcher.format(rank_table=str(DATA / TABLE["rank_table"]), run_id=TABLE["run_id"])
    return per_rank(launcher)


@pytest.mark.parametrize("framework", sorted(TABLE["frameworks"]))
def test_documented_variables_match_the_table(framework, tmp_path):
    envs = dry_run(framework, tmp_path)
    assert sorted(envs) == TABLE["ranks"]
    mismatches = []
    for name, entry in TABLE["frameworks"][framework]["variables"].items():
        got = [envs[rank].get(name) for rank in TABLE["ranks"]]
        if got != expected_values(entry):
            mismatches.append(f"{name}: launcher {got}, table {expected_values(entry)}")
    assert not mismatches, "\n".join(mismatches)


def test_every_entry_is_sourced():
    for framework, spec in TABLE["frameworks"].items():
        for name, entry in spec["variables"].items():
            assert entry.get("meaning"), (framework, name)
            assert ("measured" in entry) != ("read" in entry), (framework, name)
            assert entry["launcher"] == "same" or entry.get("why"), (framework, name)
