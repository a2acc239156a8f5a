"""Unit tests for ``launcher.control.prestop``: the run-dir check, the report lines, and ``prestop()`` in-process.

With a supervisor, a fake one (a thread serving the run dir's control socket) checks the request and
the relaying of its answers. Without one, ``state.json`` records tiny real ranks (``sys.executable
-c``, own session, ready file written once the signal handler is in place): only those whose pid and
create time both match are signalled, and ``events.jsonl`` gets ``gasp`` then ``gasp_done``. Output is
read with ``capsys``; every rank started is reaped.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from launcher.common.errors import LauncherError, UsageError
from launcher.monitoring.events import read_events
from launcher.control.prestop import open_run_dir, prestop, print_gasp
from launcher.common.rundir import CONTROL_SOCKET, EVENTS, STATE
from tests.helpers.procs import RankSpawner


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def spawn(tmp_path):
    """``spawn(signame="SIGTERM")`` starts a rank that exits 7 on ``signame``; returns it once ready."""
    ranks = RankSpawner(tmp_path)
    yield lambda signame="SIGTERM": ranks.start("exit", signame)
    ranks.close()


def write_state(run_dir, *ranks):
    """``ranks``: (rank, Popen, create-time offset); a non-zero offset makes the pid a stranger's."""
    records = [{"rank": rank, "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time() + offset}
               for rank, proc, offset in ranks]
    (run_dir / STATE).write_text(json.dumps({"ranks": records}))


def assert_not_signalled(proc):
    """A signalled rank exits 7 at once; give a stray signal time to land before calling it unsent."""
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.3)


# -- open_run_dir ------------------------------------------------------------------------------------

def test_open_run_dir_returns_the_absolute_checked_path(run_dir, monkeypatch):
    monkeypatch.chdir(run_dir.parent)
    assert open_run_dir("run").path == str(run_dir)


def test_open_run_dir_defaults_to_launcher_run_dir(run_dir, monkeypatch):
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(run_dir))
    assert open_run_dir(None).path == str(run_dir)


def test_open_run_dir_missing_is_none(tmp_path):
    assert open_run_dir(str(tmp_path / "nothing-here")) is None


@pytest.mark.parametrize("mode", [0o755, 0o701, 0o770])
def test_open_run_dir_refuses_a_dir_others_can_use(run_dir, mode):
    os.chmod(run_dir, mode)
    with pytest.raises(UsageError, match="must be private") as exc:
        open_run_dir(str(run_dir))
    assert exc.value.exit_code == 2 and f"chmod 700 {run_dir}" in exc.value.problems[0]


def test_open_run_dir_refuses_a_file(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        open_run_dir(str(tmp_path / "run"))


# -- print_gasp --------------------------------------------------------------------------------------

@pytest.mark.parametrize("outcome, line", [
    ({"killed_after_timeout": True, "signal": "SIGKILL", "exit_code": 9}, "rank 0: killed after the gasp timeout"),
    ({"killed_after_timeout": False, "signal": "SIGTERM", "exit_code": 143}, "rank 0: exited by SIGTERM (code 143)"),
    ({"signal": None, "exit_code": 0}, "rank 0: exited with code 0"),
    ({"killed_after_timeout": False, "signal": None, "exit_code": None}, "rank 0: exited"),
])
def test_print_gasp_line_shapes(capsys, outcome, line):
    print_gasp([dict(outcome, label="rank 0")])
    assert capsys.readouterr().out == line + "\n"


def test_print_gasp_one_line_per_rank_in_order(capsys):
    print_gasp([{"label": "rank 1", "exit_code": 1}, {"label": "rank 0", "killed_after_timeout": True}])
    assert capsys.readouterr().out.splitlines() == ["rank 1: exited with code 1",
                                                    "rank 0: killed after the gasp timeout"]


# -- prestop: no run, refused run dir, a supervisor ----------------------------------------------------

def test_prestop_without_a_run_is_a_no_op(tmp_path, capsys):
    assert prestop(str(tmp_path / "nothing-here")) == 0
    assert capsys.readouterr().out == "launcher prestop: no launcher run here; nothing to do\n"


def test_prestop_refuses_a_run_dir_with_wrong_permissions(run_dir, spawn):
    rank = spawn()
    write_state(run_dir, (0, rank, 0.0))
    os.chmod(run_dir, 0o755)
    with pytest.raises(UsageError, match="must be private"):
        prestop(str(run_dir), timeout=1)
    assert_not_signalled(rank)


def serve(run_dir, answers):
    """A one-shot fake supervisor; returns the thread and the list it appends the request to."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(run_dir / CONTROL_SOCKET))
    server.listen(1)
    received = []

    def run():
        with server:
            conn, _ = server.accept()
            with conn:
                received.append(json.loads(conn.makefile("rb").readline()))
                for answer in answers:
                    conn.sendall((json.dumps(answer) + "\n").encode())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, received


def test_prestop_relays_the_supervisors_gasp(run_dir, capsys):
    thread, received = serve(run_dir, [
        {"ok": True, "gasp": [{"label": "rank 0", "exit_code": 143, "signal": None}]},
        {"ok": True, "done": True, "reason": "prestop, exit 143"}])
    assert prestop(str(run_dir)) == 0
    thread.join(10)
    assert received == [{"command": "gasp", "args": {}}]
    assert capsys.readouterr().out.splitlines() == ["rank 0: exited with code 143",
                                                    "launcher prestop: job stopped (prestop, exit 143)"]
    assert not (run_dir / EVENTS).exists()  # the supervisor, not prestop, records the gasp


def test_prestop_raises_when_the_supervisor_refuses(run_dir):
    thread, _ = serve(run_dir, [{"ok": False, "error": "already stopping"}])
    with pytest.raises(LauncherError, match="refused the dying gasp: already stopping"):
        prestop(str(run_dir))
    thread.join(10)


# -- prestop without a supervisor --------------------------------------------------------------------

@pytest.mark.parametrize("state", [None, "not json", '{"ranks": []}', "dead", '[1]', '{"ranks": null}',
                                   '{"ranks": [{"pid": 1}]}', '{"ranks": [1, "x", null]}',
                                   '{"ranks": [{"rank": 0, "pid": 0, "create_time": 0}]}'])
def test_prestop_with_the_launcher_and_its_ranks_gone(run_dir, capsys, state):
    if state == "dead":
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait(10)
        state = json.dumps({"ranks": [{"rank": 0, "pid": dead.pid, "create_time": time.time()}]})
    if state is not None:
        (run_dir / STATE).write_text(state)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(run_dir / CONTROL_SOCKET))  # the dead supervisor's socket: nobody listens
    stale.close()
    assert prestop(str(run_dir), timeout=1) == 0
    assert capsys.readouterr().out == ("launcher prestop: the launcher is gone and none of its ranks is "
                                       "running; nothing to do\n")
    assert not (run_dir / EVENTS).exists()


def test_prestop_signals_the_recorded_rank_and_records_the_gasp(run_dir, spawn, capsys):
    rank = spawn()
    write_state(run_dir, (2, rank, 0.0))
    assert prestop(str(run_dir), timeout=30) == 0
    assert rank.wait(10) == 7  # its SIGTERM handler ran
    assert capsys.readouterr().out.splitlines() == [
        "launcher prestop: the launcher is gone; SIGTERM to 1 rank(s) it started, 30 s to save", "rank 2: exited"]
    events = read_events(str(run_dir / EVENTS))
    assert [e["event"] for e in events] == ["gasp", "gasp_done"]
    assert {k: events[0][k] for k in ("run_id", "source", "save", "signal", "timeout")} == {
        "run_id": "prestop", "source": "prestop-fallback", "save": True, "signal": "SIGTERM", "timeout": 30}
    assert [(r["rank"], r["killed_after_timeout"]) for r in events[1]["ranks"]] == [(2, False)]


def test_prestop_uses_the_given_signal_and_the_default_timeout(run_dir, spawn, capsys):
    rank = spawn("SIGUSR1")  # SIGTERM would kill it with -15, not exit 7
    write_state(run_dir, (0, rank, 0.0))
    assert prestop(str(run_dir), signame="usr1") == 0
    assert rank.wait(10) == 7
    assert "SIGUSR1 to 1 rank(s) it started, 25 s to save" in capsys.readouterr().out  # 30 s grace - 5 s
    assert read_events(str(run_dir / EVENTS))[0]["signal"] == "SIGUSR1"


def test_prestop_never_signals_a_pid_with_another_create_time(run_dir, spawn, capsys):
    ours, stranger = spawn(), spawn()
    write_state(run_dir, (0, ours, 0.0), (1, stranger, -100.0))  # rank 1's pid was recycled
    assert prestop(str(run_dir), timeout=30) == 0
    assert ours.wait(10) == 7
    assert_not_signalled(stranger)
    out = capsys.readouterr().out
    assert "1 rank(s)" in out and "rank 0: exited" in out and "rank 1" not in out
    assert [r["rank"] for r in read_events(str(run_dir / EVENTS))[1]["ranks"]] == [0]


def test_prestop_only_stranger_recorded_is_a_no_op(run_dir, spawn, capsys):
    stranger = spawn()
    write_state(run_dir, (0, stranger, -100.0))
    assert prestop(str(run_dir), timeout=1) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert_not_signalled(stranger)


# -- finding the job under the base dir (issue #10.3) ---------------------------------------------------

def died_job(base, name, *ranks):
    """A job dir whose launcher died: lock file not held, launcher.json without "ended"."""
    from launcher.common.rundir import LAUNCHER, RunDir

    rd = RunDir(str(base / name))
    rd.lock()
    rd.write_json(LAUNCHER, {"pid": 1, "started": time.time(), "gasp_timeout": 12, "gasp_signal": "SIGTERM"})
    rd.close()
    write_state(base / name, *ranks)


def test_bare_prestop_without_a_live_job_saves_the_ranks_of_the_one_whose_launcher_died(
        tmp_path, spawn, capsys, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("LAUNCHER_RUN_DIR", raising=False)
    base = tmp_path / "launcher"
    rank = spawn()
    died_job(base, "gone", (0, rank, 0.0))
    died_job(base, "older", (0, rank, 5.0))  # a stranger's pid by now: not a candidate
    assert prestop() == 0
    assert rank.wait(10) == 7
    assert "SIGTERM to 1 rank(s) it started, 12 s to save" in capsys.readouterr().out  # its recorded timeout
    assert [e["event"] for e in read_events(str(base / "gone" / EVENTS))] == ["gasp", "gasp_done"]


def test_bare_prestop_with_two_stranded_jobs_asks_which(tmp_path, spawn, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("LAUNCHER_RUN_DIR", raising=False)
    first, second = spawn(), spawn()
    died_job(tmp_path / "launcher", "a", (0, first, 0.0))
    died_job(tmp_path / "launcher", "b", (0, second, 0.0))
    with pytest.raises(UsageError, match="2 jobs under .* lost their launcher") as exc:
        prestop()
    assert sorted(p.split()[0] for p in exc.value.problems) == ["a", "b"]
    assert_not_signalled(first)
    assert prestop(job="b", timeout=5) == 0
    assert second.wait(10) == 7


def test_bare_prestop_with_nothing_under_the_base_is_a_no_op(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("LAUNCHER_RUN_DIR", raising=False)
    assert prestop() == 0
    assert capsys.readouterr().out == "launcher prestop: no launcher run here; nothing to do\n"


def test_a_recorded_gasp_timeout_is_bounded():
    """launcher.json is the launcher's own file, but a preStop hook must not wait for ever on a value
    someone wrote there (1e18, inf)."""
    from launcher.control.prestop import MAX_RECORDED_GASP, _recorded_gasp_timeout

    assert _recorded_gasp_timeout({"gasp_timeout": 25.0}) == 25.0
    assert _recorded_gasp_timeout({"gasp_timeout": 1e18}) == MAX_RECORDED_GASP
    assert _recorded_gasp_timeout({"gasp_timeout": -3}) == 0.0
    assert _recorded_gasp_timeout({"gasp_timeout": "x"}) == _recorded_gasp_timeout({})
