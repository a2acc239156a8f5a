"""The first ranks of a run start before its restart loop is imported and built, where the loop would start
them at once (``launcher.run.session.Session._start_first_attempt``); the supervisor takes the attempt
over, and a run whose first attempt must wait (another node, a health check) is started by the loop."""

import signal
import sys

from tests.helpers.launch import Launcher

EARLY = "attempt 0's ranks start before the restart loop is built"


def verbose(argv):
    """``launcher -vv run ...``: the debug lines too."""
    return argv[:3] + ["-vv"] + argv[3:]


def test_a_plain_run_starts_its_ranks_first_and_the_integrations_see_the_attempt(tmp_path):
    job = Launcher(tmp_path, wrap=verbose)
    code = job.run(["--nproc-per-node", "2"], command=[sys.executable, "-c", "print('at once')"])
    assert code == 0, job.output
    assert EARLY in job.stderr
    names = [e["event"] for e in job.events()]
    assert names[:4] == ["start", "attempt_start", "rank_spawned", "rank_spawned"]
    # The integrations (OutputWatch here) saw the attempt start as with the supervisor's own start.
    assert sorted(e["rank"] for e in job.events("rank_output", attempt=0)) == [0, 1]


def test_a_run_whose_first_attempt_must_wait_is_started_by_the_restart_loop(tmp_path):
    job = Launcher(tmp_path, wrap=verbose)
    code = job.run(["--nproc-per-node", "1", "--sync-dir", tmp_path / "sync", "--run-id", "early"],
                   command=[sys.executable, "-c", "print('after the sync')"])
    assert code == 0, job.output
    assert EARLY not in job.stderr
    assert job.events("rank_output", attempt=0)


def test_a_stop_signal_to_an_early_started_attempt_stops_its_ranks_with_the_gasp(tmp_path):
    job = Launcher(tmp_path)
    job.start(["--nproc-per-node", "2", "--stop-timeout", "10"], ["--term-delay", "0.1"])
    job.wait_ready(2)
    job.send_signal(signal.SIGTERM)
    assert job.wait(30) == 128 + signal.SIGTERM, job.output
    assert job.events("gasp")
    assert sorted(e["rank"] for e in job.events("rank_exited")) == [0, 1]
