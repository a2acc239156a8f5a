"""The job's process tree: /proc parsing, verified kills, the token / orphan sweep, leaves, reports."""

import logging
import os
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import given, strategies as st

from launcher.supervision import jobtree
from launcher.supervision.jobtree import JobTree, Leaf, Stray
from tests.helpers import procs as procs_mod
from tests.helpers.procs import pid_alive, wait_until

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
TOKEN = procs_mod.TOKEN  # replaced per test by _own_token


@pytest.fixture(autouse=True)
def _own_token(monkeypatch):
    """A token of this test's own (the process's token plus a counter): a sweep or orphan guard that an
    earlier test of this worker process left running must not find, and kill, this test's processes
    (seen once in a full run: a sweep found its own process gone)."""
    _own_token.count = getattr(_own_token, "count", 0) + 1
    monkeypatch.setattr(sys.modules[__name__], "TOKEN", f"{procs_mod.TOKEN}x{_own_token.count}")


@given(st.binary(max_size=16).filter(lambda comm: b"\0" not in comm))
def test_stat_parser_copes_with_any_command_name(comm):
    data = b"4242 (" + comm + b") S 17 4242 4242 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 987654 1 2"
    assert jobtree.parse_stat(data) == jobtree.ProcStat(4242, "S", 17, 4242, 987654, 4194560)


def test_kernel_threads_are_told_apart_by_their_flags():
    assert jobtree.read_stat(2).kernel_thread  # kthreadd
    assert not jobtree.read_stat(os.getpid()).kernel_thread


def test_a_process_in_the_middle_of_an_exec_is_scanned_again_not_missed(monkeypatch):
    """Between an exec's new memory and its environment, /proc shows an empty environment: the scan
    that read it so must look again (this race let kill_all miss a token carrier under load)."""
    job = JobTree.create()
    seen = []
    real = jobtree._carries

    def carries(pid, needle):  # the first reads of one process land in the window
        seen.append(pid)
        return None if seen.count(pid) <= 2 and pid == target.pid else real(pid, needle)

    monkeypatch.setattr(jobtree, "_carries", carries)
    target = subprocess.Popen(SLEEP, env={**os.environ, **Leaf(f"{job.token}.a0-r1").env}, start_new_session=True)
    try:
        strays = job.sweep(time.monotonic() + 10, lambda: None)
        assert [s.pid for s in strays] == [target.pid] and target.wait(10) == -9
    finally:
        target.kill()
        target.wait()


def test_own_stat():
    stat = jobtree.read_stat(os.getpid())
    assert (stat.pid, stat.ppid, stat.state) == (os.getpid(), os.getppid(), "R")
    assert jobtree.read_stat(2 ** 22 + 1) is None  # above pid_max: never a process


@pytest.fixture
def procs():
    started = []

    def start(env=None, **kwargs):
        proc = subprocess.Popen(SLEEP, env={**os.environ, **(env or {})}, start_new_session=True, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_kill_verified_checks_the_start_time(procs):
    proc = procs()
    start = jobtree.read_stat(proc.pid).start
    assert not jobtree.kill_verified(proc.pid, start + 1)  # another process that reused the pid
    assert proc.poll() is None
    assert jobtree.kill_verified(proc.pid, start)
    assert proc.wait(10) == -9
    assert not jobtree.kill_verified(proc.pid, start)


def tree(adopt_orphans=False):
    return JobTree(TOKEN, None, adopt_orphans)


def test_sweep_kills_the_job_token_carriers_only(procs):
    job = tree()
    mine = procs(Leaf(f"{TOKEN}.a0-r0").env)
    other_job = procs({"LAUNCHER_JOB_TOKEN": "other.a0-r0"})
    plain = procs()
    strays = job.sweep(time.monotonic() + 10, lambda: None)
    assert strays == [Stray(mine.pid, " ".join(SLEEP), "token")]
    assert mine.wait(10) == -9
    assert other_job.poll() is None and plain.poll() is None


def test_sweep_of_one_leaf_spares_the_other_leaves(procs):
    job = tree()
    leaf0, leaf10 = Leaf(f"{TOKEN}.a0-r1"), Leaf(f"{TOKEN}.a0-r10")
    first, second = procs(leaf0.env), procs(leaf10.env)
    assert [s.pid for s in job.sweep(time.monotonic() + 10, lambda: None, leaf=leaf0)] == [first.pid]
    assert first.wait(10) == -9 and second.poll() is None


def test_sweep_skips_exempt_pids_and_process_groups(procs):
    job = tree()
    exempt, grouped = procs(Leaf(f"{TOKEN}.x").env), procs(Leaf(f"{TOKEN}.y").env)
    assert job.sweep(time.monotonic() + 10, lambda: None, exempt=[exempt.pid], skip_pgids=[grouped.pid]) == []


def test_sweep_adopts_orphans_that_dropped_the_token(procs):
    """With ``adopt_orphans`` a child of ours that is not exempt is the job's, token or not."""
    job = tree(adopt_orphans=True)
    orphan = procs()
    others = [p.pid for p in psutil.Process().children() if p.pid != orphan.pid]  # e.g. pytest's own
    strays = job.sweep(time.monotonic() + 10, lambda: None, exempt=others)
    assert [(s.pid, s.found) for s in strays] == [(orphan.pid, "reparented")]
    assert orphan.wait(10) == -9


def test_a_cgroup_that_refuses_us_leaves_the_job_uncontained(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="launcher.supervision.cgroup")
    job = JobTree(TOKEN, jobtree.Cgroup(str(tmp_path / "job")))
    job._created = True  # as if created: its attempt cgroups have no cgroup.procs to write
    with job.inside("a0") as cgroup:
        assert cgroup is None
    assert not job.contained and not (tmp_path / "job" / "a0").exists()
    with job.inside("a1") as cgroup:
        assert cgroup is None
    assert job.leaf("a1-r0", None) == Leaf(f"{TOKEN}.a1-r0")
    assert caplog.text.count("job cgroup not used") == 1


def test_report_logs_and_emits_only_when_something_escaped(caplog):
    events = []
    jobtree.report_escaped(lambda *a, **k: events.append((a, k)), [], attempt=0)
    assert events == []
    jobtree.report_escaped(lambda *a, **k: events.append((a, k)), [Stray(7, "sleep 600", "cgroup")], attempt=2)
    assert events == [(("escaped_processes",), {"processes": [{"pid": 7, "cmdline": "sleep 600",
                                                                "found": "cgroup"}], "attempt": 2})]
    assert "pid 7 (sleep 600; found by cgroup)" in caplog.text


def real_tree():
    job = JobTree.create()
    if not job.contained or os.environ.get("LAUNCHER_CGROUP") == "off":
        pytest.skip("no writable cgroup v2 here")
    return job


def test_children_are_born_inside_and_kill_leaves_names_the_strays(procs):
    job = real_tree()
    try:
        with job.inside("a0") as cgroup:
            rank, escaped = procs(), procs()
        assert jobtree.read_file(f"/proc/{rank.pid}/cgroup").decode().endswith(f"/a0\n")
        assert os.getpid() not in cgroup.procs()  # back out
        leaves = [job.leaf("a0-r0", cgroup), job.leaf("a0-r1", cgroup)]
        strays = job.kill_leaves(leaves, known_pgids=[rank.pid])
        assert [(s.pid, s.found) for s in strays] == [(escaped.pid, "cgroup")]
        assert rank.wait(10) == -9 and escaped.wait(10) == -9  # cgroup.kill: everyone in it
        job.settle_leaves(leaves, time.monotonic() + 10, lambda: None)
        assert os.path.exists(cgroup.path)  # removed after the next spawns
        job.tidy()
        assert not os.path.exists(cgroup.path)
    finally:
        job.close(time.monotonic() + 5)
    assert not os.path.exists(job.cgroup.path)


def test_kill_leaves_never_kills_a_cgroup_we_are_in(procs):
    job = real_tree()
    try:
        with job.inside("a0") as cgroup:
            child = procs()
            strays = job.kill_leaves([job.leaf("a0-r0", cgroup)], known_pgids=[])
            assert sorted(s.pid for s in strays) == sorted([child.pid, os.getpid()])
        assert child.poll() is None  # nothing killed while we sat inside
    finally:
        job.kill_all(time.monotonic() + 10)


def test_kill_all_the_orphan_guards_part(procs):
    """The launcher is gone: the guard kills the job's cgroup and its token carriers, removes the cgroup."""
    job = real_tree()
    with job.inside("a0"):
        inside = procs()  # no token: the cgroup finds it
    outside = procs(Leaf(f"{job.token}.a0-r1").env)  # no cgroup: the token finds it
    job.kill_all(time.monotonic() + 10)
    assert inside.wait(10) == -9 and outside.wait(10) == -9
    assert not os.path.exists(job.cgroup.path)
    assert wait_until(lambda: not pid_alive(inside.pid))


def _own_cgroup():
    return jobtree.read_file("/proc/self/cgroup").decode().strip().rpartition(":")[2]


def test_a_prepared_move_is_the_one_the_spawns_use_and_is_undone_when_they_do_not_come(procs):
    job = real_tree()
    before = _own_cgroup()
    try:
        job.prepare("a0")
        with job.inside("a0") as cgroup:
            rank = procs()
        assert jobtree.read_file(f"/proc/{rank.pid}/cgroup").decode().endswith("/a0\n")
        assert _own_cgroup() == before
        job.prepare("a1")
        with job.inside("a2") as cgroup:  # another attempt than prepared: born where asked
            other = procs()
        assert cgroup.path.endswith("/a2") and jobtree.read_file(f"/proc/{other.pid}/cgroup").decode().endswith("/a2\n")
        assert _own_cgroup() == before
        job.prepare("a3")
        job.unprepare()
        assert _own_cgroup() == before
        job.prepare("a4")  # the run ends before its spawns: close backs out, then removes the cgroup
    finally:
        job.kill_all(time.monotonic() + 10)
    assert _own_cgroup() == before and not os.path.exists(job.cgroup.path)
