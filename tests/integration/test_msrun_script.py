"""An msrun script runs unchanged under ``launcher run --framework mindspore`` (issue #10, item 1).

tests/workers/ms_data_parallel.py is a stock GRAPH_MODE + DATA_PARALLEL + TrainOneStepCell script.
It passes under msrun; before the fix it failed under the launcher with "Invalid communication
backend: CPU for semi_auto_parallel/auto_parallel mode" because every rank got GROUP_INFO_FILE.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import cli
from tests.helpers.procs import free_port

pytest.importorskip("mindspore")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "workers" / "ms_data_parallel.py")
OK_LINES = {"rank 0 of 2 ok", "rank 1 of 2 ok"}


def ok_lines(text: str) -> set:
    return {line.split(" loss=")[0].split("] ", 1)[-1] for line in text.splitlines() if " ok loss=" in line}


def test_the_script_passes_under_msrun(tmp_path):
    """The reference: msrun runs `python SCRIPT` per worker, so the venv's python goes first on PATH."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "msrun"), "--worker_num", "2",
                           "--local_worker_num", "2", "--master_port", str(free_port()), "--log_dir",
                           str(tmp_path / "logs"), "--join", "True", SCRIPT], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("worker_*.log"))
    assert proc.returncode == 0, proc.stdout[-3000:] + logs[-3000:]
    assert ok_lines(logs) == OK_LINES


def test_the_same_script_passes_under_the_launcher(tmp_path):
    proc = cli("run", "--nproc-per-node", "2", "--framework", "mindspore", "--master-port", str(free_port()),
               "--run-dir", tmp_path / "run", "--", sys.executable, SCRIPT, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ok_lines(proc.stdout) == OK_LINES
    assert not (tmp_path / "run" / "group_info").exists()  # no --group-info-root: no device dirs either
