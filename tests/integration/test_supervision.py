"""``launcher run`` supervising real processes: restarts, budgets, signals, orphans, logs."""

import signal
import time

import psutil

from tests.helpers.launch import Launcher
from tests.helpers.procs import pid_alive, wait_until


def test_crash_restarts_group_with_new_restart_count(launcher):
    code = launcher.run(["--nproc-per-node", "3", "--max-restarts", "2"],
                        ["--fail-rank", "1", "--exit-code", "3", "--run", "0.3"])
    assert code == 0, launcher.stderr
    lines = launcher.ready_lines()
    attempts = {(int(rank), int(attempt)) for rank, attempt, *_ in lines}
    assert {(r, 1) for r in range(3)} <= attempts  # every rank saw TORCHELASTIC_RESTART_COUNT=1
    assert not any(a == 2 for _, a in attempts)
    events = launcher.events()
    failed = [e for e in events if e["event"] == "rank_exited" and e["state"] == "failed"]
    assert [(e["rank"], e["exit_code"], e["attempt"]) for e in failed] == [(1, 3, 0)]
    assert [e["attempt"] for e in events if e["event"] == "restart"] == [1]
    session = launcher.log_dir / "latest"
    for attempt in (0, 1):  # logs of every attempt are kept, never overwritten
        assert (session / f"attempt_{attempt}" / "rank_1.log").exists()
    assert "rank 1 failing now" in (session / "attempt_0" / "rank_1.log").read_text()
    assert "rank 1 attempt 1" in (session / "attempt_1" / "rank_1.log").read_text()


def test_budget_spent_exits_with_first_failure_code_and_summary(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1"],
                        ["--fail-rank", "1", "--fail-attempts", "0,1", "--exit-code", "7"])
    assert code == 7
    err = launcher.stderr
    assert "rank 1 (exit code 7)" in err
    assert "earlier failures: attempt 0 rank 1 exit code 7" in err
    assert "rank 1 failing now" in err  # the last lines of its log
    assert launcher.events()[-1]["event"] == "stop"


def test_rank_killed_by_signal_gives_128_plus_signal(launcher):
    code = launcher.run(["--nproc-per-node", "2"], ["--fail-rank", "0", "--fail-signal", "SIGSEGV"])
    assert code == 128 + signal.SIGSEGV
    assert "killed by SIGSEGV" in launcher.stderr


def test_sigterm_is_forwarded_once_and_ranks_exit(launcher):
    launcher.start(["--nproc-per-node", "3", "--grace-period", "10"], ["--term-delay", "0.2"])
    launcher.wait_ready(3)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(20) == 128 + signal.SIGTERM
    terms = launcher.ready_lines(".term")
    assert sorted(int(rank) for rank, *_ in terms) == [0, 1, 2]  # each rank exactly once
    assert not any(e["event"] == "kill_group" for e in launcher.events())


def test_rank_ignoring_sigterm_is_killed_after_grace_period(launcher):
    launcher.start(["--nproc-per-node", "2", "--grace-period", "0.5"], ["--ignore-term"])
    pids = [int(line[2]) for line in launcher.wait_ready(2)]
    started = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(20) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 8
    assert not any(pid_alive(p) for p in pids)
    kills = launcher.events("kill_group")
    assert kills and sorted(kills[0]["ranks"]) == [0, 1]
    exits = {e["rank"]: e for e in launcher.events() if e["event"] == "rank_exited"}
    assert {e["signal"] for e in exits.values()} == {"SIGKILL"}


def test_grandchild_dies_with_its_rank(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--stop-timeout", "2"],
                        ["--child", "--fail-rank", "0", "--exit-code", "2"])
    assert code == 2
    children = [int(pid) for _, pid in launcher.ready_lines(".child")]
    assert len(children) == 2
    assert wait_until(lambda: not any(pid_alive(p) for p in children), 5)


def test_previous_attempt_is_gone_before_the_next_starts(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1"],
                        ["--child", "--fail-rank", "1", "--run", "0.5"])
    assert code == 0, launcher.stderr
    events = launcher.events()
    ends = [e["ts"] for e in events if e["event"] == "attempt_end"]
    starts = [e["ts"] for e in events if e["event"] == "attempt_start"]
    assert ends[0] <= starts[1]
    # ensure_gone ran before attempt 1: no attempt-0 grandchild outlived attempt 0
    first_children = [int(pid) for _, pid in launcher.ready_lines(".child")[:2]]
    assert not any(pid_alive(p) for p in first_children)


def test_launcher_sigkilled_leaves_no_survivors(launcher):
    launcher.start(["--nproc-per-node", "3"], ["--child"])
    ranks = [int(line[2]) for line in launcher.wait_ready(3)]
    children = [int(pid) for _, pid in launcher.wait_ready(3, ".child")]
    launcher.proc.kill()
    launcher.wait()
    assert wait_until(lambda: not any(pid_alive(p) for p in ranks + children), 5), \
        [p for p in ranks + children if pid_alive(p)]


def test_orphaned_grandchildren_are_reaped(launcher):
    launcher.start(["--nproc-per-node", "2"], ["--orphan", "--run", "1.5"])
    launcher.wait_ready(2)
    me = psutil.Process(launcher.proc.pid)

    def zombies():
        return [c.pid for c in me.children() if c.status() == psutil.STATUS_ZOMBIE]

    time.sleep(0.6)  # the double-forked grandchildren exit 0.2 s after start
    assert zombies() == []
    assert launcher.wait(20) == 0


def test_console_prefix_and_rank_filter(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--console-ranks", "1"], ["--print-lines", "3", "--run", "0"])
    assert code == 0
    out = launcher.stdout
    assert "[rank 1] line 2 from rank 1 attempt 0" in out
    assert "[rank 0]" not in out
    rank0 = (launcher.log_dir / "latest" / "attempt_0" / "rank_0.log").read_text()
    assert "line 2 from rank 0" in rank0  # hidden from the console, still in its file
    assert "[launcher]" in launcher.stderr and "[rank" not in launcher.stderr


def test_second_launcher_on_same_run_dir_is_refused(launcher, tmp_path):
    launcher.start(["--nproc-per-node", "1"], [])
    launcher.wait_ready(1)
    other = Launcher(tmp_path / "other", run_dir=launcher.run_dir)
    assert other.run(["--nproc-per-node", "1"], []) == 1
    assert "another launcher" in other.stderr
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait() == 143


def test_a_sigkilled_launcher_is_reported_by_the_next_one(launcher):
    launcher.start(["--nproc-per-node", "1"], [])
    launcher.wait_ready(1)
    launcher.proc.kill()
    launcher.wait()
    assert launcher.run(["--nproc-per-node", "1"], ["--run", "0"]) == 0
    unclean = launcher.events("unclean_previous_run")
    assert len(unclean) == 1 and unclean[0]["previous_pid"] == launcher.events()[0]["launcher_pid"]
    assert launcher.run(["--nproc-per-node", "1"], ["--run", "0"]) == 0  # a clean end is not reported
    assert len(launcher.events("unclean_previous_run")) == 1


def _restarts(launcher):
    return launcher.events("restart") if (launcher.run_dir / "events.jsonl").exists() else []


def test_crash_loop_backs_off_instead_of_spinning(launcher):
    """Issue #17.6: a rank failing at once on every attempt, --max-restarts 50, default backoff."""
    attempts = ",".join(str(n) for n in range(60))
    launcher.start(["--nproc-per-node", "1", "--max-restarts", "50"],
                   ["--fail-rank", "0", "--fail-attempts", attempts])
    assert wait_until(lambda: len(_restarts(launcher)) >= 4, 30), launcher.stderr
    launcher.proc.send_signal(signal.SIGTERM)  # during the 2 s wait: the backoff stays responsive
    assert launcher.wait(30) == 128 + signal.SIGTERM
    delays = [r["backoff"] for r in _restarts(launcher)]
    assert len(delays) >= 4 and delays == [0, 0.5, 1, 2, 4, 8, 16][:len(delays)]  # before: all 0
    assert [e["reason"] for e in launcher.events("job_end")] == ["gasp"]


def test_attempt_log_dirs_are_bounded(launcher):
    attempts = ",".join(str(n) for n in range(30))
    code = launcher.run(["--nproc-per-node", "1", "--max-restarts", "25", "--restart-backoff-max", "0"],
                        ["--fail-rank", "0", "--fail-attempts", attempts], timeout=120)
    assert code == 1
    session = launcher.log_dir / "latest"
    kept = sorted(int(p.name.split("_")[1]) for p in session.iterdir() if p.name.startswith("attempt_"))
    assert kept == [0] + list(range(6, 26))  # the first and the newest 20
    pruned = launcher.events("attempt_logs_pruned")
    assert sorted(n for e in pruned for n in e["removed"]) == list(range(1, 6))
