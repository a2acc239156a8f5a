"""Unit tests for ``launcher.monitoring.status`` and ``launcher status``: a run dir written by hand."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys

import pytest

from launcher.commands.cli import main
from launcher.common import rundir as rundir_mod
from launcher.monitoring.status import format_status, job_status
from tests.helpers.launch import launcher_command


def write_run_dir(path, ranks, live_pid, events, ended=None):
    """A run dir as `launcher run` leaves it: launcher.json, state.json, events.jsonl, lock."""
    path.mkdir(mode=0o700, parents=True)
    (path / rundir_mod.LOCK).write_text("")
    (path / rundir_mod.LAUNCHER).write_text(json.dumps({"pid": 4242, "started": 1000.0, "ended": ended}))
    (path / rundir_mod.STATE).write_text(json.dumps({"attempt": 1, "ranks": [
        {"rank": r, "pid": live_pid if r == 0 else 2 ** 22 + 7 + r, "create_time": None} for r in range(ranks)]}))
    (path / "events.jsonl").write_text("".join(json.dumps({"run_id": "r", **e}) + "\n" for e in events))
    return str(path)


EVENTS = [
    {"ts": 1000.0, "event": "start", "max_restarts": 3},
    {"ts": 1001.0, "event": "attempt_start", "attempt": 0, "ranks": [0, 1, 2]},
    *({"ts": 1002.0, "event": "rank_spawned", "attempt": 0, "rank": r} for r in range(3)),
    {"ts": 1010.0, "event": "rank_exited", "attempt": 0, "rank": 2, "state": "failed", "exit_code": 3,
     "signal": None, "exited_at": 1010.0},
    {"ts": 1011.0, "event": "attempt_end", "attempt": 0, "failed": True},
    {"ts": 1011.0, "event": "restart", "attempt": 1, "scope": "group", "restarts_left": 2},
    {"ts": 1011.5, "event": "restore_plan", "attempt": 1, "kind": "periodic", "step": 70, "reason": "newest"},
    {"ts": 1012.0, "event": "attempt_start", "attempt": 1, "ranks": [0, 1, 2]},
    *({"ts": 1013.0, "event": "rank_spawned", "attempt": 1, "rank": r} for r in range(3)),
    {"ts": 1014.0, "event": "rank_exited", "attempt": 1, "rank": 1, "state": "failed", "exit_code": 1,
     "signal": None, "exited_at": 1014.0},
    {"ts": 1015.0, "event": "cluster_update", "newly_faulty_local": [1], "hold": "FaultFlushing"},
    {"ts": 1016.0, "event": "cluster_hold", "reason": "FaultFlushing"},
    {"ts": 1017.0, "event": "heartbeat", "rank": 0, "step": 85},
]


@contextlib.contextmanager
def live(path: str):
    """The run dir ``path`` as a running launcher holds it (its lock taken)."""
    fd = os.open(os.path.join(path, rundir_mod.LOCK), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield path
    finally:
        os.close(fd)


@pytest.fixture
def live_job(tmp_path):
    with live(write_run_dir(tmp_path / "job", 3, os.getpid(), EVENTS)) as path:
        yield path


def test_status_of_a_live_job_in_its_second_attempt(live_job):
    doc = job_status(live_job, now=1020.0)
    assert (doc["status"], doc["attempt"], doc["restarts_left"], doc["launcher_pid"]) == ("running", 1, 2, 4242)
    rows = {row["rank"]: row for row in doc["ranks"]}
    assert rows[0]["state"] == "running" and rows[0]["process"] in ("R", "S")  # this very process
    assert rows[0]["heartbeat_age"] == 3.0 and rows[0]["step"] == 85
    assert rows[1]["state"] == "failed" and rows[1]["exit_code"] == 1  # recorded in attempt 1
    assert rows[2]["state"] == "gone" and rows[2]["process"] is None  # attempt 0's failure is history
    assert rows[2]["heartbeat_age"] is None and rows[2]["step"] is None
    assert doc["restore_plan"]["step"] == 70 and doc["restore_plan"]["kind"] == "periodic"
    assert doc["cluster"]["hold"] == "FaultFlushing" and doc["cluster"]["update"]["newly_faulty_local"] == [1]
    good = doc["goodput"]
    assert good["ended"] is False and good["wall"] == 20.0  # a live run ends "now"
    assert sum(good["parts"].values()) == pytest.approx(20.0)
    assert [f["rank"] for f in good["failures"]] == [2, 1]
    text = "\n".join(format_status(doc))
    assert "HOLD: FaultFlushing" in text and "restarts left 2" in text and "periodic step 70" in text
    assert "rank 2 exit code 3; lost 3.0s, steps recomputed unknown" in text  # no step numbers: not 0


def test_steps_recomputed_per_failure_are_shown(tmp_path):
    from tests.unit.monitoring.test_goodput import hangwatch_run

    doc = job_status(write_run_dir(tmp_path / "job", 1, 2 ** 22 + 1, hangwatch_run(), ended=233.0))
    assert doc["goodput"]["steps_recomputed"] == 15
    assert [(f["steps_recomputed"], f["recompute_seconds"]) for f in doc["goodput"]["failures"]] == [(10, 10.0),
                                                                                                    (5, 20.0)]
    text = "\n".join(format_status(doc))
    assert "10 steps recomputed in 10.0s" in text and "recomputed 30.0s" in text


def test_an_ended_job_and_a_dead_launcher(tmp_path):
    ended = write_run_dir(tmp_path / "a", 1, 2 ** 22 + 1, EVENTS[:2], ended=1030.0)
    died = write_run_dir(tmp_path / "b", 1, 2 ** 22 + 1, EVENTS[:2])
    assert job_status(ended)["status"] == "ended" and job_status(died)["status"] == "died"
    assert job_status(died)["ranks"][0]["state"] == "gone"


def test_cli_json_and_text(live_job, capsys, clean_env):
    assert main(["status", "--run-dir", live_job, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"] == "job" and len(doc["ranks"]) == 3
    assert main(["status", "--run-dir", live_job]) == 0
    assert "goodput" in capsys.readouterr().out


def test_cli_lists_the_jobs_when_several_run(tmp_path, monkeypatch, capsys, clean_env):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    base = tmp_path / "launcher"
    fds = []
    for name in ("one", "two"):
        path = write_run_dir(base / name, 1, os.getpid(), EVENTS[:2])
        fds.append(os.open(os.path.join(path, rundir_mod.LOCK), os.O_RDONLY))
        fcntl.flock(fds[-1], fcntl.LOCK_EX)
    try:
        assert main(["status"]) == 2
        err = capsys.readouterr().err
        assert "2 jobs are running" in err and "one" in err and "two" in err
        assert main(["status", "--job", "two", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["job"] == "two"
    finally:
        for fd in fds:
            os.close(fd)


def test_cli_without_any_job(tmp_path, monkeypatch, capsys, clean_env):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["status"]) == 1
    assert "no jobs under" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_watch_refreshes_in_place(live_job, tmp_path):
    proc = subprocess.Popen(launcher_command("status", "--run-dir", str(live_job), "--watch", "0.1"),
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        seen = b""
        while seen.count(b"\x1b[H\x1b[2J") < 2:
            seen += proc.stdout.read1(4096)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert b"job job  running" in seen


def test_heartbeat_slot_and_stragglers_are_shown(tmp_path):
    """A rank that beats through the real client (launcher_heartbeat, in a child process as a rank
    would) shows its step and a fresh age; a rank named a straggler this attempt is listed."""
    events = [*EVENTS, {"ts": 1018.0, "event": "straggler", "attempt": 1, "rank": 1, "steps_per_s": 0.5},
              {"ts": 1008.0, "event": "straggler", "attempt": 0, "rank": 2, "steps_per_s": 0.5}]
    path = write_run_dir(tmp_path / "job", 3, os.getpid(), events)
    slots = os.path.join(path, "heartbeats")
    os.mkdir(slots)
    hooks = os.path.join(os.path.dirname(os.path.abspath(__import__("launcher").__file__)), "rankhooks")
    code = ("import os, launcher_heartbeat as hb; hb.heartbeat(step=123); "
            "os.rename(os.environ['LAUNCHER_HEARTBEAT_FILE'], os.environ['SLOT'])")
    env = {**os.environ, "PYTHONPATH": hooks, "LAUNCHER_HEARTBEAT_FILE": os.path.join(slots, "tmp"),
           "SLOT": os.path.join(slots, "rank_0")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    doc = job_status(path, now=1020.0)
    rows = {row["rank"]: row for row in doc["ranks"]}
    assert rows[0]["step"] == 85  # the slot was written by another pid than rank 0's: the event's step
    slot = os.path.join(slots, "rank_0")
    data = bytearray(open(slot, "rb").read())
    data[4:8] = os.getpid().to_bytes(4, "little")  # the slot's pid field: as if rank 0 (this process) wrote it
    open(slot, "wb").write(bytes(data))
    doc = job_status(path, now=1020.0)
    rows = {row["rank"]: row for row in doc["ranks"]}
    assert rows[0]["step"] == 123 and 0 <= rows[0]["heartbeat_age"] < 60
    assert doc["stragglers"] == [1]
    assert "stragglers (slower than their peers): ranks 1" in format_status(doc)


def test_status_lists_the_warm_standbys_waiting(tmp_path):
    """``--preload``: the newest ready standby of each rank, alive and not a rank yet, with its memory."""
    standbys = [{"ts": 1018.0, "event": "standby_ready", "rank": 0, "pid": os.getpid(), "rss_bytes": 1 << 20},
                {"ts": 1018.0, "event": "standby_ready", "rank": 1, "pid": 2 ** 22 + 99, "rss_bytes": 1 << 20},
                {"ts": 1019.0, "event": "standby_ready", "rank": 2, "pid": os.getppid(), "rss_bytes": 220 << 20}]
    with live(write_run_dir(tmp_path / "job", 3, os.getpid(), EVENTS + standbys)) as path:
        doc = job_status(path, now=1020.0)
    # rank 0's standby became rank 0 (its pid is the rank's), rank 1's is gone
    assert doc["standbys"] == [{"rank": 2, "pid": os.getppid(), "rss_bytes": 220 << 20}]
    assert f"warm standbys (--preload): rank 2 pid {os.getppid()} 220 MiB" in format_status(doc)


def test_events_without_a_rank(tmp_path):
    """A straggler or a ready standby without a rank (``rank`` null or missing: not as the launcher
    writes them) next to ones with a rank: the status leaves them out. It used to fail sorting None
    among the ranks (a traceback for a file's content)."""
    odd = [{"ts": 1018.0, "event": "straggler", "attempt": 1, "rank": 1},
           {"ts": 1018.1, "event": "straggler", "attempt": 1, "rank": None},
           {"ts": 1018.2, "event": "straggler", "attempt": 1},
           {"ts": 1019.0, "event": "standby_ready", "rank": 2, "pid": os.getppid(), "rss_bytes": 220 << 20},
           {"ts": 1019.1, "event": "standby_ready", "rank": None, "pid": os.getppid(), "rss_bytes": 1 << 20},
           {"ts": 1019.2, "event": "standby_ready", "pid": os.getppid(), "rss_bytes": 1 << 20}]
    with live(write_run_dir(tmp_path / "job", 3, os.getpid(), EVENTS + odd)) as path:
        doc = job_status(path, now=1020.0)
    assert doc["stragglers"] == [1]
    assert doc["standbys"] == [{"rank": 2, "pid": os.getppid(), "rss_bytes": 220 << 20}]
    assert "stragglers (slower than their peers): ranks 1" in format_status(doc)
