"""What a real rank's environment does: unbuffered output, and the same job id as ``--dry-run``."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.launch import cli
from tests.helpers.procs import free_port

REPO = Path(__file__).resolve().parents[2]
LAST_WORDS = str(REPO / "tests" / "workers" / "last_words.py")


def launcher(tmp: Path, *options: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the user did not ask for it
    return cli("run", "--nproc-per-node", "1", "--run-dir", tmp / "run", "--log-dir", tmp / "logs", *options, "--",
               sys.executable, LAST_WORDS, cwd=tmp, env=env)


def test_a_sigkilled_ranks_last_line_is_in_its_log(tmp_path):
    result = launcher(tmp_path)
    assert "killed by SIGKILL" in result.stderr
    log = (tmp_path / "logs" / "latest" / "attempt_0" / "rank_0.log").read_text()
    assert "last words of rank 0 job " in log, result.stderr


def test_the_run_uses_the_job_id_the_dry_run_shows(tmp_path):
    # A fixed port: without one a one-node job gets a free port, and with it a fresh job id, per invocation.
    port = str(free_port())
    dry = launcher(tmp_path, "--master-port", port, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = {r["env"]["JOB_ID"] for r in json.loads(dry.stdout)["ranks"]}
    assert len(planned) == 1
    run = launcher(tmp_path, "--master-port", port)
    ran = set(re.findall(r"last words of rank 0 job (\S+)", run.stdout))
    assert ran == planned, run.stdout + run.stderr
