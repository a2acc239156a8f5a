"""Restart generations through a shared directory (``launcher.cluster.sync``), with a tmp dir and no processes.

Two or three :class:`Coordinator` objects on one tmp dir play the nodes of a job; the event loop is a
fake (``call_later`` records callbacks, the test runs them) and so is the clock (``wait`` advances it).
"""

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Callable, List, Optional

import pytest

from launcher.commands.cli import main
from launcher.common.errors import LauncherError, UsageError
from launcher.jobspec.options import check_sync_options as check_options
from launcher.supervision.policy import Agreement, Failure, NoSync, PeerUpdate, RunResult
from launcher.supervision.states import ExitInfo
from launcher.cluster.sync import Coordinator, Elastic
from launcher.cluster.syncmaster import MasterMove
from launcher.cluster.syncdir import SyncDir

NAMES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


class FakeLoop:
    """``call_later`` / ``cancel`` / ``post`` of the event loop, driven by hand."""

    def __init__(self):
        self.timers = {}
        self.delays: List[float] = []
        self.posted: list = []
        self._next = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> int:
        self._next += 1
        self.timers[self._next] = callback
        self.delays.append(delay)
        return self._next

    def cancel(self, handle: int) -> None:
        self.timers.pop(handle, None)

    def run_due(self) -> None:
        """Run every pending timer once (one poll)."""
        for handle in list(self.timers):
            self.timers.pop(handle)()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Node:
    """One launcher's side of the protocol."""

    def __init__(self, base, index: int, count: int = 2, timeout: float = 10.0, run_id: str = "job",
                 files: Optional[SyncDir] = None):
        self.loop, self.clock, self.events = FakeLoop(), Clock(), []
        self.files = files or SyncDir.join(str(base), run_id, index, NAMES[:count])
        self.sync = Coordinator(self.files, timeout, lambda name, **kw: self.events.append((name, kw)),
                                self.loop.call_later, self.loop.cancel, self.loop.posted.append, clock=self.clock)

    def waiter(self, on_wait: Optional[Callable[[int], Optional[bool]]] = None):
        """A ``wait(seconds)`` that advances the clock and calls ``on_wait(call_number)`` first."""
        calls = []

        def wait(seconds: float) -> bool:
            calls.append(seconds)
            result = on_wait(len(calls)) if on_wait else None
            self.clock.now += seconds
            return True if result is None else result
        wait.calls = calls
        return wait

    def names(self) -> List[str]:
        return [name for name, _ in self.events]


def failure(rank: int, code: int = 1, at: float = 1000.0) -> Failure:
    return Failure(0, rank, f"rank {rank}", ExitInfo(code, at))


def succeeded() -> RunResult:
    return RunResult(0, "succeeded", 1)


def gen_files(node: Node, generation: int = 0) -> List[str]:
    return sorted(os.listdir(node.files.gen_path(generation)))


# -- during a generation: another node's failure ----------------------------------------------------
def test_watcher_polls_from_the_event_loop_until_another_node_fails(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    a.sync.attempt_started(0)
    a.loop.run_due()
    a.loop.run_due()
    assert a.loop.delays == [0.0, 0.5, 0.5] and not a.loop.posted  # first look at once, then every 0.5 s
    a.sync.rank_failed(0, [1], failure(1))  # its own failure is not news
    a.loop.run_due()
    assert not a.loop.posted
    b.sync.rank_failed(0, [3], failure(3, -9))
    a.loop.run_due()
    [update] = a.loop.posted
    assert isinstance(update, PeerUpdate) and update.generation == 0
    assert (update.failure.rank, update.failure.info.exit_code) == (3, 137)
    assert update.reason == "rank 3 on server 1 (10.0.0.2) failed (killed by SIGKILL)"
    assert not a.loop.timers  # one report per generation
    assert ("sync_peer_failure", {"generation": 0, "rank": 3, "label": "rank 3 on server 1 (10.0.0.2)",
                                  "exit_code": 137, "reason": update.reason}) in a.events


def test_a_store_that_tells_of_changes_is_looked_at_once_and_polled_only_as_a_fallback(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    a.sync = Coordinator(a.files, 10.0, lambda name, **kw: a.events.append((name, kw)), a.loop.call_later,
                         a.loop.cancel, a.loop.posted.append, interval=0.05, poll_interval=0.5)
    a.sync.changed()  # no generation runs: nothing to look at
    assert not a.loop.timers and not a.loop.posted
    a.sync.attempt_started(0)
    a.loop.run_due()
    assert a.loop.delays == [0.0, 0.5] and not a.loop.posted  # the fallback poll: 0.5 s, not 0.05
    b.sync.rank_failed(0, [3], failure(3))
    a.sync.changed()  # the store's cue: at once, the pending poll cancelled
    [update] = a.loop.posted
    assert update.failure.rank == 3 and not a.loop.timers


def test_an_etcd_stores_changes_reach_the_loop_once_per_look():
    from launcher.cluster.syncjoin import _Waker

    handed, looks = [], []
    waker = _Waker(handed.append, lambda: looks.append(1))
    waker()
    waker()  # the leader's watch: one change per node, before the loop runs
    assert len(handed) == 1 and not looks
    handed.pop()()
    assert looks == [1]
    waker()  # a change after the look: handed again
    assert len(handed) == 1


def test_watcher_reports_an_abort_and_looks_only_at_its_generation(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    b.sync.rank_failed(0, [3], failure(3))  # generation 0 is over for a
    a.sync.attempt_started(1)
    a.loop.run_due()
    assert not a.loop.posted
    b.files.write(1, "abort", {"exit_code": 1, "reason": "gasp"}, exclusive=True)
    a.loop.run_due()
    [update] = a.loop.posted
    assert update.generation == 1 and update.failure.rank == -1
    assert update.reason == "server 1 (10.0.0.2) ended the job (gasp)"


def test_watcher_says_a_node_is_joining_not_that_it_failed(tmp_path):
    """EtcdStore's join of a running job writes failed.<i>.json with rank -1 and note "joining"."""
    a, late = Node(tmp_path, 0, count=3), Node(tmp_path, 2, count=3)
    a.sync.attempt_started(0)
    late.files.write(0, "failed.2.json", {"rank": -1, "ranks": [], "note": "joining", "returncode": 1})
    a.loop.run_due()
    [update] = a.loop.posted
    assert update.reason == "server 2 (10.0.0.3) joining"
    assert not update.membership  # server 2 is a member: its earlier launcher was lost, a failure


JOIN_NOTE = {"rank": -1, "ranks": [], "note": "joining", "returncode": 1}


def test_watcher_says_a_new_member_joining_is_a_membership_change(tmp_path):
    a, late = Node(tmp_path, 0, count=3), Node(tmp_path, 2, count=3)
    a.sync.members = (0, 1)  # generation 0 runs without server 2
    a.sync.attempt_started(0)
    late.files.write(0, "failed.2.json", JOIN_NOTE)
    a.loop.run_due()
    [update] = a.loop.posted
    assert update.membership and update.reason == "server 2 (10.0.0.3) joining"


def test_watcher_prefers_a_real_failure_to_a_join(tmp_path):
    a, b, late = Node(tmp_path, 0, count=3), Node(tmp_path, 1, count=3), Node(tmp_path, 2, count=3)
    a.sync.members = (0, 1)
    a.sync.attempt_started(0)
    late.files.write(0, "failed.2.json", JOIN_NOTE)
    b.sync.rank_failed(0, [3], failure(3))
    a.loop.run_due()
    [update] = a.loop.posted
    assert not update.membership and update.failure.rank == 3


def test_settle_stops_watching(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    a.sync.attempt_started(0)
    b.sync.settle(0, None, None, [], b.waiter(lambda n: False))
    a.sync.settle(0, None, None, [], a.waiter())
    assert not a.loop.timers


# -- the barrier ------------------------------------------------------------------------------------
def test_barrier_waits_for_every_node_then_both_restart_with_the_union(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    b.sync.rank_failed(0, [3], failure(3, -9))
    a.sync.rank_failed(0, [0], failure(0))  # its rank failed too before a saw b's file
    agreed_b: List[Agreement] = []
    # a stops first and waits; during its second wait b arrives (and finds a already there).
    wait_a = a.waiter(lambda n: agreed_b.append(b.sync.settle(0, None, failure(3), [3], b.waiter()))
                      if n == 2 else None)
    agreed_a = a.sync.settle(0, None, failure(0), [0], wait_a)
    assert agreed_a == agreed_b[0] == Agreement((0, 3))
    assert wait_a.calls == [0.5, 0.5]
    assert gen_files(a) == ["failed.0.json", "failed.1.json", "stopped.0", "stopped.1"]
    names = a.names()
    assert names.index("sync_stopped") < names.index("sync_wait") < names.index("sync_barrier")
    [barrier] = [kw for name, kw in a.events if name == "sync_barrier"]
    assert barrier == {"generation": 0, "waited": 1.0, "failed_ranks": [0, 3], "failed_servers": [0, 1],
                       "membership_change": False}


def test_a_wait_for_many_servers_names_the_first_eight_and_counts_the_others(tmp_path):
    names = [f"10.0.1.{i}" for i in range(20)]
    a = Node(tmp_path, 0, timeout=1.0, files=SyncDir.join(str(tmp_path), "job", 0, names))
    a.sync.settle(0, None, failure(0), [0], a.waiter())
    [wait] = [kw for name, kw in a.events if name == "sync_wait"]
    assert wait["servers"] == [f"server {i} (10.0.1.{i})" for i in range(1, 9)] + ["and 11 more"]
    [timeout] = [kw for name, kw in a.events if name == "sync_timeout"]
    assert timeout["missing"] == list(range(1, 20))  # the verdict names every one


def test_barrier_times_out_naming_the_missing_nodes(tmp_path, caplog):
    a, b, c = (Node(tmp_path, i, count=3, timeout=2.0) for i in range(3))
    c.files.write(0, "stopped.2", {})
    agreed = a.sync.settle(0, None, failure(1), [1], a.waiter())
    assert agreed == Agreement(exit_code=1, reason="sync-timeout")
    assert "server 1 (10.0.0.2) did not report generation 0 as stopped within 2 s" in caplog.text
    assert ("sync_timeout", {"generation": 0, "waiting_for": "stopped", "missing": [1], "timeout": 2.0}) in a.events
    abort = a.files.read(0).abort
    assert abort["exit_code"] == 1 and "server 1 (10.0.0.2) missing" in abort["reason"]
    # The late node learns at once that the job is over.
    assert b.sync.settle(0, None, None, [], b.waiter()) == Agreement(exit_code=1, reason="failed")


def test_barrier_ends_when_a_node_aborts(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    b.sync.rank_failed(0, [3], failure(3, 9))
    wait = a.waiter(lambda n: b.sync.settle(0, RunResult(9, "failed", 1), failure(3, 9), [3], b.waiter()) and None)
    # a had budget left; b had not: a ends with b's code (it has no failure of its own ...)
    assert a.sync.settle(0, None, None, [], wait) == Agreement(exit_code=9, reason="failed")
    # ... or with its own when it has one.
    again = Node(tmp_path, 0, files=a.files)
    assert again.sync.settle(0, None, failure(0, 4), [0], again.waiter()).exit_code == 4


def test_barrier_with_a_finished_node_cannot_restart(tmp_path, caplog):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    b.files.write(0, "done.1", {})
    assert a.sync.settle(0, None, failure(0, 6), [0], a.waiter()) == Agreement(exit_code=6, reason="failed")
    assert "server 1 (10.0.0.2) finished generation 0 and starts nothing more" in caplog.text
    assert a.files.read(0).abort["exit_code"] == 6


def test_a_stop_signal_during_the_barrier_ends_the_wait(tmp_path):
    a = Node(tmp_path, 0)
    assert a.sync.settle(0, None, None, [], a.waiter(lambda n: False)) == Agreement()


# -- a lost node (a store with membership: etcd's leases) --------------------------------------------
class LeasedDir(SyncDir):
    """A fake store with membership: the shared directory, plus servers the test declares lost (this
    one only when ``expelled``: its lease expired while the store kept its records)."""

    lost = frozenset()
    expelled = False

    def read(self, generation):
        state = super().read(generation)
        own = set() if self.expelled else {self.index}
        return dataclasses.replace(state, lost=frozenset(self.lost) - state.done - own)


def leased(tmp_path, index: int, count: int = 2, timeout: float = 10.0) -> Node:
    return Node(tmp_path, index, count, timeout, files=LeasedDir.join(str(tmp_path), "job", index, NAMES[:count]))


def test_watcher_reports_a_lost_node(tmp_path):
    a = leased(tmp_path, 0)
    a.sync.attempt_started(0)
    a.loop.run_due()
    assert not a.loop.posted
    a.files.lost = {1}
    a.loop.run_due()
    [update] = a.loop.posted
    assert update.failure.rank == -1 and update.failure.label == "server 1 (10.0.0.2)"
    assert update.reason == "server 1 (10.0.0.2) lost (its launcher's lease expired)"


def test_barrier_does_not_wait_for_a_lost_node_and_ends_the_job(tmp_path, caplog):
    a, c = leased(tmp_path, 0, count=3, timeout=60.0), leased(tmp_path, 2, count=3)
    c.files.write(0, "stopped.2", {})
    a.files.lost = {1}
    wait = a.waiter()
    assert a.sync.settle(0, None, failure(0, 5), [0], wait) == Agreement(exit_code=5, reason="failed")
    assert not wait.calls  # no wait: the lost node will never report
    assert ("sync_lost", {"generation": 0, "servers": [1]}) in a.events
    assert "server 1 (10.0.0.2) lost in generation 0" in caplog.text
    assert a.files.read(0).abort["reason"] == "server 1 (10.0.0.2) lost"


def test_a_finished_node_fails_when_another_is_lost(tmp_path):
    a = leased(tmp_path, 0)
    a.files.lost = {1}
    assert a.sync.settle(0, succeeded(), None, [], a.waiter()) == Agreement(exit_code=1, reason="failed")


def test_a_node_that_finished_is_not_lost(tmp_path):
    a, b = leased(tmp_path, 0), leased(tmp_path, 1)
    b.files.write(0, "done.1", {})
    a.files.lost = {1}  # its launcher left after its ranks finished
    assert a.sync.settle(0, succeeded(), None, [], a.waiter()) == Agreement()


# -- elastic membership -----------------------------------------------------------------------------
def elastic(tmp_path, index: int, min_nodes: int = 2, wait: float = 5.0) -> Node:
    node = leased(tmp_path, index, count=3)
    node.sync.elastic = Elastic(min_nodes, wait)
    return node


def test_elastic_goes_on_without_a_lost_node_once_the_wait_is_over(tmp_path):
    a, c = elastic(tmp_path, 0), elastic(tmp_path, 2)
    c.files.write(0, "stopped.2", {})
    a.files.lost = c.files.lost = {1}
    wait = a.waiter()
    assert a.sync.settle(0, None, failure(-1), [], wait) == Agreement(())
    assert sum(wait.calls) == pytest.approx(5.0)  # the replacement wait, then next.json is there at once
    assert a.sync.members == (0, 2)
    assert ("sync_membership", {"generation": 1, "servers": [0, 2], "previous": [0, 1, 2]}) in a.events
    assert ("sync_lost", {"generation": 0, "servers": [1], "wait": 5.0}) in a.events
    assert c.sync.settle(0, None, failure(-1), [], c.waiter()) == Agreement(())
    assert c.sync.members == (0, 2)  # the proposal in the store, not its own view
    assert a.files.read(0).next["servers"] == [0, 2]


def test_elastic_below_min_ends_the_job(tmp_path, caplog):
    a = elastic(tmp_path, 0, min_nodes=3, wait=1.0)
    elastic(tmp_path, 2).files.write(0, "stopped.2", {})
    a.files.lost = {1}
    assert a.sync.settle(0, None, failure(-1, 3), [], a.waiter()) == Agreement(exit_code=3, reason="failed")
    assert "--nnodes needs at least 3" in caplog.text
    assert [kw for name, kw in a.events if name == "sync_lost"] == [{"generation": 0, "servers": [1], "wait": 1.0}]
    assert a.files.read(0).abort["reason"] == "server 1 (10.0.0.2) lost"


def test_elastic_a_replacement_within_the_wait_keeps_the_membership(tmp_path):
    a, b = elastic(tmp_path, 0), elastic(tmp_path, 1)
    elastic(tmp_path, 2).files.write(0, "stopped.2", {})
    a.files.lost = {1}

    def replaced(call):  # a launcher takes server 1's place: it is alive again, and stopped
        a.files.lost = set()
        b.files.write(0, "stopped.1", {})
    assert a.sync.settle(0, None, failure(-1), [], a.waiter(lambda n: replaced(n) if n == 1 else None)) == Agreement(())
    assert a.sync.members == (0, 1, 2) and a.files.read(0).next is None


def test_elastic_a_node_left_out_of_the_next_generation_ends(tmp_path, caplog):
    a, b = elastic(tmp_path, 0), elastic(tmp_path, 1)
    elastic(tmp_path, 2).files.write(0, "stopped.2", {})
    a.files.write(0, "stopped.0", {})
    b.files.lost = {2}  # b's view: 2 lost; but a's proposal came first
    a.files.write(0, "next.json", {"servers": [0, 2]}, exclusive=True)
    assert b.sync.settle(0, None, failure(-1, 9), [], b.waiter()).exit_code == 9
    assert "the other nodes go on without this one" in caplog.text


def test_elastic_a_node_that_is_itself_lost_ends_without_waiting_for_a_replacement(tmp_path, caplog):
    """Its lease expired while etcd kept the records: the others go on without it, and it must not
    wait to be its own replacement and re-enter. It ends at once, proposing nothing."""
    a, b = elastic(tmp_path, 0), elastic(tmp_path, 1)
    elastic(tmp_path, 2).files.write(0, "stopped.2", {})
    b.files.write(0, "stopped.1", {})
    a.files.expelled, a.files.lost = True, {0}
    wait = a.waiter()
    assert a.sync.settle(0, None, failure(-1), [], wait) == Agreement(exit_code=1, reason="failed")
    assert not wait.calls and a.files.read(0).next is None
    assert "server 0 (10.0.0.1) lost in generation 0" in caplog.text


def master_moves(tmp_path, index: int, check=lambda address, port: (31000, "port 29400 is in use")) -> Node:
    """An elastic node whose master moves to server 1 (10.0.0.2) whenever server 0 is not kept."""
    node = elastic(tmp_path, index)
    node.sync.master = MasterMove(lambda servers: None if 0 in servers else (min(servers), NAMES[min(servers)]),
                                  29400, check)
    return node


def test_elastic_the_new_master_publishes_its_endpoint_and_every_node_uses_it(tmp_path):
    """Server 0 lost: server 1 hosts rank 0 and the master; its launcher checks the port on its host
    and writes gen_0/master.json; server 2 waits for it at the barrier and takes the same endpoint."""
    b, c = master_moves(tmp_path, 1), master_moves(tmp_path, 2, check=None)  # only the new host checks
    b.files.lost = c.files.lost = {0}
    b.files.write(0, "stopped.1", {})
    settled = []

    def b_settles_once_c_waits_for_the_master(call):
        if c.events[-1][1].get("waiting_for") == "the new master's endpoint" and not settled:
            settled.append(b.sync.settle(0, None, failure(-1), [], b.waiter()))
    assert c.sync.settle(0, None, failure(-1), [], c.waiter(b_settles_once_c_waits_for_the_master)) == Agreement(())
    assert settled == [Agreement(())]
    for node in (b, c):
        assert node.sync.endpoint == ("10.0.0.2", 31000)
        assert [kw for name, kw in node.events if name == "master_moved"] == [
            {"generation": 1, "server": 1, "addr": "10.0.0.2", "port": 31000, "requested_port": 29400,
             "reason": "port 29400 is in use"}]
    assert ("sync_wait", {"generation": 0, "waiting_for": "the new master's endpoint", "servers":
            ["the new master's endpoint"], "timeout": 10.0}) in c.events


def test_elastic_a_start_without_the_masters_server_agrees_on_the_endpoint_before_generation_0(tmp_path):
    """Generation 0 starts on servers 1 and 2 (MIN): the record is written before it, as generation -1's."""
    b, c = master_moves(tmp_path, 1), master_moves(tmp_path, 2, check=None)
    b.sync.members = c.sync.members = (1, 2)  # gen_0/start.json agreed
    assert b.sync.move_master(-1, 1, b.waiter()) is None
    assert c.sync.move_master(-1, 1, c.waiter()) is None
    assert b.sync.endpoint == c.sync.endpoint == ("10.0.0.2", 31000)
    assert [kw["generation"] for name, kw in c.events if name == "master_moved"] == [0]


def test_elastic_a_master_that_stays_publishes_nothing(tmp_path):
    a, c = master_moves(tmp_path, 0), master_moves(tmp_path, 2)
    c.files.write(0, "stopped.2", {})
    a.files.lost = {1}
    assert a.sync.settle(0, None, failure(-1), [], a.waiter()) == Agreement(())
    assert a.sync.endpoint is None and a.files.read(0).master is None


def test_elastic_the_new_masters_host_never_publishes(tmp_path, caplog):
    c = master_moves(tmp_path, 2, check=None)
    c.files.write(0, "stopped.2", {})
    master_moves(tmp_path, 1).files.write(0, "stopped.1", {})
    c.files.lost = {0}
    assert c.sync.settle(0, None, failure(-1), [], c.waiter()) == Agreement(exit_code=1, reason="sync-timeout")
    assert "server 1 (10.0.0.2) did not report generation 0 as master within 10 s" in caplog.text


def test_a_launcher_joining_a_running_job_passes_the_barrier_of_its_generation(tmp_path):
    a, b, late = elastic(tmp_path, 0), elastic(tmp_path, 1), elastic(tmp_path, 2)
    a.files.write(0, "next.json", {"servers": [0, 1]}, exclusive=True)  # generation 1 ran on 0, 1
    late.files.write(1, "stopped.2", {})  # what EtcdStore's join writes
    late.files.write(1, "failed.2.json", JOIN_NOTE)
    a.sync.members = b.sync.members = (0, 1)
    b.files.write(1, "stopped.1", {})
    a.files.write(1, "stopped.0", {})
    # Nobody failed, nobody was lost: a membership change, for every node (the restart is not counted)
    assert late.sync.join_running(1, late.waiter()) == Agreement((), membership=True)
    assert late.sync.members == (0, 1, 2)
    assert a.sync.settle(1, None, failure(-1), [], a.waiter()) == Agreement((), membership=True)
    assert a.sync.members == (0, 1, 2)
    [barrier] = [kw for name, kw in a.events if name == "sync_barrier"]
    assert barrier["membership_change"] is True


def test_a_join_in_a_generation_where_a_rank_failed_is_no_membership_change(tmp_path):
    a, b, late = elastic(tmp_path, 0), elastic(tmp_path, 1), elastic(tmp_path, 2)
    a.sync.members = b.sync.members = (0, 1)
    late.files.write(0, "stopped.2", {})
    late.files.write(0, "failed.2.json", JOIN_NOTE)
    b.sync.rank_failed(0, [3], failure(3))
    b.files.write(0, "stopped.1", {})
    assert a.sync.settle(0, None, failure(3), [], a.waiter()) == Agreement((3,))


def test_a_lost_members_replacement_is_no_membership_change(tmp_path):
    """Server 1's launcher was lost and a new one took its place: the loss is a failure."""
    a, b, c = elastic(tmp_path, 0), elastic(tmp_path, 1), elastic(tmp_path, 2)
    c.files.write(0, "stopped.2", {})
    b.files.write(0, "stopped.1", {})
    b.files.write(0, "failed.1.json", JOIN_NOTE)
    assert a.sync.settle(0, None, failure(-1), [], a.waiter()) == Agreement(())


# -- success and failure ----------------------------------------------------------------------------
def test_success_needs_every_node_done(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    wait = a.waiter(lambda n: b.sync.settle(0, succeeded(), None, [], b.waiter()) and None)
    assert a.sync.settle(0, succeeded(), None, [], wait) == Agreement()
    assert gen_files(a) == ["done.0", "done.1"]
    assert "sync_all_done" in a.names() and "sync_all_done" in b.names()


def test_a_finished_node_exits_with_the_failure_of_another(tmp_path, caplog):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    b.sync.rank_failed(0, [3], failure(3, -6))
    assert a.sync.settle(0, succeeded(), None, [], a.waiter()) == Agreement(exit_code=134, reason="failed")
    assert "job failed on another node" in caplog.text and "rank 3 on server 1" in caplog.text


def test_a_finished_node_gives_up_waiting_for_the_others(tmp_path):
    a = Node(tmp_path, 0, timeout=1.0)
    assert a.sync.settle(0, succeeded(), None, [], a.waiter()) == Agreement(exit_code=1, reason="sync-timeout")


def test_a_spent_budget_aborts_for_everyone(tmp_path):
    a = Node(tmp_path, 0)
    agreed = a.sync.settle(2, RunResult(7, "failed", 3), failure(1, 7), [1], a.waiter())
    assert agreed == Agreement((1,))  # this node's own verdict stands
    assert a.files.read(2).abort == {**a.files.read(2).abort, "exit_code": 7, "reason": "failed", "server": 0}
    assert ("sync_abort", {"generation": 2, "exit_code": 7, "reason": "failed"}) in a.events


@pytest.mark.parametrize("result,marker,code", [(RunResult(0, "graceful-exit", 1), "done.0", None),
                                                (RunResult(143, "gasp", 1), "abort", 1),
                                                (RunResult(5, "failed", 1), "abort", 5)])
def test_leaving_tells_the_others_and_closes_the_incarnation(tmp_path, result, marker, code):
    a = Node(tmp_path, 0)
    a.sync.leave(1, result)
    assert marker in gen_files(a, 1)
    assert os.path.exists(os.path.join(a.files.path, "closed"))
    if code is not None:
        assert a.files.read(1).abort["exit_code"] == code


def test_leaving_quietly_after_an_error_when_the_directory_is_gone(tmp_path):
    """On the way out of an error a record that cannot be written is not another error; without
    ``quiet`` it is. (A directory made read-only would not do: the suite runs as root in CI, so the
    directory is replaced by a file.)"""
    a = Node(tmp_path, 0)
    shutil.rmtree(a.files.path)
    Path(a.files.path).write_text("not a directory")
    a.sync.leave(0, RunResult(1, "launcher-error", 0), quiet=True)
    b = Node(tmp_path / "other", 0)
    shutil.rmtree(b.files.path)
    Path(b.files.path).write_text("not a directory")
    with pytest.raises(LauncherError):
        b.sync.leave(0, RunResult(1, "launcher-error", 0))


def test_no_sync_keeps_the_local_view():
    sync = NoSync()
    assert sync.settle(0, None, None, [2], lambda s: True) == Agreement((2,))
    assert sync.settle(0, succeeded(), None, [], lambda s: True) == Agreement(())


# -- options ----------------------------------------------------------------------------------------
def test_check_options():
    check_options("job", chosen=True, server_count=2)
    check_options("a1b2c3", chosen=False, server_count=1)
    with pytest.raises(UsageError, match="same run id") as info:
        check_options("a1b2c3", chosen=False, server_count=2)
    assert info.value.exit_code == 2 and "--run-id" in info.value.problems[0]
    with pytest.raises(UsageError):
        check_options("a/b", chosen=True, server_count=2)


def test_run_refuses_a_generated_run_id_with_several_nodes(clean_env, restore_launcher_logger, tmp_path, capsys):
    argv = ["run", "--run-dir", str(tmp_path / "run"), "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
            "--sync-dir", str(tmp_path / "sync"), "--", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--sync-dir with several servers needs the same run id" in err and "pass --run-id" in err
    assert not (tmp_path / "sync").exists()


def test_sync_options_from_the_environment_and_the_config_file(clean_env, restore_launcher_logger, tmp_path,
                                                                 capsys, monkeypatch):
    from launcher.jobspec.options import load_config

    config = tmp_path / "launcher.yaml"
    config.write_text("sync-dir: /shared/sync\nsync_timeout: 30\n")
    assert load_config(str(config)) == {"sync_dir": "/shared/sync", "sync_timeout": 30}
    config.write_text("sync_timeout: -1\n")
    with pytest.raises(UsageError, match="invalid"):
        load_config(str(config))
    monkeypatch.setenv("LAUNCHER_SYNC_DIR", str(tmp_path / "sync"))  # refused like the option
    assert main(["run", "--run-dir", str(tmp_path / "run"), "--nnodes", "2", "--nproc-per-node", "1", "--", "true"]) == 2
    assert "needs the same run id" in capsys.readouterr().err
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--sync-dir" in out and "LAUNCHER_SYNC_TIMEOUT" in out


@pytest.mark.parametrize("options, line", [
    (["--coordinator", "etcd://127.0.0.1:2379", "--sync-dir", "/x"], "--sync-dir and --coordinator: choose one"),
    (["--coordinator", "etcd://127.0.0.1:2379"], "--coordinator with several servers needs the same run id"),
    (["--run-id", "j", "--coordinator", "etcd://h:99999"], "bad endpoint 'h:99999'"),
    (["--run-id", "j", "--nnodes", "1:2"], "--nnodes 1:2 (elastic) needs --coordinator"),
])
def test_coordinator_options_refused_before_anything_starts(clean_env, restore_launcher_logger, tmp_path, capsys,
                                                           options, line):
    argv = ["run", "--run-dir", str(tmp_path / "run"), "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
            *options, "--dry-run", "--", "true"]
    assert main(argv) == 2
    assert line in capsys.readouterr().err


def test_coordinator_options_from_the_config_file_and_the_help(clean_env, restore_launcher_logger, tmp_path, capsys):
    from launcher.jobspec.options import load_config, parse_coordinator

    config = tmp_path / "launcher.yaml"
    config.write_text("coordinator: etcd://10.0.0.9:2379\ncoordinator-ttl: 3\nnnodes: '2:4'\nelastic_wait: 5\n")
    assert load_config(str(config)) == {"coordinator": "etcd://10.0.0.9:2379", "coordinator_ttl": 3,
                                        "nnodes": "2:4", "elastic_wait": 5}
    assert parse_coordinator("etcd://a:1,b") == [("a", 1), ("b", 2379)]
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "LAUNCHER_COORDINATOR" in out and "--elastic-wait" in out and "MIN:MAX" in out
