"""``launcher.run.jobstart`` and the Session that takes it over: the job's tree and orphan guard, begun
before the session's imports, released whatever happens before the ranks run.

These move this (pytest's) process into a real cgroup v2 and out again, as the launcher does; they
skip where no writable cgroup v2 is mounted.
"""

import os

import pytest

from launcher.common.errors import LauncherError
from launcher.common.rundir import RunDir
from launcher.jobspec.options import RunOptions
from launcher.run.jobstart import JobStart
from launcher.run.runner import job_context, resolve_topology, run_spec
from launcher.supervision import jobtree
from launcher.supervision.jobtree import JobTree
from tests.helpers.procs import wait_until


def own_cgroup(pid: object = "self") -> str:
    return jobtree.read_file(f"/proc/{pid}/cgroup").decode().strip().rpartition(":")[2]


@pytest.fixture(autouse=True)
def writable_cgroup():
    if not JobTree.create().contained or os.environ.get("LAUNCHER_CGROUP") == "off":
        pytest.skip("no writable cgroup v2 here")


def reap(start: JobStart) -> None:
    """The guard exits once its pipe is closed (abandon): reap it as the launcher's exit would."""
    _pid, status = os.waitpid(start.guard.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_guard_is_born_outside_the_first_attempts_cgroup_and_abandon_undoes_the_move():
    before = own_cgroup()
    start = JobStart.begin()
    try:
        # Forked before the move began: never killed with an attempt's cgroup.
        assert own_cgroup(start.guard.pid) == before
        with start.tree.inside("a0") as cgroup:  # the move begun by begin(), waited for here
            assert own_cgroup().endswith("/a0") and cgroup.path.endswith("/a0")
        assert own_cgroup() == before
        start.tree.prepare("a0")  # moving again, as when the run ends before its first ranks
    finally:
        start.abandon()
        reap(start)
    assert own_cgroup() == before
    assert not os.path.exists(start.tree.cgroup.path)


def test_a_session_that_cannot_start_releases_the_tree_and_the_guard(tmp_path):
    from launcher.run.session import Session

    environ = dict(os.environ)
    spec = run_spec(RunOptions(command=("true",), nproc_per_node=1, run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "logs")), environ)
    spec, topo = resolve_topology(spec, environ)
    ctx = job_context(spec, topo, environ)
    holder = RunDir(ctx.run_dir)
    holder.lock()  # another launcher runs on this run dir
    before = own_cgroup()
    start = JobStart.begin()
    try:
        with pytest.raises(LauncherError, match="another launcher"):
            with Session(spec, ctx, start):
                pass
        assert own_cgroup() == before  # not left inside the attempt's cgroup the move was heading for
        assert not os.path.exists(start.tree.cgroup.path)
        reap(start)
    finally:
        holder.close()
        start.tree.unprepare()


def test_a_run_dir_the_session_refuses_releases_what_began_before_it(tmp_path, monkeypatch):
    """``Session()`` itself may refuse the run dir (exit 2): ``runner.execute`` releases what
    ``JobStart.begin`` began, and the launcher does not exit on its way into a cgroup."""
    from launcher.common.errors import UsageError
    from launcher.run import jobstart, runner

    began = []
    real_begin = jobstart.JobStart.begin
    monkeypatch.setattr(jobstart.JobStart, "begin", classmethod(lambda cls: began.append(real_begin()) or began[-1]))

    def refuse(*_args):
        raise UsageError("run dir refused")

    monkeypatch.setattr("launcher.run.session.Session.__init__", refuse)
    before = own_cgroup()
    with pytest.raises(UsageError, match="run dir refused"):
        runner.execute(RunOptions(command=("true",), nproc_per_node=1, run_dir=str(tmp_path / "run"),
                                  log_dir=str(tmp_path / "logs")), dict(os.environ))
    [start] = began
    assert own_cgroup() == before and not os.path.exists(start.tree.cgroup.path)
    reap(start)


def test_the_guard_removes_the_cgroups_killed_launchers_left_and_nothing_else():
    """Beside the job's cgroup: one of a launcher that is gone (a dead pid, with an attempt's cgroup
    below) and one of this pid with another token are removed by the guard at its start; one of a
    live process stays."""
    import subprocess

    parent = os.path.dirname(JobTree.create().cgroup.path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [os.path.join(parent, f"launcher-{dead.pid}-0badf00d"), os.path.join(parent, f"launcher-{os.getpid()}-0ld")]
    live = os.path.join(parent, "launcher-1-0live")
    for path in (*stale, live):
        os.mkdir(path)
    os.mkdir(os.path.join(stale[0], "a1"))
    start = JobStart.begin()
    try:
        assert wait_until(lambda: not any(os.path.exists(path) for path in stale), 10)
        assert os.path.isdir(live)
    finally:
        start.abandon()
        reap(start)
        os.rmdir(live)
