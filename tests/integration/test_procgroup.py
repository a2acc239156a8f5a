"""The process-group mechanism on its own: spawning, exit events, escapees (the loop itself: test_eventloop)."""

import os
import sys

import pytest

from launcher.supervision.cgroup import Cgroup
from launcher.supervision.jobtree import JobTree
from launcher.supervision.procgroup import LocalProcessGroup, RankExited
from launcher.jobspec.rankenv import WorkerSpec
from tests.helpers.procs import TOKEN, pid_alive, wait_until


@pytest.fixture
def group(tmp_path):
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / f"a{attempt}" / f"r{spec.rank}.log"),
                            lambda spec: False)
    yield grp
    grp.ensure_gone(5)
    grp.close()


def spec(rank, code):
    return WorkerSpec(rank, rank, rank, "worker", (sys.executable, "-c", f"import sys; sys.exit({code})"), {})


def test_exit_events_carry_codes_and_pids_are_reaped(group, tmp_path):
    group.start([spec(0, 0), spec(1, 3)], 0)
    events = [group.wait_event(10), group.wait_event(10)]
    assert sorted((e.rank, e.info.returncode) for e in events if isinstance(e, RankExited)) == [(0, 0), (1, 3)]
    assert group.pids() == {}
    assert (tmp_path / "a0" / "r1.log").exists()


def test_a_log_file_that_cannot_be_created_does_not_stop_the_rank(tmp_path, caplog):
    """The log disk refuses new files (here: a path under a regular file): the rank starts anyway, its
    exit is seen, and the failure is reported once per rank across attempts."""
    (tmp_path / "not-a-dir").write_text("")
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / "not-a-dir" / f"a{attempt}" / f"r{spec.rank}.log"),
                            lambda spec: spec.rank == 0)
    try:
        with caplog.at_level("WARNING", logger="launcher.supervision.procgroup"):
            for attempt in (0, 1):
                grp.start([spec(0, 4), spec(1, 0)], attempt)
                events = [grp.wait_event(10), grp.wait_event(10)]
                assert sorted((e.rank, e.info.returncode) for e in events) == [(0, 4), (1, 0)]
                grp.ensure_gone(5)
    finally:
        grp.ensure_gone(5)
        grp.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("cannot create its log file" in w for w in warnings), warnings


# A rank whose child moves to a session of its own, writes its pid to argv[1] and sleeps.
ESCAPING = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    os.execv("/bin/sleep", ["sleep", "60"])
time.sleep(60)
"""


@pytest.fixture(params=["cgroup", "no-cgroup"])
def job(request):
    environ = {"LAUNCHER_CGROUP": "off"} if request.param == "no-cgroup" else {}
    tree = JobTree.create(environ=environ)
    if request.param == "cgroup" and not tree.contained:
        pytest.skip("no writable cgroup v2 here")
    return tree


def test_respawn_and_ensure_gone_kill_what_left_the_group(tmp_path, job):
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / f"r{spec.rank}-{attempt}.log"), lambda spec: False,
                            tree=job)
    files = [tmp_path / f"escapee{rank}" for rank in (0, 1)]
    specs = [WorkerSpec(r, r, r, "worker", (sys.executable, "-c", ESCAPING, str(files[r])), {}) for r in (0, 1)]
    try:
        grp.start(specs, 0)
        assert wait_until(lambda: all(f.exists() for f in files))
        pids = [int(f.read_text()) for f in files]
        grp.respawn(specs[0], 1)  # rank 0 alone: its escapee goes, rank 1's stays
        assert [s.pid for s in grp.take_escaped()] == [pids[0]]
        assert wait_until(lambda: not pid_alive(pids[0])) and pid_alive(pids[1])
        grp.ensure_gone(5)
        assert pids[1] in [s.pid for s in grp.take_escaped()]
        assert not pid_alive(pids[1])
    finally:
        grp.ensure_gone(5, final=True)
        grp.close()
    if job.cgroup is not None:
        assert not os.path.exists(job.cgroup.path)


def test_a_rank_the_cgroup_refuses_starts_without_it(tmp_path):
    """Moving into the attempt's cgroup fails (no cgroup.procs here): the rank runs, the job goes on uncontained."""
    tree = JobTree(TOKEN, Cgroup(str(tmp_path / "job")))
    tree._created = True
    grp = LocalProcessGroup(lambda spec, attempt: str(tmp_path / "r.log"), lambda spec: False, tree=tree)
    try:
        grp.start([spec(0, 0)], 0)
        event = grp.wait_event(10)
        assert isinstance(event, RankExited) and event.info.returncode == 0
        assert not tree.contained
    finally:
        grp.ensure_gone(5)
        grp.close()
