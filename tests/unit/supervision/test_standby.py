"""Unit tests for ``launcher.supervision.standby.StandbyPool`` with a scripted event loop: when a standby
may take a rank (ready, same command, same start-time variables) and what happens to one that may not."""

import os
import select
import shutil
import subprocess
import sys

import pytest

from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.jobtree import JobTree
from launcher.supervision import standby as standby_mod
from launcher.supervision import standbyauto
from launcher.supervision.standby import StandbyPool
from launcher.supervision.standbyauto import LEARN_POLL
from launcher.supervision.standbylearn import ImportsLog
from tests.helpers.procs import TOKEN

SCRIPT = os.path.abspath(__file__)


class Loop:
    """The parts of the process group's event loop the pool uses, driven by the test."""

    def __init__(self):
        self.readers, self.watched, self.timers = {}, {}, []

    def add_reader(self, fd, callback):
        self.readers[fd] = callback

    def remove_reader(self, fd):
        self.readers.pop(fd, None)

    def watch_pid(self, pid, callback):
        self.watched[pid] = callback

    def unwatch_pid(self, pid):
        self.watched.pop(pid, None)

    def call_later(self, delay, callback):
        self.timers.append((delay, callback))

    def pids(self):
        return {0: os.getpid()}  # the running ranks: this process stands in

    def answer(self, timeout=60.0):
        """Wait for a standby's answer and hand it to the pool, as the loop would."""
        fds = list(self.readers)
        ready, _, _ = select.select(fds, [], [], timeout)
        assert ready, "no standby answered"
        for fd in ready:
            self.readers[fd]()


def env(**variables):
    """A rank's environment as the process group passes it: the launcher's, then the rank's variables."""
    return {**os.environ, **variables}


def spec(rank=0, env=None, argv=(sys.executable, SCRIPT)):
    return WorkerSpec(rank, rank, rank, "worker", tuple(argv), env or {"RANK": str(rank)})


@pytest.fixture
def pool(tmp_path):
    events = []
    made = StandbyPool(("json",), 0, str(tmp_path / "standby"), lambda name, **fields: events.append((name, fields)))
    loop = Loop()
    made.attach(loop, JobTree(TOKEN, None), None)
    made.events, made.test_loop = events, loop
    yield made
    made.close()


def test_first_standbys_wait_for_the_ranks_then_start(pool):
    pool.after_start([spec(0)], 0)
    [(delay, prepare)] = pool.test_loop.timers
    assert delay == 0.5 and not pool.events  # attempt 0: nothing to report, standbys come later
    prepare()
    pool.test_loop.answer()
    [(name, fields)] = pool.events
    assert name == "standby_ready" and fields["rank"] == 0 and fields["rss_bytes"] > 0


def test_a_standby_still_importing_is_left_for_later(pool):
    pool.prepare([spec(0)])
    assert pool.activate(spec(0), {"RANK": "0"}, {"stdout": 1}) is None
    pool.after_start([spec(0)], 1)
    assert pool.events[-1][1]["cold"]["0"].startswith("its standby is still importing")
    pool.test_loop.answer()  # the same standby serves the next restart
    assert pool.events[-1][0] == "standby_ready"


def test_changed_start_variable_discards_the_standby(pool):
    pool.prepare([spec(0, {"RANK": "0", "OMP_NUM_THREADS": "1"})])
    pool.test_loop.answer()
    pid = pool.events[-1][1]["pid"]
    assert pool.activate(spec(0), env(RANK="0", OMP_NUM_THREADS="4"), {"stdout": 1}) is None
    pool.after_start([spec(0)], 1)
    assert pool.events[-1][1]["cold"] == {"0": "start-time variable(s) changed: OMP_NUM_THREADS"}
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_per_attempt_variables_do_not_matter_and_the_terminal_rank_starts_cold(pool):
    pool.prepare([spec(0, {"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"})])
    pool.test_loop.answer()
    assert pool.activate(spec(0), {"RANK": "0"}, {}) is None  # --debug-rank: the terminal
    assert pool._cold == {0: "it has the terminal (--debug-rank)"}
    assert pool._unusable(pool._standbys[0], spec(0), env(RANK="0", TORCHELASTIC_RESTART_COUNT="1"),
                          {"stdout": 1}) is None


def test_another_command_discards_the_standby(pool):
    pool.prepare([spec(0)])
    pool.test_loop.answer()
    assert pool.activate(spec(0, argv=("bash", "x.sh")), {"RANK": "0"}, {"stdout": 1}) is None
    assert pool._cold == {0: "its command changed"} and not pool._standbys


def test_ranks_no_longer_here_lose_their_standbys(pool):
    pool.prepare([spec(0), spec(1)])
    pool.after_start([spec(1)], 1)  # the rank table changed: rank 0 moved elsewhere
    assert sorted(pool._standbys) == [1]
    pool.after_start([spec(5)], 1, every=False)  # one respawned rank: the others keep theirs
    assert sorted(pool._standbys) == [1]


# -- --preload auto --------------------------------------------------------------------------------
@pytest.fixture
def auto_pool(tmp_path, monkeypatch):
    monkeypatch.setattr(standbyauto, "WARM_AFTER", 0.0)  # when the first standbys start: its own test
    site = tmp_path / "site-packages"
    (site / "fakeheavy").mkdir(parents=True)
    (site / "fakeheavy" / "__init__.py").write_text("")
    (site / "fakeheavy" / "lazy.py").write_text("")
    events = []
    made = StandbyPool((), 0, str(tmp_path / "standby"), lambda name, **fields: events.append((name, fields)),
                       ImportsLog(str(tmp_path / "imports.txt")))
    loop = Loop()
    made.attach(loop, JobTree(TOKEN, None), None)
    made.events, made.test_loop, made.record = events, loop, tmp_path / "imports.txt"
    made.spec = spec(0, {"RANK": "0", "PYTHONPATH": str(site)})
    yield made
    made.close()


def _tick(pool):
    """Run the pool's newest timer (its poll of the record), as the loop would."""
    delay, callback = pool.test_loop.timers.pop()
    assert delay == LEARN_POLL
    callback()


def test_auto_waits_for_the_ranks_imports_to_pause_then_imports_what_they_did(auto_pool):
    auto_pool.after_start([auto_pool.spec], 0)
    auto_pool.record.write_text("fakeheavy\nos\njson.decoder\n")
    _tick(auto_pool)
    _tick(auto_pool)  # one quiet read: the ranks may still be importing
    assert not auto_pool._standbys
    _tick(auto_pool)
    assert auto_pool.modules == ("fakeheavy",) and list(auto_pool._standbys) == [0]
    auto_pool.test_loop.answer()
    assert auto_pool.events[-1][0] == "standby_ready" and auto_pool._standbys[0].ready
    with open(auto_pool.record, "a") as fh:
        fh.write("fakeheavy.lazy\nnot_installed\n")  # a lazy import, and an optional one that failed
    _tick(auto_pool)
    _tick(auto_pool)  # the next quiet read hands the new names to the ready standby
    assert not auto_pool._standbys[0].ready
    auto_pool.test_loop.answer()
    name, fields = auto_pool.events[-1]
    assert name == "standby_ready" and fields["modules"] == ["fakeheavy", "fakeheavy.lazy", "not_installed"]
    assert auto_pool._standbys[0].ready


def test_auto_starts_no_standby_that_does_not_fit_in_memory(auto_pool, monkeypatch):
    monkeypatch.setattr(standbyauto, "memory_room", lambda: (1 << 20, "a 1 MiB test limit"))
    auto_pool.after_start([auto_pool.spec], 0)
    auto_pool.record.write_text("fakeheavy\n")
    for _ in range(4):
        _tick(auto_pool)
    assert not auto_pool._standbys
    skipped = [fields for name, fields in auto_pool.events if name == "standby_skipped"]
    assert len(skipped) == 1 and skipped[0]["ranks"] == [0] and skipped[0]["need_bytes"] > 1 << 20


def test_auto_first_standbys_wait_until_the_job_ran_twice_its_start_up(auto_pool, monkeypatch):
    """A job that ends within twice its start-up (until the ranks' newest import) never gets standbys
    whose imports would load the CPUs while it ends (docs/fidelity.md); once the job ran that long,
    they start."""
    clock = [100.0]
    monkeypatch.setattr(standby_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(standbyauto, "WARM_AFTER", 2.0)
    auto_pool._idle = False  # standbys as SCHED_BATCH: they would compete with the ranks
    auto_pool.after_start([auto_pool.spec], 0)

    def read_at(second, name=None):
        clock[0] = 100.0 + second
        if name:
            with open(auto_pool.record, "a") as fh:
                fh.write(name + "\n")
        _tick(auto_pool)

    for second, name in ((1, "fakeheavy"), (2, None), (3, "not_installed"), (4, None), (5, None)):
        read_at(second, name)
    assert auto_pool.startup == 3.0 and not auto_pool._standbys  # two quiet reads, but 5 s < 2 x 3 s
    for second, name in ((6, "fakeheavy.lazy"), (7, None), (8, None), (11, None)):  # a lazy import: 2 x 6 s
        read_at(second, name)
    assert auto_pool.startup == 6.0 and not auto_pool._standbys and not auto_pool.events
    read_at(12)
    assert auto_pool.modules == ("fakeheavy", "not_installed", "fakeheavy.lazy") and list(auto_pool._standbys) == [0]
    assert auto_pool.events == [("standby_timing", {"startup_seconds": 6.0, "started_after_seconds": 12.0,
                                                    "idle_class": False})]


def test_auto_standbys_of_the_idle_class_need_not_wait(auto_pool, monkeypatch):
    """SCHED_IDLE standbys take only CPU time the ranks leave: they start once the imports paused."""
    clock = [100.0]
    monkeypatch.setattr(standby_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(standbyauto, "WARM_AFTER", 2.0)
    auto_pool.after_start([auto_pool.spec], 0)
    auto_pool.record.write_text("fakeheavy\n")
    for second in (3, 4, 5):
        clock[0] = 100.0 + second
        _tick(auto_pool)
    assert auto_pool._idle == (_policy_in_standby()[0] == os.SCHED_IDLE)  # the standby's own rule
    assert bool(auto_pool._standbys) == auto_pool._idle  # 5 s < 2 x 3 s: only idle-class ones start


def _policy_in_standby(prefix=()):
    """In a fresh interpreter: the policy a standby waits with, and whether it can go back to SCHED_OTHER."""
    code = ("import os, launcher_standby as s\nborn = s._background()\nwaiting = os.sched_getscheduler(0)\n"
            "os.sched_setscheduler(0, born, os.sched_param(0))\nprint(waiting, os.sched_getscheduler(0))")
    hooks = os.path.dirname(standby_mod.BOOTSTRAP)
    out = subprocess.run([*prefix, sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": hooks},
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def test_a_standby_waits_as_sched_idle_only_where_it_can_leave_it():
    """SCHED_IDLE takes only CPU the ranks leave, but leaving it needs CAP_SYS_NICE (or RLIMIT_NICE):
    without, SCHED_BATCH, which any process may leave. Either way the rank runs as SCHED_OTHER."""
    with open("/proc/self/status") as fh:
        privileged = int(next(line.split()[1] for line in fh if line.startswith("CapEff:")), 16) >> 23 & 1
    assert _policy_in_standby() == [os.SCHED_IDLE if privileged else os.SCHED_BATCH, os.SCHED_OTHER]
    if not privileged or not shutil.which("setpriv"):
        pytest.skip("cannot drop CAP_SYS_NICE here")
    assert _policy_in_standby(("setpriv", "--bounding-set=-sys_nice")) == [os.SCHED_BATCH, os.SCHED_OTHER]


def test_the_launcher_takes_a_standby_out_of_sched_idle_before_waking_it():
    """A woken SCHED_IDLE task runs only on an idle CPU: the hand-over would wait for a busy machine."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        try:
            os.sched_setscheduler(sleeper.pid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(sleeper.pid, os.SCHED_OTHER, os.sched_param(0))
        except PermissionError:
            pytest.skip("no CAP_SYS_NICE here: a standby never waits as SCHED_IDLE")
        standby_mod._out_of_idle(sleeper.pid)
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER  # only SCHED_IDLE is changed
        os.sched_setscheduler(sleeper.pid, os.SCHED_IDLE, os.sched_param(0))
        standby_mod._out_of_idle(sleeper.pid)
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_BATCH
    finally:
        sleeper.kill()
        sleeper.wait()
