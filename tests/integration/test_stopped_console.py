"""A console nobody reads never stops the supervisor (issue 17, item 5).

The launcher's stdout is a pipe that the test never reads: once the pipe and the launcher's bounded
console buffer are full, console output is dropped and counted, while the ranks keep running, a failed
rank is reaped and restarted, prestop is answered, and the rank log files hold every byte.
"""

import os
import subprocess
import sys

from tests.integration.test_gasp import prestop

LINES = 60000  # ~2.3 MB per rank and attempt on the console: more than a pipe plus the 1 MiB buffer


def expected_prefix(rank: int, attempt: int) -> bytes:
    return b"".join(b"line %d from rank %d attempt %d\n" % (i, rank, attempt) for i in range(LINES))


def test_unread_stdout_pipe_does_not_block_the_launcher(launcher, tmp_path):
    read_end, write_end = os.pipe()  # never read until the launcher is gone
    try:
        launcher.err = open(tmp_path / "stderr.txt", "wb")
        launcher.out = open(os.devnull, "wb")
        launcher.proc = subprocess.Popen(
            launcher.argv(["--nproc-per-node", "2", "--max-restarts", "1"],
                          ["--print-lines", str(LINES), "--fail-rank", "1", "--exit-code", "3"]),
            stdout=write_end, stderr=launcher.err, cwd=str(tmp_path))
        os.close(write_end)
        write_end = -1
        launcher.wait_ready(4, timeout=60)  # rank 1 failed on attempt 0, was reaped and restarted
        result = prestop(launcher.run_dir, timeout=30)
        assert result.returncode == 0, result.stderr
        assert launcher.wait(30) == 143, launcher.stderr
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    logs = launcher.log_dir / "latest"
    for attempt in (0, 1):
        for rank in (0, 1):
            data = (logs / f"attempt_{attempt}" / f"rank_{rank}.log").read_bytes()
            want = expected_prefix(rank, attempt)
            assert data[:len(want)] == want, (attempt, rank, len(data), len(want))  # every byte, in order
            assert b"rank %d attempt %d pid" % (rank, attempt) in data[len(want):]
    dropped = [e for e in launcher.events() if e["event"] == "console_dropped"]
    assert len(dropped) == 1 and dropped[0]["bytes"] > 0 and dropped[0]["lines"] > 0, dropped
    err = launcher.stderr
    assert "Traceback" not in err, err
    assert err.count("is not taking output") == 1, err
    assert f"the console did not take {dropped[0]['bytes']} bytes ({dropped[0]['lines']} lines)" in err
