"""The TaskD sidecar as a real process, running the stand-in manager (``tests/stubs/taskd``).

Each test starts ``python -m launcher.cluster.taskd_sidecar`` with the stub on ``PYTHONPATH``, a free port in
``TASKD_STUB_PORT`` and ``TASKD_STUB_DIR`` in the test's tmp dir, where the stub records its config
and a ``manager-started-<pid>`` file per start. Waits poll those files and events.jsonl, never sleep.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

from launcher.cluster import taskd
from launcher.monitoring.events import EventLog
from launcher.cluster.taskd_sidecar import EXIT_INIT_FAILED, Sidecar
from tests.helpers.launch import events_in
from tests.helpers.procs import free_port, pid_alive, wait_until
from tests.helpers.paths import REPO

STUBS = REPO / "tests" / "stubs"
CONFIG = taskd.manager_config("job-42", 2, 4)


def send(port: int, line: str) -> Optional[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(line.encode() + b"\n")
        if line == "ping":
            return conn.makefile().readline().strip()
    return None


class SidecarRun:
    """One sidecar subprocess and the files it and the stub write."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.stub_dir = tmp / "stub"
        self.stub_dir.mkdir()
        self.events_path = tmp / "events.jsonl"
        self.log_path = tmp / "taskd_manager.log"
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    def start(self, config: Optional[dict] = None, env: Optional[dict] = None, **argv_kwargs) -> None:
        base = {k: v for k, v in os.environ.items() if k not in ("POD_IP", "LD_PRELOAD", "TASKD_STUB_CRASH_AFTER")}
        base.update({"PYTHONPATH": os.pathsep.join([str(STUBS), str(REPO)]), "TASKD_STUB_DIR": str(self.stub_dir),
                     "TASKD_STUB_PORT": str(self.port)})
        base.update(env or {})
        argv = taskd.sidecar_argv(CONFIG if config is None else config, str(self.events_path), "run-t", **argv_kwargs)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=base, cwd=str(self.tmp))

    def started(self) -> List[int]:
        """Pids of the managers that started listening, in start order."""
        files = sorted(self.stub_dir.glob("manager-started-*"), key=lambda p: float(p.read_text()))
        return [int(p.name.rsplit("-", 1)[1]) for p in files]

    def wait_started(self, count: int, timeout: float = 10) -> List[int]:
        assert wait_until(lambda: len(self.started()) >= count or self.proc.poll() is not None, timeout), self.log()
        assert len(self.started()) >= count, self.log()
        return self.started()

    def events(self, name: Optional[str] = None) -> List[dict]:
        return events_in(self.tmp, name)

    def wait_events(self, name: str, count: int, timeout: float = 10) -> List[dict]:
        assert wait_until(lambda: len(self.events(name)) >= count, timeout), (self.events(), self.log())
        return self.events(name)

    def stop(self, timeout: float = 10) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def sidecar(tmp_path):
    run = SidecarRun(tmp_path)
    yield run
    if run.proc is not None and run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()


def test_manager_starts_records_config_and_stops_on_sigterm(sidecar):
    sidecar.start()
    [pid] = sidecar.wait_started(1)
    recorded = json.loads((sidecar.stub_dir / f"manager-config-{pid}.json").read_text())
    assert recorded == CONFIG
    assert send(sidecar.port, "ping") == "pong"
    [started] = sidecar.events("taskd_manager_started")
    assert started["pid"] == pid and started["run_id"] == "run-t"
    assert os.getpgid(pid) == pid  # its own session: the sidecar stops the whole group

    began = time.monotonic()
    assert sidecar.stop() == 0
    assert time.monotonic() - began < 3
    assert not pid_alive(pid)
    [stopped] = sidecar.events("taskd_manager_stopped")
    assert stopped["pid"] == pid and stopped["forced"] is False and stopped["returncode"] == -signal.SIGTERM
    assert sidecar.events("taskd_manager_exited") == []
    assert "Traceback" not in sidecar.log()


def test_a_crashed_manager_is_restarted(sidecar):
    sidecar.start()
    [first] = sidecar.wait_started(1)
    send(sidecar.port, "crash")
    first_again, second = sidecar.wait_started(2)
    assert first_again == first and second != first
    [exited] = sidecar.events("taskd_manager_exited")
    assert exited["pid"] == first and exited["returncode"] == 3
    [restart] = sidecar.events("taskd_manager_restart")
    assert restart["attempt"] == 1 and restart["delay"] == pytest.approx(0.5)
    assert [e["pid"] for e in sidecar.events("taskd_manager_started")] == [first, second]
    assert [e["event"] for e in sidecar.events()][:4] == [
        "taskd_manager_started", "taskd_manager_exited", "taskd_manager_restart", "taskd_manager_started"]
    assert send(sidecar.port, "ping") == "pong"  # the new manager serves
    assert sidecar.stop() == 0
    assert not pid_alive(second)


def test_a_manager_that_crashes_on_its_own_is_restarted(sidecar):
    sidecar.start(env={"TASKD_STUB_CRASH_AFTER": "0.2"})
    sidecar.wait_events("taskd_manager_restart", 1)
    [exited] = sidecar.wait_events("taskd_manager_exited", 1)
    assert exited["returncode"] == 3 and exited["runtime"] >= 0.2
    assert sidecar.stop() == 0


def test_init_returning_false_is_a_failure_with_growing_backoff(sidecar):
    """A config TaskD rejects: each manager exits at init; restarts back off 0.5 s, 1 s, ..."""
    sidecar.start(config={"job_id": "j", "node_nums": 1})  # no proc_per_node
    restarts = sidecar.wait_events("taskd_manager_restart", 2)
    assert [r["delay"] for r in restarts[:2]] == [pytest.approx(0.5), pytest.approx(1.0)]
    exited = sidecar.events("taskd_manager_exited")
    assert exited[0]["returncode"] == EXIT_INIT_FAILED
    assert exited[0]["reason"] == "init_taskd_manager() returned False"
    assert sidecar.started() == []
    log = sidecar.log()
    assert "missing key 'proc_per_node'" in log and "taskd manager: init_taskd_manager() returned False" in log

    began = time.monotonic()  # SIGTERM while waiting to restart: no manager to stop, exit at once
    assert sidecar.stop() == 0
    assert time.monotonic() - began < 1.0
    stopped = sidecar.events("taskd_manager_stopped")
    assert stopped[-1]["pid"] is None


def test_a_killed_sidecar_takes_the_manager_along(sidecar):
    sidecar.start()
    [pid] = sidecar.wait_started(1)
    sidecar.proc.kill()
    sidecar.proc.wait()
    assert wait_until(lambda: not pid_alive(pid), 5), "the manager outlived its sidecar"


def test_refuses_to_start_when_its_parent_is_gone(sidecar):
    sidecar.start(parent_pid=1 if os.getpid() != 1 else 2)  # not our parent: as if the launcher died
    assert sidecar.proc.wait(10) == 1
    assert "already gone" in sidecar.log()
    assert sidecar.started() == [] and sidecar.events() == []


def test_bad_config_is_exit_2(sidecar):
    argv = [sys.executable, "-m", "launcher.cluster.taskd_sidecar", "--config", "[1, 2]", "--events",
            str(sidecar.events_path), "--run-id", "r"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), timeout=30)
    assert result.returncode == 2
    assert "--config is not a JSON object" in result.stderr


def test_pod_ip_reaches_the_manager(sidecar):
    sidecar.start(pod_ip="127.0.0.1")
    sidecar.wait_started(1)
    assert "listening on 127.0.0.1:" in sidecar.log()
    assert sidecar.stop() == 0


def test_a_manager_ignoring_sigterm_is_killed(tmp_path, monkeypatch):
    """In-process: the stop escalates to SIGKILL after STOP_TIMEOUT and records it."""
    from launcher.cluster import taskd_sidecar

    monkeypatch.setattr(taskd_sidecar, "STOP_TIMEOUT", 0.3)
    events = EventLog(str(tmp_path / "events.jsonl"), "r")
    side = Sidecar(CONFIG, events)
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    began = time.monotonic()
    side._stop_manager(proc)
    assert time.monotonic() - began < 3
    proc.stdout.close()
    events.close()
    [stopped] = events_in(tmp_path, "taskd_manager_stopped")
    assert stopped["forced"] is True and stopped["returncode"] == -signal.SIGKILL


def test_backoff_restarts_afresh_after_a_stable_run(tmp_path):
    from types import SimpleNamespace

    events = EventLog(str(tmp_path / "events.jsonl"), "r")
    side = Sidecar(CONFIG, events)
    delays = [side._backoff(SimpleNamespace(attempt_number=n)) for n in range(1, 9)]
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30]
    side._stable = True  # the manager of attempt 9 ran for STABLE_SECONDS before exiting
    assert side._backoff(SimpleNamespace(attempt_number=9)) == 0.5
    assert side._backoff(SimpleNamespace(attempt_number=10)) == 1
    events.close()
