"""cgroup v2 discovery (parsers: examples, properties, malformed input) and one cgroup's operations."""

import logging
import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from launcher.supervision import cgroup as cg
from tests.helpers.procs import pid_alive, wait_until

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CONTAINER = "1210 1201 0:27 / /sys/fs/cgroup ro,nosuid shared:9 master:3 - cgroup2 cgroup2 rw,nsdelegate\n"
BIND = "77 60 0:27 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def test_mount_of_a_hybrid_host_and_a_container():
    assert cg.cgroup2_mount(HYBRID) == ("/", "/sys/fs/cgroup/unified")
    assert cg.cgroup2_mount(CONTAINER) == ("/", "/sys/fs/cgroup")  # optional fields before " - "
    assert cg.cgroup2_mount(HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup")) is None


def test_mount_point_with_escaped_space():
    text = r"9 1 0:5 / /mnt/my\040cgroups rw - cgroup2 none rw" + "\n"
    assert cg.cgroup2_mount(text) == ("/", "/mnt/my cgroups")


@pytest.mark.parametrize("text", ["", "garbage", " - cgroup2", "1 2 3 - cgroup2 x", "\n\n - \n",
                                  "1 2 0:1 / /x rw -cgroup2 cgroup2 rw", "1 2 0:1 / /x rw - "])
def test_malformed_mountinfo_is_no_mount(text):
    assert cg.cgroup2_mount(text) is None


@given(st.text())
def test_mountinfo_parser_never_raises(text):
    cg.cgroup2_mount(text)


def test_own_cgroup_is_the_v2_line():
    assert cg.own_cgroup("9:name=systemd:/\n4:memory:/x\n0::/\n") == "/"
    assert cg.own_cgroup("0::/system.slice/job.service\n") == "/system.slice/job.service"
    assert cg.own_cgroup("4:memory:/x\n") is None  # cgroup v1 only
    assert cg.own_cgroup("0::/gone (deleted)\n") is None
    assert cg.own_cgroup("0::relative\n") is None


@given(st.text())
def test_proc_cgroup_parser_never_raises(text):
    cg.own_cgroup(text)


def test_directory_under_a_mount_of_a_subtree():
    assert cg.cgroup_directory("/", "/sys/fs/cgroup", "/") == "/sys/fs/cgroup"
    assert cg.cgroup_directory("/kubepods/pod1", "/sys/fs/cgroup", "/kubepods/pod1/c") == "/sys/fs/cgroup/c"
    assert cg.cgroup_directory("/kubepods/pod1", "/sys/fs/cgroup", "/kubepods/pod10") is None
    assert cg.cgroup_directory("/kubepods/pod1", "/sys/fs/cgroup", "/other") is None


@given(st.lists(st.text(st.characters(blacklist_characters="/\0"), min_size=1), max_size=4),
       st.lists(st.text(st.characters(blacklist_characters="/\0"), min_size=1), max_size=3))
def test_directory_property(root_parts, rest):
    root = "/" + "/".join(root_parts)
    path = "/".join([root.rstrip("/")] + rest) if rest else root
    assert cg.cgroup_directory(root, "/mnt", path) == "/mnt" + path[len(root.rstrip("/")):].rstrip("/")


def test_switched_off_by_the_environment_says_so_once(caplog):
    caplog.set_level(logging.INFO, logger="launcher.supervision.cgroup")
    assert cg.job_cgroup("x", {"LAUNCHER_CGROUP": "off"}) is None
    assert [r.getMessage() for r in caplog.records if "job cgroup not used" in r.getMessage()] == [
        "job cgroup not used (LAUNCHER_CGROUP=off): processes that leave their rank's group are found by "
        "their environment token and as re-parented orphans instead"]


def test_a_directory_without_kill_or_freeze_is_not_used(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="launcher.supervision.cgroup")
    group = cg.Cgroup(str(tmp_path / "job"))
    assert not group.create()
    assert not os.path.exists(group.path)
    assert "Linux older than 5.2" in caplog.text


def writable_parent():
    parent = cg.job_cgroup("probe", os.environ)
    return os.path.dirname(parent.path) if parent else None


needs_cgroup = pytest.mark.skipif(os.environ.get("LAUNCHER_CGROUP") == "off" or writable_parent() is None,
                                  reason="no writable cgroup v2 here")


@needs_cgroup
@pytest.mark.parametrize("use_kill_file", [True, False], ids=["cgroup.kill", "freeze-and-kill"])
def test_kill_ends_every_member_and_remove_cleans_up(use_kill_file):
    group = cg.Cgroup(os.path.join(writable_parent(), f"test-cgroup-{os.getpid()}"), use_kill_file)
    assert group.create()
    leaf = cg.Cgroup(os.path.join(group.path, "leaf"))
    os.mkdir(leaf.path)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
             for _ in range(2)]
    for proc in procs:
        cg.write_file(leaf.file("cgroup.procs"), str(proc.pid))
    try:
        assert sorted(leaf.procs()) == sorted(p.pid for p in procs)
        assert group.populated() and not group.remove()  # busy while they live
        group.kill()  # the parent: every descendant cgroup too
        for proc in procs:
            proc.wait(10)
        assert not group.populated()
        assert group.remove() and not os.path.exists(group.path)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        group.remove()
    assert wait_until(lambda: not any(pid_alive(p.pid) for p in procs))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@needs_cgroup
def test_remove_stale_takes_only_what_killed_launchers_left():
    """Beside a job's cgroup: those of a dead pid and of this pid with another token go (with their
    attempts' cgroups); a live pid's, one with a process in it, and anything not named like a job's stay."""
    parent = cg.Cgroup(os.path.join(writable_parent(), f"test-stale-{os.getpid()}"))
    assert parent.create()
    me, dead = os.getpid(), _dead_pid()
    names = {"dead": f"launcher-{dead}-01", "mine": f"launcher-{me}-02", "live": "launcher-1-03",
             "busy": f"launcher-{dead}-04", "own": f"launcher-{me}-aa", "other": "launcher-x-05"}
    for name in names.values():
        os.mkdir(os.path.join(parent.path, name))
    os.mkdir(os.path.join(parent.path, names["dead"], "a0"))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        cg.write_file(os.path.join(parent.path, names["busy"], "cgroup.procs"), str(sleeper.pid))
        removed = cg.remove_stale(os.path.join(parent.path, names["own"]))
        assert sorted(removed) == sorted(os.path.join(parent.path, names[k]) for k in ("dead", "mine"))
        assert set(os.listdir(parent.path)) >= {names[k] for k in ("live", "busy", "own", "other")}
        assert not any(os.path.exists(path) for path in removed)
    finally:
        sleeper.kill()
        sleeper.wait()
        cg.Cgroup(os.path.join(parent.path, names["busy"])).kill()
        assert wait_until(lambda: parent.remove(), 10)


def test_remove_stale_without_a_readable_parent_removes_nothing(tmp_path):
    assert cg.remove_stale(str(tmp_path / "gone" / "launcher-1-aa")) == []
