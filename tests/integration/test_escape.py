"""Processes that leave their rank's process group (issue #17.1) are gone after every ending of the job.

Each rank of ``tests/workers/escaper.py`` starts a child that calls ``setsid()``, ``setpgid(0, 0)`` or
double-forks into a daemon, ignores SIGTERM and sleeps. ``killpg`` cannot reach it. Every test runs
with the job's cgroup v2 (where this machine has a writable one) and with it switched off
(``LAUNCHER_CGROUP=off``: the token / re-parented-orphan scan alone).
"""

import glob
import os
import signal
from pathlib import Path

import pytest

from launcher.supervision.cgroup import job_cgroup
from tests.helpers.procs import pid_alive, wait_until

ESCAPER = str(Path(__file__).resolve().parents[1] / "workers" / "escaper.py")
MODES = ("setsid", "setpgid", "daemon")


def _own_cgroup_dir():
    """This process's cgroup v2 directory when it is writable (the launcher puts its job below it)."""
    probe = job_cgroup("probe", {})
    return os.path.dirname(probe.path) if probe is not None else None


@pytest.fixture(params=["cgroup", "no-cgroup"])
def containment(request, monkeypatch):
    """The launcher with its job cgroup, and with it switched off."""
    if request.param == "cgroup":
        if _own_cgroup_dir() is None:
            pytest.skip("no writable cgroup v2 here")
        monkeypatch.delenv("LAUNCHER_CGROUP", raising=False)
    else:
        monkeypatch.setenv("LAUNCHER_CGROUP", "off")
    return request.param


def escapees(launcher, attempt=None):
    """Pids of the escaped children (of one attempt, or all)."""
    lines = launcher.ready_lines(".escaped")
    return [int(pid) for _rank, att, pid in lines if attempt is None or int(att) == attempt]


def named(launcher, attempt="any"):
    """Pid -> how found, from the ``escaped_processes`` events (of one attempt)."""
    return {p["pid"]: p["found"] for e in launcher.events() if e["event"] == "escaped_processes"
            and (attempt == "any" or e["attempt"] == attempt) for p in e["processes"]}


def assert_all_gone(launcher, pids):
    assert pids, "the worker started no escapee"
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), [p for p in pids if pid_alive(p)]
    parent = _own_cgroup_dir()
    if parent is not None:  # the job's cgroups are removed, also after a SIGKILLed launcher
        assert wait_until(lambda: not glob.glob(f"{parent}/launcher-{launcher.proc.pid}-*"), 10)


def assert_named(launcher, containment, pids, attempt="any"):
    found = named(launcher, attempt)
    assert set(pids) <= set(found), (pids, found, launcher.stderr)
    expected = {"cgroup"} if containment == "cgroup" else {"reparented", "token"}
    assert {found[p] for p in pids} <= expected
    assert "left their rank's process group" in launcher.stderr


ENDINGS = {  # how the job's single attempt ends: launcher options, worker options, exit status
    "all-ranks-succeed": ([], ["--run", "0"], 0),
    "rank-fails-budget-spent": (["--max-restarts", "0"], ["--fail-rank", "1", "--exit-code", "3"], 3),
}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_job_ends_by_itself(launcher, containment, mode, ending):
    options, worker_args, expected = ENDINGS[ending]
    code = launcher.run(["--nproc-per-node", "2", *options], ["--escape", mode, *worker_args], worker=ESCAPER)
    assert code == expected, launcher.stderr
    pids = escapees(launcher)
    assert len(pids) == 2
    assert_all_gone(launcher, pids)
    assert_named(launcher, containment, pids, attempt=0)


@pytest.mark.parametrize("mode", MODES)
def test_restart_starts_only_after_the_escapees_are_gone(launcher, containment, mode):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1"],
                        ["--escape", mode, "--fail-rank", "1", "--run", "0"], worker=ESCAPER)
    assert code == 0, launcher.stderr
    first = escapees(launcher, attempt=0)
    assert len(first) == 2
    assert_named(launcher, containment, first, attempt=0)
    events = [e["event"] if e["event"] != "attempt_start" else f"attempt_start {e['attempt']}"
              for e in launcher.events()]
    assert events.index("escaped_processes") < events.index("attempt_start 1")
    attempt1 = [line for line in launcher.ready_lines() if line[1] == "1"]
    assert len(attempt1) == 2 and all(line[3] == "0" for line in attempt1)  # what the new ranks saw
    assert_all_gone(launcher, escapees(launcher))


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_to_the_launcher(launcher, containment, mode):
    launcher.start(["--nproc-per-node", "2", "--grace-period", "5"], ["--escape", mode], worker=ESCAPER)
    launcher.wait_ready(2)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(30) == 128 + signal.SIGTERM, launcher.stderr
    pids = escapees(launcher)
    assert_all_gone(launcher, pids)
    assert_named(launcher, containment, pids)


@pytest.mark.parametrize("mode", MODES)
def test_sigkilled_launcher_the_orphan_guard_kills_them(launcher, containment, mode):
    launcher.start(["--nproc-per-node", "2"], ["--escape", mode], worker=ESCAPER)
    launcher.wait_ready(2)
    launcher.proc.kill()
    launcher.wait()
    assert_all_gone(launcher, escapees(launcher))


def test_escapee_without_the_token_is_found_as_an_orphan(launcher, containment):
    """``--clear-env``: the escapee drops the environment token; re-parenting still gives it away."""
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1"],
                        ["--escape", "setsid", "--clear-env", "--fail-rank", "1", "--run", "0"], worker=ESCAPER)
    assert code == 0, launcher.stderr
    first = escapees(launcher, attempt=0)
    assert_named(launcher, containment, first, attempt=0)
    assert all(line[3] == "0" for line in launcher.ready_lines() if line[1] == "1")
    assert_all_gone(launcher, escapees(launcher))


def test_sigkilled_launcher_without_the_token_needs_the_cgroup(launcher, monkeypatch):
    """The guard finds a token-less escapee of a SIGKILLed launcher only through the cgroup."""
    if _own_cgroup_dir() is None:
        pytest.skip("no writable cgroup v2 here")
    monkeypatch.delenv("LAUNCHER_CGROUP", raising=False)
    launcher.start(["--nproc-per-node", "1"], ["--escape", "daemon", "--clear-env"], worker=ESCAPER)
    launcher.wait_ready(1)
    launcher.proc.kill()
    launcher.wait()
    assert_all_gone(launcher, escapees(launcher))
