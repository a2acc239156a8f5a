"""What a rank's stdout is under the launcher, and whether the log benchmark's direct baseline buffers
its writers the same way (``bench/logs.py``: a baseline buffered unlike the ranks measured the
buffering, a 5.6x "gap", not the launcher)."""

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from bench import logs as bench_logs
from tests.helpers.launch import cli
from bench.common import TempDir, job_env

REPO = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, str(REPO / "tests" / "workers" / "stdio_probe.py")]


def files_only_rank(tmp: Path, env: Dict[str, str]) -> dict:
    """The probe's report as rank 0 of ``launcher run --console-ranks none``."""
    done = cli("run", "--nproc-per-node", "1", "--run-dir", tmp / "run", "--log-dir", tmp / "logs",
               "--console-ranks", "none", "--", *PROBE, env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp / "logs" / "latest" / "attempt_0" / "rank_0.log").read_text())


def without_pythonunbuffered() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the user did not ask


def test_a_files_only_rank_writes_a_pipe_unbuffered(tmp_path):
    """A pipe the launcher splices into the file, never the file itself: a full log disk must not fail
    the rank's own write (issue 27, item 6)."""
    assert files_only_rank(tmp_path, without_pythonunbuffered()) == {
        "type": "pipe", "o_append": False, "tty": False, "stderr_is_stdout": True,
        "binary_layer": "FileIO", "write_through": True, "line_buffering": False}


@pytest.mark.parametrize("value", ["0", ""])
def test_a_pythonunbuffered_of_0_or_empty_leaves_a_rank_block_buffered(tmp_path, value):
    # The opt-out the README names: the launcher keeps a user's value, CPython reads "0" and "" as off.
    report = files_only_rank(tmp_path, dict(without_pythonunbuffered(), PYTHONUNBUFFERED=value))
    assert (report["binary_layer"], report["write_through"]) == ("BufferedWriter", False)


def bench_ranks(kind: str) -> List[dict]:
    """The probe's reports as the ranks of one bench job of ``kind``."""
    tmp = TempDir("stdio")
    with tmp:
        procs = bench_logs.start(kind, tmp, job_env(), None, PROBE)
        try:
            for proc in procs:
                assert proc.wait(60) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        files = bench_logs.rank_files(kind, tmp.sub("logs"))
        return [json.loads(Path(files[rank]).read_text()) for rank in sorted(files)]


#: What makes a writer buffered or not: the baseline must match the ranks in these. (The sink differs on
#: purpose: the direct writers write their files, as ranks without a launcher do; the launcher's ranks
#: write a pipe.)
BUFFERING = ("tty", "stderr_is_stdout", "binary_layer", "write_through", "line_buffering")


@pytest.mark.parametrize("suffix", ["", bench_logs.BUFFERED])
def test_the_log_benchmarks_direct_writers_are_buffered_as_a_files_only_rank(suffix):
    ours = bench_ranks("ours --console-ranks none" + suffix)
    direct = bench_ranks("direct" + suffix)
    assert len(ours) == len(direct) == bench_logs.NPROC
    assert [{k: r[k] for k in BUFFERING} for r in direct] == [{k: r[k] for k in BUFFERING} for r in ours]
    assert {r["type"] for r in direct} == {"file"} and {r["type"] for r in ours} == {"pipe"}
