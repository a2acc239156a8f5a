"""Unit tests for ``launcher.common.jobs``: per-job run dirs under the base dir, found by a lock probe."""

import fcntl
import json
import os
import threading

import pytest

from launcher.common import jobs
from launcher.common.errors import UsageError
from launcher.common.rundir import LAUNCHER, LOCK, RunDir


@pytest.fixture
def base(tmp_path):
    return tmp_path / "launcher"


def make_job(base, name, started, live=False, ended=None):
    """A run dir as ``launcher run`` leaves it; ``live``: its RunDir, locked (close it to end it)."""
    rd = RunDir(str(base / name))
    record = {"pid": 100 + int(started), "started": started}
    if ended is not None:
        record["ended"] = ended
    rd.write_json(LAUNCHER, record)
    rd.lock()
    if live:
        return rd
    rd.close()
    return None


def test_scan_tells_live_from_ended_and_died_jobs(base):
    held = make_job(base, "b-live", 3, live=True)
    make_job(base, "a-ended", 1, ended=2)
    make_job(base, "c-died", 2)
    (base / ".hidden").mkdir()
    (base / "logs").mkdir()  # what the run dir of an older launcher at the base itself left: no lock, no job
    os.symlink(str(base / "a-ended"), str(base / "z-link"))
    found = jobs.scan(str(base))
    assert [(j.name, j.status, j.pid) for j in found] == [("a-ended", "ended", 101), ("c-died", "died", 102),
                                                          ("b-live", "running", 103)]
    assert found[0].to_json()["run_dir"] == str(base / "a-ended")
    assert "b-live  running  pid 103" in found[2].describe()
    assert {(j.name, j.live) for j in jobs.scan(str(base), details=False)} == {
        ("a-ended", False), ("c-died", False), ("b-live", True)}
    held.close()
    assert jobs.scan(str(base / "missing")) == []


def test_resolve_the_only_live_job(base, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base.parent))
    monkeypatch.delenv("LAUNCHER_RUN_DIR", raising=False)
    assert jobs.resolve(None, None) is None
    make_job(base, "old", 1, ended=2)
    assert jobs.resolve(None, None) is None  # an ended job is not addressed
    held = make_job(base, "train", 3, live=True)
    assert jobs.resolve(None, None) == str(base / "train")
    assert jobs.resolve(None, "old") == str(base / "old")
    assert jobs.resolve("/some/dir", "old") == "/some/dir"
    monkeypatch.setenv("LAUNCHER_RUN_DIR", "/env/dir")
    assert jobs.resolve(None, None) == "/env/dir"
    held.close()


def test_resolve_several_live_jobs_lists_them_and_how_to_pick(base):
    held = [make_job(base, "one", 1, live=True), make_job(base, "two", 2, live=True)]
    with pytest.raises(UsageError) as exc:
        jobs.resolve(None, None, {"XDG_RUNTIME_DIR": str(base.parent)})
    assert exc.value.exit_code == 2
    assert "2 jobs are running" in exc.value.message and "--job NAME or --run-dir DIR" in exc.value.message
    assert [p.split()[0] for p in exc.value.problems] == ["one", "two"]
    for rd in held:
        rd.close()


@pytest.mark.parametrize("name", ["../x", "a/b", ".x", "", "a b"])
def test_bad_job_names_refused(name):
    with pytest.raises(UsageError):
        jobs.resolve(None, name, {"XDG_RUNTIME_DIR": "/run/user/1"})


def test_job_name_sources():
    assert jobs.job_name("mine", "rid") == "mine"
    assert jobs.job_name(None, "a/b c") == "a_b_c"
    assert jobs.job_name(None, "..") == "job"
    assert jobs.job_name(None, None).endswith(f"-{os.getpid()}")


def test_prune_keeps_the_newest_dead_jobs_and_every_live_one(base):
    for n in range(6):
        make_job(base, f"dead{n}", n, ended=n + 0.5)
    held = make_job(base, "live", 0, live=True)
    removed = jobs.prune(str(base), keep=2, exclude=["dead1"])
    assert sorted(removed) == ["dead0", "dead2", "dead3"]
    assert sorted(os.listdir(base)) == ["dead1", "dead4", "dead5", "live"]
    held.close()


def test_prune_never_removes_a_job_a_launcher_just_locked(base, monkeypatch):
    make_job(base, "old", 1, ended=2)
    real_scan = jobs.scan

    def scan_then_a_launcher_starts(path, details=True):
        found = real_scan(path, details)
        starting.append(RunDir(str(base / "old")))
        starting[0].lock()
        return found

    starting = []
    monkeypatch.setattr(jobs, "scan", scan_then_a_launcher_starts)
    assert jobs.prune(str(base), keep=0) == []
    assert (base / "old" / LAUNCHER).exists()
    starting[0].close()


def test_prune_refuses_a_base_dir_that_is_not_private(base):
    make_job(base, "old", 1, ended=2)
    os.chmod(base, 0o755)
    assert jobs.prune(str(base), keep=0) == []
    assert (base / "old").exists()


def test_a_lock_probe_does_not_make_a_starting_launcher_fail(base):
    make_job(base, "job", 1, ended=2)
    probe = os.open(str(base / "job" / LOCK), os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH)  # launcher jobs / prestop probing at that very moment
    timer = threading.Timer(0.03, os.close, [probe])
    timer.start()
    rd = RunDir(str(base / "job"))
    rd.lock()  # retried until the probe let go
    timer.join()
    rd.close()


def test_jobs_command_lists_as_text_and_json(base, capsys, monkeypatch, clean_env, restore_launcher_logger):
    from launcher.commands.cli import main

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base.parent))
    assert main(["jobs"]) == 0
    assert capsys.readouterr().out == f"no jobs under {base}\n"
    held = make_job(base, "train", 5, live=True)
    make_job(base, "old", 1, ended=2)
    assert main(["jobs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["status"], r["pid"], r["run_dir"]) for r in rows] == [
        ("old", "ended", 101, str(base / "old")), ("train", "running", 105, str(base / "train"))]
    assert main(["jobs"]) == 0
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()] == [["old", "ended"],
                                                                                  ["train", "running"]]
    held.close()
