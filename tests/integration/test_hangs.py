"""The hang detector with real processes: ranks that hang in different ways are found, their stacks
and every other rank's are dumped, and the job recovers as from a failure (``--heartbeat-timeout``).

Timeouts here are short (1-2 s) so that the tests run quickly; no assertion is about timing (the
detection latency and dump time are measured in ``bench/hang.py``).
"""

import time

import pytest

from tests.helpers.paths import REPO

HANG_RANK = str(REPO / "tests" / "workers" / "hang_rank.py")
GLOO_HANG = str(REPO / "tests" / "workers" / "gloo_hang.py")


def named(events, name):
    return [e for e in events if e["event"] == name]


def dumped(launcher, rank):
    return (launcher.run_dir / "heartbeats" / "attempt_0" / f"stacks_rank_{rank}.txt").read_text()


def test_rank_sleeping_forever_is_dumped_failed_and_the_job_restarts(launcher):
    code = launcher.run(["--nproc-per-node", "4", "--max-restarts", "1", "--heartbeat-timeout", "1"], ["--mode", "sleep"],
                        worker=HANG_RANK)
    assert code == 0, launcher.stderr
    events = launcher.events()
    [hang] = named(events, "hang_detected")
    assert (hang["attempt"], hang["rank"], hang["hung_ranks"], hang["step"]) == (0, 1, [1], 2)
    [stacks] = named(events, "stacks_dumped")
    assert stacks["sources"] == {str(r): "py-spy" for r in range(4)}
    assert stacks["diagnosis"][0].startswith("rank 1 (hung) differs from the rest: in hang_here (hang_rank.py:")
    assert stacks["diagnosis"][1].startswith("ranks 0,2,3: in healthy_wait (hang_rank.py:")
    assert all("hang_rank.py" in dumped(launcher, r) for r in range(4))
    [restart] = named(events, "restart")
    assert restart["after_rank"] == 1
    assert events.index(stacks) < events.index(named(events, "stop_group")[0])  # stacks before any kill
    assert "rank 1 is hung" in launcher.stderr


def test_rank_in_a_c_call_holding_the_gil_is_read_by_py_spy(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--heartbeat-timeout", "1"], ["--mode", "gil"], worker=HANG_RANK)
    assert code == 137
    [stacks] = named(launcher.events(), "stacks_dumped")
    assert stacks["sources"]["1"] == "py-spy"
    assert "in hang_here (hang_rank.py:" in stacks["diagnosis"][0]
    assert "rank 1 was killed as hung: no heartbeat or output" in launcher.stderr  # the root-cause summary


def test_script_without_heartbeats_is_judged_by_its_output_and_a_closed_stderr_is_silence(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--heartbeat-timeout", "1"], ["--mode", "no-stderr", "--no-client"],
                        worker=HANG_RANK)
    assert code == 137
    [hang] = named(launcher.events(), "hang_detected")
    assert hang["hung_ranks"] == [1] and hang["step"] is None  # rank 0 kept printing: not hung
    assert "hang_here" in dumped(launcher, 1)


def test_a_rank_that_exits_0_early_is_not_hung_and_a_later_hang_of_another_is_found(launcher):
    # Rank 1 exits 0 at once, silent; rank 0 prints for longer than the timeout, then sleeps forever.
    code = launcher.run(["--nproc-per-node", "2", "--heartbeat-timeout", "1"],
                        ["--no-client", "--early-exit-rank", "1", "--hang-rank", "0", "--steps", "8",
                         "--step-pause", "0.3"], worker=HANG_RANK, timeout=30)
    assert code == 137, launcher.stderr
    events = launcher.events()
    [hang] = named(events, "hang_detected")
    assert (hang["rank"], hang["hung_ranks"]) == (0, [0])
    [exited] = [e for e in named(events, "rank_exited") if e["rank"] == 1]
    assert exited["state"] == "succeeded"
    assert "rank 0 was killed as hung: no heartbeat or output" in launcher.stderr


def test_section_timeout_applies_inside_the_named_section(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--heartbeat-timeout", "60", "--section-timeout", "checkpoint=1"],
                        ["--mode", "section"], worker=HANG_RANK)
    assert code == 137
    [hang] = named(launcher.events(), "hang_detected")
    assert hang["section"] == "checkpoint" and "in section 'checkpoint'" in hang["reason"]


def test_faulthandler_fallback_without_py_spy(launcher, monkeypatch):
    monkeypatch.setenv("LAUNCHER_PY_SPY", "")
    code = launcher.run(["--nproc-per-node", "3", "--heartbeat-timeout", "1"], ["--mode", "sleep"], worker=HANG_RANK)
    assert code == 137
    [stacks] = named(launcher.events(), "stacks_dumped")
    assert stacks["sources"] == {"0": "faulthandler", "1": "faulthandler", "2": "faulthandler"}
    assert stacks["diagnosis"][0].startswith("rank 1 (hung) differs from the rest: in hang_here")
    assert 'in hang_here' in dumped(launcher, 1)


def test_crash_loop_at_one_step_ends_after_max_no_progress_restarts(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "5", "--max-no-progress-restarts", "2"],
                        ["--mode", "crash", "--hang-attempts", "0,1,2,3,4,5"], worker=HANG_RANK)
    assert code == 93  # the job cannot progress (--no-progress-exit-code)
    events = launcher.events()
    assert len(named(events, "attempt_start")) == 3
    [stuck] = named(events, "no_progress")
    assert (stuck["step"], stuck["restarts"]) == (2, 2)
    assert "got no further than step 2" in launcher.stderr


def test_off_by_default_a_sleeping_rank_is_left_alone(launcher):
    launcher.start(["--nproc-per-node", "2"], ["--mode", "sleep"], worker=HANG_RANK)
    launcher.wait_ready(2)
    launcher.proc.terminate()
    launcher.wait(30)
    assert not named(launcher.events(), "hang_detected")
    assert not (launcher.run_dir / "heartbeats").exists()


@pytest.mark.slow
def test_gloo_all_reduce_blocked_by_a_rank_that_stopped_calling_it(launcher):
    pytest.importorskip("torch")
    code = launcher.run(["--nproc-per-node", "4", "--max-restarts", "1", "--heartbeat-timeout", "2",
                         "--heartbeat-initial-timeout", "120"], [], worker=GLOO_HANG, timeout=240)
    assert code == 0, launcher.stderr
    events = launcher.events()
    # Every hang of the attempt is reported: on a loaded machine rank 1 itself may be judged hung
    # (silent in its data loader) a moment after the first dump, before the stop settles it.
    dumps = named(events, "stacks_dumped")
    assert dumps and all(d["attempt"] == 0 for d in dumps), dumps
    stacks = dumps[0]
    assert stacks["diagnosis"][0].startswith("rank 1 (hung) differs from the rest: in wait_for_data (gloo_hang.py:")
    assert stacks["diagnosis"][1].startswith("ranks 0,2,3 (hung): in all_reduce (distributed_c10d.py:")
    assert stacks["failing_rank"] == 1
    assert named(events, "restart")[0]["after_rank"] == 1


def test_a_rank_stepping_slower_than_its_peers_is_named_a_straggler(launcher):
    launcher.start(["--nproc-per-node", "3", "--straggler-threshold", "0.5"], ["--mode", "slow"], worker=HANG_RANK)
    launcher.wait_ready(3)
    deadline = time.monotonic() + 60
    while not named(launcher.events(), "straggler") and time.monotonic() < deadline and launcher.proc.poll() is None:
        time.sleep(0.2)  # polling the events file for the detector's verdict, not waiting blindly
    launcher.proc.terminate()
    launcher.wait(30)
    stragglers = named(launcher.events(), "straggler")
    assert [s["rank"] for s in stragglers] == [1], launcher.stderr
    assert stragglers[0]["steps_per_s"] < stragglers[0]["peers_median"] * 0.5
    assert not named(launcher.events(), "hang_detected")
