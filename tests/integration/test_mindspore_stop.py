"""Ctrl-C and SIGTERM on a MindSpore job without a rank table, under the launcher and under msrun.

The job is examples/mindspore/train.py on CPU: the dynamic-cluster scheduler (``MS_ROLE=MS_SCHED``,
which ignores SIGTERM) plus two workers. The workers save and stop within milliseconds of the signal;
the launcher used to wait for the scheduler until the grace period (25 s) ran out. The test measures
the stop under both tools and asserts only that the launcher's is far below the grace period (timings
on a shared machine are not asserted tightly; docs/cpu-binding.md records the numbers).
"""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.launch import Launcher
from tests.helpers.procs import free_port, wait_until

pytest.importorskip("mindspore")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "mindspore" / "train.py")
MSRUN = os.path.join(os.path.dirname(sys.executable), "msrun")
GRACE = 25.0  # the launcher's default --grace-period
# Endless training at a human pace: the signal always lands mid-run.
TRAIN = ["--epochs", "1", "--steps-per-epoch", "100000", "--log-every", "5", "--step-time", "0.05",
         "--save-steps", "1000000"]


def _start(tool: str, tmp: Path) -> subprocess.Popen:
    """``tool`` on the example, its output (both streams) in ``tmp/stdout.txt``, logs in ``tmp/logs``."""
    args = [EXAMPLE, *TRAIN, "--ckpt-dir", str(tmp / "ckpt")]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    if tool == "launcher":
        job = Launcher(tmp, env=env, merge_output=True)
        return job.start(["--framework", "mindspore", "--nproc-per-node", "2", "--master-port", str(free_port())],
                         command=[sys.executable, *args])
    argv = [MSRUN, "--worker_num", "2", "--local_worker_num", "2", "--master_port", str(free_port()),
            "--log_dir", str(tmp / "logs"), "--join", "True", *args]
    with open(tmp / "stdout.txt", "wb") as out:
        return subprocess.Popen(argv, cwd=str(tmp), stdout=out, stderr=subprocess.STDOUT, env=env)


def _output(tmp: Path) -> str:
    text = (tmp / "stdout.txt").read_text(errors="replace")
    return text + "".join(Path(p).read_text(errors="replace") for p in glob.glob(str(tmp / "logs" / "*.log")))


def _stop_seconds(tool: str, tmp: Path, signum: int) -> tuple:
    """Start ``tool``, wait until both workers train, send ``signum``; (seconds to exit, exit code)."""
    tmp.mkdir()
    proc = _start(tool, tmp)
    try:
        assert wait_until(lambda: _output(tmp).count(" step 10/") >= 2 or proc.poll() is not None, 150), \
            _output(tmp)[-3000:]
        assert proc.poll() is None, _output(tmp)[-3000:]
        began = time.monotonic()
        proc.send_signal(signum)
        code = proc.wait(GRACE + 20)
        return time.monotonic() - began, code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_launcher_stops_a_mindspore_job_without_waiting_for_the_scheduler(tmp_path):
    """Ctrl-C; SIGTERM (the dying gasp) takes the same path in the supervisor (tests/unit/supervision/test_supervisor.py)."""
    signum = signal.SIGINT
    seconds, code = _stop_seconds("launcher", tmp_path / "launcher", signum)
    out = _output(tmp_path / "launcher")
    assert code == 128 + signum, out[-3000:]
    assert "scheduler did not exit in time" not in out
    assert out.count("exception_save wrote the breakpoint") == 2  # the workers still saved
    assert seconds < GRACE / 3, f"stop took {seconds:.1f} s"
    print(f"launcher {signal.Signals(signum).name}: stopped in {seconds:.2f} s")


def test_msrun_reference_stop_on_ctrl_c(tmp_path):
    """msrun SIGKILLs its workers and scheduler on Ctrl-C (no save): the launcher is in the same range."""
    seconds, code = _stop_seconds("msrun", tmp_path / "msrun", signal.SIGINT)
    assert code == 0  # msrun's SIGINT handler exits 0
    assert seconds < GRACE / 3
    print(f"msrun SIGINT: stopped in {seconds:.2f} s")
