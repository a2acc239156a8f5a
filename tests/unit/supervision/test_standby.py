"""Unit tests for ``launcher.supervision.standby.StandbyPool`` with a scripted event loop: when a standby
may take a rank (ready, same command, same start-time variables) and what happens to one that may not."""

import os
import select
import sys

import pytest

from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.jobtree import JobTree
from launcher.supervision.standby import StandbyPool
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
