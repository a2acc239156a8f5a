"""Unit tests for ``launcher.common.rundir``: the private, locked run dir and its JSON files."""

import json
import os
import stat

import pytest

from launcher.common import rundir as rundir_mod
from launcher.common.errors import LauncherError, UsageError
from launcher.common.rundir import LAUNCHER, RunDir, base_dir, check_ancestors, check_private


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

    def checking_replace(src, dst, src_dir_fd=None, dst_dir_fd=None):
        # at the moment of the swap the target still holds the complete old content,
        # and the new content is complete in a sibling file (both relative to the run dir's fd)
        assert src_dir_fd == dst_dir_fd == rd.fd and "/" not in src + dst
        with open(rd.file(dst), encoding="utf-8") as fh:
            seen.append(json.load(fh))
        with open(rd.file(src), encoding="utf-8") as fh:
            seen.append(json.load(fh))
        real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

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


# --------------------------------------------------------------------------- base_dir

def test_base_dir_xdg_runtime_dir():
    assert base_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/launcher"
    assert base_dir({"LAUNCHER_RUN_DIR": "/a", "XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/launcher"


def test_base_dir_tmp_fallback():
    assert base_dir({}) == f"/tmp/launcher-{os.getuid()}"
    assert base_dir({"XDG_RUNTIME_DIR": ""}) == f"/tmp/launcher-{os.getuid()}"


def test_base_dir_reads_os_environ(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/99")
    assert base_dir() == "/run/user/99/launcher"


def test_write_on_a_full_disk_warns_once_and_keeps_the_old_content(tmp_path, caplog, monkeypatch):
    import errno
    import json as json_mod

    rd = RunDir(str(tmp_path / "run"))
    assert rd.write_json("state.json", {"ok": True}) is True

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json_mod, "dumps", full_disk)  # the temp file's writes fail as on a full disk
    for _ in range(2):
        with caplog.at_level("WARNING", logger="launcher.common.rundir"):
            assert rd.write_json("state.json", {"ok": False}) is False
        assert not os.path.lexists(rd.file(f"state.json.{os.getpid()}.tmp"))
    monkeypatch.undo()
    assert rd.read_json("state.json") == {"ok": True}
    warnings = [r.getMessage() for r in caplog.records if "state.json" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
    rd.close()


# --------------------------------------------------------------------------- swapping attacks (issue #17.4)

NOBODY = 65534


@pytest.fixture
def public_tmp():
    """A directory under /tmp that another uid can traverse (pytest's tmp_path is 0700 root's)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(dir="/tmp", prefix="rd-")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_uid(uid, action):
    """Run ``action()`` in a forked child as ``uid``; raises if it failed there."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            action()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the other uid's action failed"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_uid_cannot_swap_the_run_dir_of_root(public_tmp):
    """The reported attack: root's run dir in a directory another uid can write."""
    shared = os.path.join(public_tmp, "shared")
    os.mkdir(shared, 0o755)
    os.chown(shared, NOBODY, NOBODY)
    victim = os.path.join(public_tmp, "victim")
    os.mkdir(victim, 0o700)
    with open(os.path.join(victim, LAUNCHER), "w") as fh:
        fh.write("root's own file")
    run = os.path.join(shared, "run")
    refused = None
    try:
        rd = RunDir(run)
    except UsageError as exc:
        refused = exc
    else:  # the old check let it through; the other uid swaps the dir for a symlink to root's files
        as_uid(NOBODY, lambda: (os.rename(run, run + ".old"), os.symlink(victim, run)))
        rd.write_json(LAUNCHER, {"pid": 1})
        rd.close()
    assert open(os.path.join(victim, LAUNCHER)).read() == "root's own file"
    assert refused is not None and refused.exit_code == 2
    assert f"{shared} belongs to uid {NOBODY}" in refused.message and "\n" not in refused.message


@pytest.mark.parametrize("mode, ok", [(0o777, False), (0o775, False), (0o757, False), (0o1777, True),
                                      (0o755, True), (0o700, True)])
def test_ancestors_writable_by_others_refused_unless_sticky(tmp_path, mode, ok):
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(mode)
    if ok:
        RunDir(str(parent / "a" / "run")).close()
        return
    with pytest.raises(UsageError) as exc:
        RunDir(str(parent / "a" / "run"))
    assert f"{parent} is writable by" in exc.value.message and "not sticky" in exc.value.message
    assert not (parent / "a").exists()  # refused before creating anything in it


def test_ancestor_symlinks_are_followed_and_checked(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "real").mkdir()
    (tmp_path / "link").symlink_to(open_dir / "real")  # a trusted link into an untrusted directory
    with pytest.raises(UsageError) as exc:
        check_ancestors(str(tmp_path / "link" / "run"))
    assert str(open_dir) in exc.value.message
    (tmp_path / "ok").mkdir()
    (tmp_path / "link2").symlink_to("ok")  # relative, all trusted
    check_ancestors(str(tmp_path / "link2" / "run"))


def test_writes_do_not_follow_a_run_dir_swapped_after_opening(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / LAUNCHER).write_text("precious")
    os.rename(rd.path, str(tmp_path / "moved"))
    os.symlink(str(victim), rd.path)  # what the attacker does between the check and the write
    rd.write_json(LAUNCHER, {"pid": 1})
    rd.lock()
    assert (victim / LAUNCHER).read_text() == "precious" and not (victim / "lock").exists()
    assert json.loads((tmp_path / "moved" / LAUNCHER).read_text()) == {"pid": 1}
    assert rd.read_json(LAUNCHER) == {"pid": 1}
    rd.close()


def test_write_json_never_follows_a_planted_temp_file_symlink(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    victim = tmp_path / "secret"
    victim.write_text("precious")
    os.symlink(str(victim), rd.file(f"{LAUNCHER}.{os.getpid()}.tmp"))
    os.symlink(str(victim), rd.file("state.json"))
    rd.write_json(LAUNCHER, {"pid": 1})
    rd.write_json("state.json", {"attempt": 0})  # replaces the symlink itself
    assert victim.read_text() == "precious"
    assert rd.read_json(LAUNCHER) == {"pid": 1} and not os.path.islink(rd.file("state.json"))
    rd.close()


def test_read_json_does_not_follow_symlinks(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    (tmp_path / "other.json").write_text('{"forged": true}')
    os.symlink(str(tmp_path / "other.json"), rd.file(rundir_mod.STATE))
    assert rd.read_json(rundir_mod.STATE) is None
    rd.close()


# --------------------------------------------------------------------------- unix socket path length

def long_dir(tmp_path):
    path = tmp_path
    for part in ("a" * 60, "b" * 60):
        path = path / part
    return path


def test_a_long_run_dir_gets_a_short_socket_address(tmp_path):
    import socket

    rd = RunDir(str(long_dir(tmp_path) / "run"))
    assert len(rd.file(rundir_mod.CONTROL_SOCKET)) > 108
    address = rd.socket_address()
    assert len(address) < 40
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(address)
        server.listen()
        client_side = RunDir(rd.path, create=False)  # another opener, e.g. launcher prestop
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(client_side.socket_address())
        client_side.close()
    assert os.path.exists(rd.file(rundir_mod.CONTROL_SOCKET))
    rd.close()


def test_without_proc_a_long_socket_path_is_refused_in_one_line(tmp_path, monkeypatch):
    rd = RunDir(str(long_dir(tmp_path) / "run"))
    short = RunDir(str(tmp_path / "r"))
    real_isdir = os.path.isdir
    monkeypatch.setattr(rundir_mod.os.path, "isdir", lambda p: False if p.startswith("/proc/") else real_isdir(p))
    with pytest.raises(UsageError) as exc:
        rd.socket_address()
    assert "too long for a unix socket" in exc.value.message and exc.value.exit_code == 2
    assert short.socket_address() == short.file(rundir_mod.CONTROL_SOCKET)
    rd.close()
    short.close()


def test_open_without_create_missing_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        RunDir(str(tmp_path / "nothing"), create=False)
    assert not (tmp_path / "nothing").exists()


def test_a_planted_base_dir_is_refused_never_followed(tmp_path, monkeypatch):
    """Issue #27.5: ``$XDG_RUNTIME_DIR/launcher`` made a symlink by someone else."""
    from launcher.common import jobs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "launcher").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="is a symlink: refused"):
        RunDir(str(tmp_path / "launcher" / "job"))
    with pytest.raises(UsageError, match="is a symlink: refused"):
        jobs.scan(str(tmp_path / "launcher"))
    assert list(elsewhere.iterdir()) == []


def test_the_base_dir_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    RunDir(str(tmp_path / "launcher" / "job")).close()
    assert stat.S_IMODE((tmp_path / "launcher").stat().st_mode) == 0o700
