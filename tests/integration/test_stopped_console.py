"""A console nobody reads never stops the supervisor (issue 17, item 5).

The launcher's stdout is a pipe that the test never reads: once the pipe and the launcher's bounded
console buffer are full, console output is dropped and counted, while the ranks keep running, a failed
rank is reaped and restarted, prestop is answered, and the rank log files hold every byte.
"""

import os

from tests.integration.test_gasp import prestop

LINES = 60000  # ~2.3 MB per rank and attempt on the console: more than a pipe plus the 1 MiB buffer


def expected_prefix(rank: int, attempt: int) -> bytes:
    return b"".join(b"line %d from rank %d attempt %d\n" % (i, rank, attempt) for i in range(LINES))


def test_unread_stdout_pipe_does_not_block_the_launcher(launcher, tmp_path):
    read_end, write_end = os.pipe()  # never read until the launcher is gone
    try:
        launcher.start(["--nproc-per-node", "2", "--max-restarts", "1"],
                       ["--print-lines", str(LINES), "--fail-rank", "1", "--exit-code", "3"], stdout=write_end)
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
    dropped = launcher.events("console_dropped")
    assert len(dropped) == 1 and dropped[0]["bytes"] > 0 and dropped[0]["lines"] > 0, dropped
    err = launcher.stderr
    assert "Traceback" not in err, err
    assert err.count("is not taking output") == 1, err
    assert f"the console did not take {dropped[0]['bytes']} bytes ({dropped[0]['lines']} lines)" in err


def full_pipe():
    """A pipe whose buffer is already full and that nobody reads: the next write would block."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def test_unread_stderr_pipe_does_not_block_the_launcher(launcher, tmp_path):
    """The launcher's own log lines go to a full, unread stderr: the job still runs and restarts, and
    ends with the rank's exit code."""
    read_end, write_end = full_pipe()
    try:
        launcher.start(["--nproc-per-node", "2", "--max-restarts", "1"],
                       ["--fail-rank", "1", "--exit-code", "5", "--fail-attempts", "0,1"], stderr=write_end)
        os.close(write_end)
        write_end = -1
        assert launcher.wait(60) == 5
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    assert [e["attempt"] for e in launcher.events("attempt_start")] == [0, 1]
    assert "[rank 1] rank 1 failing now" in launcher.stdout


def test_latest_that_is_a_real_directory_is_left_alone(launcher, tmp_path):
    """``latest`` is the user's own directory: the run goes on, says once why the link is not updated,
    and leaves no ``latest.<pid>`` behind."""
    (launcher.log_dir / "latest").mkdir(parents=True)
    code = launcher.run(["--nproc-per-node", "1"], ["--run", "0"])
    assert code == 0, launcher.stderr
    assert sorted(p.name for p in launcher.log_dir.iterdir() if p.name.startswith("latest")) == ["latest"]
    assert (launcher.log_dir / "latest").is_dir() and not (launcher.log_dir / "latest").is_symlink()
    assert launcher.stderr.count("is a directory, not the launcher's link") == 1, launcher.stderr
