"""Unit tests for ``launcher.rundir``: the private, locked run dir and its JSON files."""

import json
import os
import stat

import pytest

from launcher import rundir as rundir_mod
from launcher.errors import LauncherError, UsageError
from launcher.rundir import LAUNCHER, RunDir, check_private, default_run_dir


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_created_0700(tmp_path, umask_022):
    path = tmp_path / "a" / "b" / "run"
    rd = RunDir(str(path))
    assert path.is_dir()
    assert mode_of(path) == 0o700
    assert rd.path == str(path)


def test_created_0700_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        RunDir(str(tmp_path / "run"))
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "run") == 0o700


def test_existing_private_dir_is_accepted(tmp_path):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    (path / "keep").write_text("x")
    RunDir(str(path))
    assert (path / "keep").read_text() == "x"


def test_relative_path_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rd = RunDir("rel")
    assert rd.path == str(tmp_path / "rel")
    assert rd.file("state.json") == str(tmp_path / "rel" / "state.json")


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o710, 0o777])
def test_refuses_a_dir_open_to_others_naming_chmod(tmp_path, mode):
    path = tmp_path / "run"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(UsageError) as exc:
        RunDir(str(path))
    assert f"{mode:04o}" in exc.value.message
    assert exc.value.problems == [f"fix it with: chmod 700 {path}"]
    assert exc.value.exit_code == 2
    assert mode_of(path) == mode  # never "fixed" silently


def test_refuses_a_regular_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a dir")
    with pytest.raises(UsageError) as exc:
        RunDir(str(path))
    assert str(path) in exc.value.message


def test_refuses_a_symlink_to_a_private_dir(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "run"
    link.symlink_to(target)
    with pytest.raises(UsageError) as exc:
        RunDir(str(link))
    assert "is not a directory" in exc.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_refuses_a_dir_owned_by_someone_else(tmp_path):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    os.chown(str(path), 54321, -1)
    with pytest.raises(UsageError) as exc:
        check_private(str(path))
    assert "belongs to uid 54321" in exc.value.message


def test_check_private_accepts_0700(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    path.chmod(0o700)
    check_private(str(path))


# --------------------------------------------------------------------------- lock

def test_second_launcher_on_the_same_dir_is_refused_naming_the_pid(tmp_path):
    first = RunDir(str(tmp_path / "run"))
    first.lock()
    first.write_json(LAUNCHER, {"pid": 4242, "run_id": "x"})
    second = RunDir(str(tmp_path / "run"))
    with pytest.raises(LauncherError) as exc:
        second.lock()
    assert not isinstance(exc.value, UsageError)
    assert exc.value.exit_code == 1
    assert "pid 4242" in exc.value.message
    assert str(tmp_path / "run") in exc.value.message
    assert any("--run-dir" in p for p in exc.value.problems)
    first.unlock()


def test_lock_refusal_without_launcher_json(tmp_path):
    first = RunDir(str(tmp_path / "run"))
    first.lock()
    with pytest.raises(LauncherError) as exc:
        RunDir(str(tmp_path / "run")).lock()
    assert "pid ?" in exc.value.message
    first.unlock()


def test_lock_released_by_unlock(tmp_path):
    first = RunDir(str(tmp_path / "run"))
    first.lock()
    first.unlock()
    first.unlock()  # idempotent
    second = RunDir(str(tmp_path / "run"))
    second.lock()
    with pytest.raises(LauncherError):
        RunDir(str(tmp_path / "run")).lock()
    second.unlock()


def test_lock_file_is_private_and_not_inherited(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    rd.lock()
    try:
        assert mode_of(rd.file(rundir_mod.LOCK)) & 0o077 == 0
        assert os.get_inheritable(rd._lock_fd) is False
    finally:
        rd.unlock()


# --------------------------------------------------------------------------- JSON files

def test_write_then_read_json(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    rd.write_json("state.json", {"attempt": 2, "ranks": [{"rank": 0, "pid": 10}]})
    assert rd.read_json("state.json") == {"attempt": 2, "ranks": [{"rank": 0, "pid": 10}]}
    rd.write_json("state.json", {"attempt": 3})
    assert rd.read_json("state.json") == {"attempt": 3}
    assert sorted(os.listdir(rd.path)) == ["state.json"]  # no temp file left behind


def test_write_json_stringifies_unknown_types(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    rd.write_json("x.json", {"path": tmp_path})
    assert rd.read_json("x.json") == {"path": str(tmp_path)}


def test_write_json_is_atomic(tmp_path, monkeypatch):
    rd = RunDir(str(tmp_path / "run"))
    rd.write_json(LAUNCHER, {"pid": 1})
    seen = []
    real_replace = os.replace

    def checking_replace(src, dst):
        # at the moment of the swap the target still holds the complete old content,
        # and the new content is complete in a sibling file
        with open(dst, encoding="utf-8") as fh:
            seen.append(json.load(fh))
        with open(src, encoding="utf-8") as fh:
            seen.append(json.load(fh))
        assert os.path.dirname(src) == os.path.dirname(dst)
        real_replace(src, dst)

    monkeypatch.setattr(rundir_mod.os, "replace", checking_replace)
    rd.write_json(LAUNCHER, {"pid": 2, "big": "x" * 100000})
    assert seen[0] == {"pid": 1}
    assert seen[1]["pid"] == 2
    assert rd.read_json(LAUNCHER)["pid"] == 2


def test_failed_write_keeps_the_old_content(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    rd.write_json("state.json", {"ok": True})
    circular = {}
    circular["self"] = circular
    with pytest.raises(ValueError):
        rd.write_json("state.json", circular)
    assert rd.read_json("state.json") == {"ok": True}


def test_read_json_missing_or_corrupt_is_none(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    assert rd.read_json("missing.json") is None
    with open(rd.file("bad.json"), "w") as fh:
        fh.write('{"pid": ')
    assert rd.read_json("bad.json") is None


# --------------------------------------------------------------------------- default_run_dir

def test_default_run_dir_launcher_run_dir_wins():
    assert default_run_dir({"LAUNCHER_RUN_DIR": "/a", "XDG_RUNTIME_DIR": "/run/user/7"}) == "/a"


def test_default_run_dir_xdg_runtime_dir():
    assert default_run_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/launcher"
    assert default_run_dir({"LAUNCHER_RUN_DIR": "", "XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/launcher"


def test_default_run_dir_tmp_fallback():
    assert default_run_dir({}) == f"/tmp/launcher-{os.getuid()}"
    assert default_run_dir({"XDG_RUNTIME_DIR": ""}) == f"/tmp/launcher-{os.getuid()}"


def test_default_run_dir_reads_os_environ(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/99")
    assert default_run_dir() == "/run/user/99/launcher"
    monkeypatch.setenv("LAUNCHER_RUN_DIR", "/srv/rd")
    assert default_run_dir() == "/srv/rd"


def test_write_on_a_full_disk_warns_once_and_keeps_the_old_content(tmp_path, caplog):
    rd = RunDir(str(tmp_path / "run"))
    assert rd.write_json("state.json", {"ok": True}) is True
    tmp = rd.file(f"state.json.{os.getpid()}.tmp")
    for _ in range(2):
        os.symlink("/dev/full", tmp)  # the temp file's writes fail with ENOSPC, as on a full disk
        with caplog.at_level("WARNING", logger="launcher.rundir"):
            assert rd.write_json("state.json", {"ok": False}) is False
        assert not os.path.lexists(tmp)
    assert rd.read_json("state.json") == {"ok": True}
    warnings = [r.getMessage() for r in caplog.records if "state.json" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
