"""``launcher status`` against a real 4-rank job while a rank fails and the job restarts (issue #15)."""

import json
import math
import signal
import time

from tests.helpers.launch import Launcher, cli
from tests.helpers.paths import REPO
from tests.unit.monitoring.test_timeline import drawn as timeline_elements, ends_per_rank


def status(run_dir):
    done = cli("status", "--run-dir", run_dir, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def status_when(run_dir, predicate, timeout=30.0):
    """Poll status until ``predicate`` holds (state.json is written right after the ranks spawn)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = status(run_dir)
        if predicate(doc) or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


def test_status_follows_a_failure_and_restart_and_goodput_adds_up(tmp_path):
    job = Launcher(tmp_path)
    trigger = tmp_path / "fail-now"
    job.start(["--nproc-per-node", "4", "--max-restarts", "2"],
              ["--fail-rank", "2", "--exit-code", "7", "--fail-when", str(trigger)])
    try:
        first = {int(line[0]): int(line[2]) for line in job.wait_ready(4)}
        doc = status_when(job.run_dir, lambda d: d["attempt"] == 0 and len(d["ranks"]) == 4)
        assert (doc["status"], doc["attempt"], doc["restarts_left"]) == ("running", 0, 2)
        assert {r["rank"]: r["pid"] for r in doc["ranks"]} == first
        assert all(r["state"] == "running" and r["process"] in "RSD" for r in doc["ranks"])
        assert doc["goodput"]["failures"] == [] and doc["goodput"]["ended"] is False

        trigger.touch()
        second = {int(line[0]): int(line[2]) for line in job.wait_ready(8)[4:]}
        doc = status_when(job.run_dir, lambda d: d["attempt"] == 1)
        assert (doc["attempt"], doc["restarts_left"]) == (1, 1)
        assert {r["rank"]: r["pid"] for r in doc["ranks"]} == second
        assert all(r["state"] == "running" for r in doc["ranks"])
        [failure] = doc["goodput"]["failures"]
        assert (failure["attempt"], failure["rank"], failure["cause"]) == (0, 2, "exit code 7")
        assert failure["time_lost"] > 0
        assert math.isclose(sum(doc["goodput"]["parts"].values()), doc["goodput"]["wall"], abs_tol=0.01)
    finally:
        job.proc.send_signal(signal.SIGTERM)
        job.wait()
    doc = status(job.run_dir)
    good = doc["goodput"]
    assert doc["status"] == "ended" and good["ended"] is True
    ends = [e["ts"] for e in job.events() if e["event"] in ("start", "job_end")]
    assert math.isclose(good["wall"], ends[-1] - ends[0], abs_tol=0.002)
    assert math.isclose(sum(good["parts"].values()), good["wall"], abs_tol=0.01)
    # fake_rank never beats its step: the launcher cannot tell training apart, so nothing is productive
    assert good["parts"]["unknown"] > 0 and good["parts"]["productive"] == 0 and good["parts"]["restarting"] > 0
    assert good["ratio"] is None and good["ratio_bounds"][1] > 0
    assert [f["rank"] for f in good["failures"]] == [2]  # the SIGTERM at the end is stopping, not a failure
    assert "[launcher] " in job.stderr and "goodput " in job.stderr  # the end-of-run line
    drawn = cli("report", job.run_dir)
    assert drawn.returncode == 0, drawn.stderr
    elements = timeline_elements((job.run_dir / "timeline.html").read_text())
    ends = ends_per_rank(elements)
    assert ends[(2, 0)] == "failed" and {ends[(r, 0)] for r in (0, 1, 3)} == {"stopped"}
    assert {ends[(r, 1)] for r in range(4)} == {"stopped"}  # SIGTERM ended attempt 1
    assert [(e["data-rank"], e["data-attempt"]) for e in elements if e["data-kind"] == "failure"] == [("2", "0")]
    assert [e["data-attempt"] for e in elements if e["data-kind"] == "restart"] == ["1"]


def test_metrics_scraped_over_loopback_during_a_run(tmp_path):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def samples(text):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    job = Launcher(tmp_path)
    trigger, textfile = tmp_path / "fail-now", tmp_path / "launcher.prom"
    job.start(["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-port", "0",
               "--metrics-textfile", str(textfile)],
              ["--fail-rank", "1", "--exit-code", "7", "--fail-when", str(trigger)])
    try:
        job.wait_ready(2)
        trigger.touch()
        job.wait_ready(4)
        status_when(job.run_dir, lambda d: d["attempt"] == 1 and all(r["state"] == "running" for r in d["ranks"]))
        [address] = [e["address"] for e in job.events("metrics_listening")]
        assert address.startswith("127.0.0.1:")
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
            live = samples(answer.read().decode())
        assert live[("launcher_restarts_total", ())] == 1.0
        assert live[("launcher_failures_total", (("cause", "exit code 7"),))] == 1.0
        assert live[("launcher_attempt", ())] == 1.0 and live[("launcher_up", ())] == 1.0
        assert live[("launcher_time_lost_seconds_total", ())] > 0
    finally:
        job.proc.send_signal(signal.SIGTERM)
        job.wait()
    final = samples(textfile.read_text())
    assert final[("launcher_up", ())] == 0.0 and final[("launcher_gasps_total", ())] == 1.0
    assert final[("launcher_gasp_duration_seconds_count", ())] == 1.0


STEP_RANK = str(REPO / "tests" / "workers" / "step_rank.py")


def test_steps_recomputed_after_a_rank_fails_with_heartbeats(tmp_path):
    """Two ranks beat their steps (--heartbeat-timeout gives them slots) and checkpoint every 10 steps;
    rank 1 fails at step 15 and the restart resumes from 10: 5 steps recomputed, in status while the
    job runs, in the end-of-run line, the metrics and the timeline."""
    job = Launcher(tmp_path)
    ckpt, finish, textfile = tmp_path / "ckpt", tmp_path / "finish", tmp_path / "launcher.prom"
    job.start(["--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat-timeout", "60", "--checkpoint-dir",
               str(ckpt), "--dp", "2", "--metrics-textfile", str(textfile)],
              ["--ckpt-dir", str(ckpt), "--finish-when", str(finish), "--steps", "30", "--ckpt-every", "10",
               "--fail-at", "15", "--fail-rank", "1"], worker=STEP_RANK)
    try:
        job.wait_ready(4, timeout=60)
        job.wait_event("step_regained", timeout=60)
        doc = status(job.run_dir)
        assert doc["status"] == "running" and doc["attempt"] == 1
        [failure] = doc["goodput"]["failures"]
        assert (failure["attempt"], failure["rank"], failure["steps_recomputed"]) == (0, 1, 5)
        assert 0 < failure["recompute_seconds"] == doc["goodput"]["parts"]["recomputed"]
        assert math.isclose(sum(doc["goodput"]["parts"].values()), doc["goodput"]["wall"], abs_tol=0.01)
        events = job.events()
        assert [(e["attempt"], e["step"]) for e in events if e["event"] == "step_last"] == [(0, 15)]
        assert [(e["attempt"], e["step"]) for e in events if e["event"] == "restore_plan"][-1] == (1, 10)
        assert [(e["attempt"], e["step"]) for e in events if e["event"] == "step_regained"] == [(1, 15)]
    finally:
        finish.touch()
        code = job.wait(60)
    assert code == 0, job.stderr
    assert "1 failure(s), 5 steps recomputed" in job.stderr  # the end-of-run goodput line
    assert "launcher_steps_recomputed_total 5.0" in textfile.read_text()
    drawn = cli("report", job.run_dir)
    assert drawn.returncode == 0, drawn.stderr
    elements = timeline_elements((job.run_dir / "timeline.html").read_text())
    assert [e["data-steps-recomputed"] for e in elements if e["data-kind"] == "failure"] == ["5"]
    assert [e["data-attempt"] for e in elements if e["data-kind"] == "part" and e["data-part"] == "recomputed"] == ["1"]
