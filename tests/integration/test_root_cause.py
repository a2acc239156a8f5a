"""The root-cause summary with real ranks: the exception, even when it is not in the log's last lines."""

from pathlib import Path

PROBE = str(Path(__file__).resolve().parents[1] / "workers" / "env_probe.py")


def test_summary_shows_the_exception_printed_before_other_output(launcher, tmp_path):
    """Rank 1 raises, then 20 lines of shutdown output follow: the summary still shows the exception."""
    code = launcher.run(["--nproc-per-node", "2"], ["--out", str(tmp_path / "out"), "--mode", "raise-noisy"],
                        worker=PROBE)
    assert code == 1, launcher.stderr
    err = launcher.stderr
    assert "exception: ValueError: probe failure on rank 1" in err
    assert 'raise ValueError(f"probe failure on rank {rank}")' in err
    assert "line(s) of" not in err  # no fallback to the log's last lines


def test_summary_without_a_traceback_shows_the_last_lines(launcher, tmp_path):
    code = launcher.run(["--nproc-per-node", "2"], ["--out", str(tmp_path / "out"), "--mode", "exit3"],
                        worker=PROBE)
    assert code == 3, launcher.stderr
    assert "first failure of the last attempt was rank 1 (exit code 3)" in launcher.stderr
    assert "    probe rank 1 failing with exit3" in launcher.stderr
    assert "exception:" not in launcher.stderr
