"""Run dirs and prestop end to end (issues #10.3, #17.4, #17.5): jobs without ``--run-dir`` side by
side, ``launcher prestop`` finding the job with no arguments, a run dir too long for a unix socket
path, and prestop against a SIGSTOPped launcher."""

import json
import os
import signal
from pathlib import Path

from tests.helpers.launch import Launcher, cli


def Job(tmp: Path, env: dict) -> Launcher:
    """A ``launcher run`` without ``--run-dir`` (a job dir of its own under the base dir)."""
    return Launcher(tmp, run_dir=None, env=env)


def base_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "MASTER_", "MS_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "xdg")
    (tmp_path / "xdg").mkdir(mode=0o700)
    return env


#: A rank that does what rank 0 of a torch job does first: bind and listen on MASTER_PORT.
STORE_WORKER = """
import os, socket, sys, time
sock = socket.socket()
if os.environ["RANK"] == "0":
    sock.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))  # EADDRINUSE: exit 1
    sock.listen()
with open(sys.argv[2], "a") as fh:
    fh.write(f"{os.environ['RANK']} 0 {os.getpid()} {os.environ['MASTER_PORT']}\\n")
while True:
    time.sleep(1)
"""


def test_two_local_jobs_side_by_side_and_prestop_picks_by_name(tmp_path):
    env = base_env(tmp_path)
    worker = tmp_path / "store_worker.py"
    worker.write_text(STORE_WORKER)
    first, second = (Job(tmp_path / n, env) for n in ("a", "b"))
    for job in (first, second):
        job.start(["--nproc-per-node", "2"], [], worker=str(worker))
    ports = {first.wait_ready(2)[0][3], second.wait_ready(2)[0][3]}
    assert len(ports) == 2 and "29500" not in ports  # before: the second failed (run dir, then port)
    listed = json.loads(cli("jobs", "--json", env=env).stdout)
    assert sorted(j["pid"] for j in listed if j["status"] == "running") == sorted([first.proc.pid, second.proc.pid])
    assert all(os.path.dirname(j["run_dir"]) == str(tmp_path / "xdg" / "launcher") for j in listed)
    ambiguous = cli("prestop", env=env)
    assert ambiguous.returncode == 2
    assert "2 jobs are running" in ambiguous.stderr and "--job NAME" in ambiguous.stderr
    names = {j["pid"]: j["name"] for j in listed}
    for job in (first, second):
        done = cli("prestop", "--job", names[job.proc.pid], env=env)
        assert done.returncode == 0, done.stderr
        assert "rank 1: exited by SIGTERM" in done.stdout
        assert job.wait(20) == 143
    assert [j["status"] for j in json.loads(cli("jobs", "--json", env=env).stdout)] == ["ended", "ended"]


def test_bare_prestop_finds_the_only_job(tmp_path):
    """What a preStop hook runs: `launcher prestop`, no arguments, through the fast path."""
    env = base_env(tmp_path)
    job = Job(tmp_path, env)
    job.start(["--nproc-per-node", "2"], ["--term-delay", "0.1"])
    job.wait_ready(2)
    done = cli("prestop", env=env)
    assert done.returncode == 0, done.stderr
    assert "rank 0: exited with code 143" in done.stdout and "rank 1: exited with code 143" in done.stdout
    assert job.wait(20) == 143


def test_a_run_dir_too_long_for_a_socket_path_works_end_to_end(launcher, tmp_path):
    launcher.run_dir = tmp_path / ("x" * 60) / ("y" * 60) / "run"
    assert len(str(launcher.run_dir / "control.sock")) > 108
    launcher.start(["--nproc-per-node", "2"], ["--term-delay", "0.1"])
    launcher.wait_ready(2)  # before: a traceback (AF_UNIX path too long) before any rank started
    done = cli("prestop", "--run-dir", str(launcher.run_dir))
    assert done.returncode == 0, done.stderr
    assert "rank 1: exited with code 143" in done.stdout
    assert launcher.wait(20) == 143


def test_prestop_against_a_stopped_launcher_falls_back_to_the_recorded_ranks(launcher):
    launcher.start(["--nproc-per-node", "2", "--termination-grace-period", "30"], ["--term-delay", "0.1"])
    launcher.wait_ready(2)
    assert launcher.proc.pid  # state.json is written right after the ranks start
    from tests.helpers.procs import wait_until

    assert wait_until(lambda: (launcher.run_dir / "state.json").exists(), 10)
    os.kill(launcher.proc.pid, signal.SIGSTOP)
    try:
        # Before the fix this waited forever: connect succeeds into the backlog, the read never ends.
        done = cli("prestop", "--run-dir", str(launcher.run_dir), timeout=30)
        assert done.returncode == 0, done.stderr
        assert "did not answer 'gasp' within 2 s" in done.stderr
        assert "the launcher is gone; SIGTERM to 2 rank(s)" in done.stdout
        assert sorted(int(t[0]) for t in launcher.ready_lines(".term")) == [0, 1]  # the save signal
        fallback = launcher.events("gasp", source="prestop-fallback")
        assert fallback and 0 < fallback[0]["timeout"] < 25  # what was left of the 25 s gasp timeout
    finally:
        os.kill(launcher.proc.pid, signal.SIGKILL)
        launcher.wait(10)
