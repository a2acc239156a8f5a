"""Coordinated restarts of one job's launchers: the protocol, over a store of records.

Restart generations (docs/multinode.md): generation ``g`` is the attempt number, the same on every
node. :class:`Coordinator` runs the protocol behind the supervisor's hooks over a :class:`~launcher.cluster.syncstore.Store`:
the files of :mod:`launcher.cluster.syncdir` (``--sync-dir``) or the keys of
:mod:`launcher.cluster.etcdstore` (``--coordinator etcd://``, which adds leased membership: a node
whose launcher dies is *lost*). :mod:`launcher.cluster.syncjoin` joins one for ``launcher run``.
"""

import dataclasses
import logging
import time
from typing import Callable, List, Optional, Sequence, Set, Tuple

from launcher.cluster.syncdir import ABORT, DONE, JOIN_NOTE, STOPPED, Generation, failure_of
from launcher.cluster.syncelastic import Elastic, ElasticMembership
from launcher.cluster.syncmaster import MasterMove
from launcher.cluster.syncstore import Store
from launcher.common.errors import LauncherError
from launcher.supervision.policy import Agreement, Failure, NoSync, PeerUpdate, RunResult, Wait

log = logging.getLogger(__name__)

#: Seconds between two looks at the shared directory (peer failures, the barrier).
POLL_INTERVAL = 0.5
#: Servers a wait names (events, log) before it says how many more.
NAMED = 8

Emit = Callable[..., object]


class Coordinator(ElasticMembership, NoSync):
    """The restart-generation protocol behind the supervisor's hooks.

    Args:
        files: This incarnation's records.
        timeout: ``--sync-timeout``: longest wait for the other nodes at a barrier.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        call_later, cancel, post: The event loop's timers and event queue (``LocalProcessGroup``).
        interval: Seconds between two looks at the store.
        poll_interval: Seconds between two looks while a generation runs (default ``interval``): a
            store that tells of its changes (:meth:`changed`) needs them only as a fallback.
        clock: Monotonic clock (tests pass a fake one).
        elastic: Elastic membership, or None: a lost server ends the job.
        master: Where the master goes when it moves with rank 0 (elastic), or None.

    Attributes:
        members: The servers of the current generation (all of the table's unless elastic).
        endpoint: The master's address and port while it is away from the job's master server, as
            its new host published them (None: the job's own).
    """

    def __init__(self, files: Store, timeout: float, emit: Emit, call_later: Callable[[float, Callable], int],
                 cancel: Callable[[int], None], post: Callable[[object], None], interval: float = POLL_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, elastic: Optional[Elastic] = None,
                 master: Optional[MasterMove] = None, poll_interval: Optional[float] = None):
        self.files, self.timeout, self.emit, self.interval, self.clock = files, timeout, emit, interval, clock
        self.poll_interval = interval if poll_interval is None else poll_interval
        self.elastic, self.master = elastic, master
        self.members = tuple(range(files.count))
        self.endpoint: Optional[Tuple[str, int]] = None
        self._call_later, self._cancel, self._post = call_later, cancel, post
        self._timer: Optional[int] = None
        self._generation = 0
        self._written: Set[Tuple[int, str]] = set()
        self._read_error: Optional[str] = None
        self._polled: Optional[Generation] = None  # the state the last look found nothing in

    @property
    def members(self) -> Tuple[int, ...]:
        """The servers of the current generation (with their set: a barrier of 1,000 servers asks it
        on every look, and building it each time was most of a node's work there)."""
        return self._members

    @members.setter
    def members(self, servers: Tuple[int, ...]) -> None:
        self._members, self._member_set = tuple(servers), frozenset(servers)

    # -- while a generation runs --------------------------------------------------------------------
    def attempt_started(self, generation: int) -> None:
        """Watch ``gen_<g>/`` for other nodes' failures and for ``abort`` (first look at once)."""
        self._unwatch()
        self._generation, self._polled = generation, None
        if self.elastic is not None:  # tells a launcher that joins later which generation runs
            self.files.write(generation, f"running.{self.files.index}", {})
        self._timer = self._call_later(0.0, self._poll)

    def _unwatch(self) -> None:
        if self._timer is not None:
            self._cancel(self._timer)
            self._timer = None

    def changed(self) -> None:
        """The store's records changed (called on the event loop): while a generation runs, look now
        instead of at the next poll."""
        if self._timer is not None:
            self._cancel(self._timer)
            self._poll()

    def _poll(self) -> None:
        self._timer = None
        state = self._read(self._generation)
        # A store that kept its snapshot (etcd's, cached per version) hands back the same object: nothing new.
        update = None if state is self._polled else self._peer_update(state)
        self._polled = state
        if update is None:
            self._timer = self._call_later(self.poll_interval, self._poll)
            return
        self.emit("sync_peer_failure", generation=update.generation, rank=update.failure.rank,
                  label=update.failure.label, exit_code=update.failure.info.exit_code, reason=update.reason)
        self._post(update)

    def _peer_update(self, state: Generation) -> Optional[PeerUpdate]:
        joins = self._joins(state) - {self.files.index}
        failures = dataclasses.replace(state, failed={i: r for i, r in state.failed.items() if i not in joins}) \
            .failures(exclude=self.files.index)
        abort = state.abort if state.abort is not None and state.abort.get("server") != self.files.index else None
        if abort is not None:
            cause = failures[0] if failures else failure_of(state.number, {**abort, "returncode": state.exit_code()})
            return PeerUpdate(state.number, cause, f"{abort.get('name')} ended the job ({abort.get('reason')})")
        if failures:
            first = failures[0]
            # rank -1: a node's note, not a rank (a lost server's replacement joining): it did not fail
            reason = first.label if first.rank < 0 else f"{first.label} failed ({first.info.describe()})"
            return PeerUpdate(state.number, first, reason)
        lost = self._lost(state)
        if lost:
            names = self._names(lost)
            return PeerUpdate(state.number, failure_of(state.number, {"name": names, "exited_at": time.time()}),
                              f"{names} lost (its launcher's lease expired)")
        if joins:
            return PeerUpdate(state.number, failure_of(state.number, state.failed[min(joins)]),
                              f"{self._names(joins)} joining", membership=True)
        return None

    def _joins(self, state: Generation) -> Set[int]:
        """Servers that joined the running job in ``state``'s generation as new members (their note,
        ``failed.<i>.json`` with rank -1, is not a failure). A member's own note is not one: it says
        that its earlier launcher was lost, which is a failure."""
        return {i for i, record in state.failed.items()
                if record.get("note") == JOIN_NOTE["note"] and i not in self._member_set}

    def _lost(self, state: Generation) -> List[int]:
        """The generation's members that are lost."""
        return sorted(state.lost & self._member_set)

    def _names(self, servers) -> str:
        return ", ".join(self.files.name(i) for i in sorted(servers))

    def rank_failed(self, generation: int, ranks: Sequence[int], failure: Failure) -> None:
        """Announce ``gen_<g>/failed.<i>.json`` before the local group is stopped."""
        self.files.write(generation, f"failed.{self.files.index}.json",
                         {"ranks": sorted(ranks), "rank": failure.rank, "label": failure.label,
                          "returncode": failure.info.returncode, "exit_code": failure.info.exit_code,
                          "exited_at": failure.info.wall_time})
        self.emit("sync_failure_announced", generation=generation, ranks=sorted(ranks), rank=failure.rank,
                  exit_code=failure.info.exit_code)

    # -- between generations ------------------------------------------------------------------------
    def settle(self, generation: int, result: Optional[RunResult], failure: Optional[Failure],
               failed_ranks: Sequence[int], wait: Wait) -> Agreement:
        """After generation ``g`` on this node: agree with the others on what comes next.

        Args:
            generation: The generation that just ended (all its local processes are gone).
            result: This node's own verdict: None to restart, else how the run ends.
            failure: The generation's first failure as this node knows it (its own or a peer's).
            failed_ranks: Local ranks that failed on their own.
            wait: ``wait(seconds) -> bool`` runs the event loop; False once the run must end.

        Returns:
            The union of failed ranks to restart with, or the exit code every node ends with (this
            node's failure code when it has one, else the earliest failure's).
        """
        self._unwatch()
        self._generation = generation
        if result is None:
            return self._barrier(generation, failure, wait)
        if result.exit_code == 0:
            return self._finish_together(generation, wait)
        self._abort(generation, result.exit_code, result.reason)
        return Agreement(tuple(failed_ranks))

    def _barrier(self, generation: int, failure: Optional[Failure], wait: Wait) -> Agreement:
        """``stopped.<i>``, then wait until every node stopped: restart with the union of failures."""
        self._mark(generation, STOPPED)
        state, waited = self._await(generation, wait, STOPPED, lambda s: s.abort is not None
                                    or bool(s.done & self._member_set)
                                    or self._member_set <= s.stopped | s.done | s.lost)  # nobody waited for
        if state is None:
            return Agreement()
        code = failure.info.exit_code if failure is not None else state.exit_code()
        ended = self._barrier_failed(generation, state, code)
        if ended is not None:
            return ended
        if self._lost(state):
            if self.elastic is None or self.files.index in state.lost:  # this one lost: never re-enter
                return self._end_for_lost(generation, state, code)
            state = self._await_replacement(generation, state, wait)
            if state is None:
                return Agreement()
        return self._restart_with(generation, state, code, waited, wait)

    def _barrier_failed(self, generation: int, state: Generation, code: int) -> Optional[Agreement]:
        """How the job ends when the barrier cannot pass (an abort, a node that finished, a node that
        never stopped), else None."""
        if state.abort is not None:
            log.error("%s ended the job in generation %d: %s", state.abort.get("name"), generation,
                      state.abort["reason"])
            return Agreement(exit_code=code, reason="failed")
        if state.done & self._member_set:
            names = self._names(state.done & self._member_set)
            log.error("%s finished generation %d and starts nothing more: the job cannot restart", names, generation)
            self._abort(generation, code, f"{names} already finished")
            return Agreement(exit_code=code, reason="failed")
        if self._waiting(state):
            return self._timed_out(generation, self._waiting(state), STOPPED)
        return None

    def _restart_with(self, generation: int, state: Generation, code: int, waited: float, wait: Wait) -> Agreement:
        """Every node stopped ``generation``: restart with the servers not lost (elastic: agreed
        first) and the union of the failed ranks."""
        servers = tuple(sorted(i for i in state.stopped if i not in state.lost))
        # Only launchers joined, nobody failed or was lost: torchrun does not count such a restart either.
        membership = (bool(state.failed) and set(state.failed) <= self._joins(state)
                      and self._member_set <= set(servers))
        if servers != self.members:
            ended = self._regroup(generation, servers, code, wait)
            if ended is not None:
                return ended
        ranks = state.failed_ranks()
        self.emit("sync_barrier", generation=generation, waited=round(waited, 3), failed_ranks=list(ranks),
                  failed_servers=sorted(state.failed), membership_change=membership)
        log.info("every node stopped generation %d (waited %.2f s); %s", generation, waited,
                 "membership change, not counted against --max-restarts" if membership
                 else f"failed ranks of the job: {list(ranks)}")
        return Agreement(ranks, membership=membership)

    def _waiting(self, state: Generation) -> List[int]:
        """Servers still expected to report ``state``'s generation (not lost)."""
        gone = state.stopped | state.done | state.lost
        return [i for i in self.members if i not in gone]

    def _end_for_lost(self, generation: int, state: Generation, code: int, note: str = "") -> Agreement:
        """A server is lost: the job cannot go on with the nodes it has."""
        lost = self._lost(state)
        names = self._names(lost)
        log.error("%s lost in generation %d (its launcher's lease expired): ending the job%s", names, generation, note)
        if not note:  # with a note (too few left), sync_lost was said when the wait for a replacement began
            self.emit("sync_lost", generation=generation, servers=lost)
        self._abort(generation, code, f"{names} lost")
        return Agreement(exit_code=code, reason="failed")

    def _finish_together(self, generation: int, wait: Wait) -> Agreement:
        """``done.<i>``, then wait for every node's outcome: success only if all are done."""
        self._mark(generation, DONE)
        members = self._member_set
        state, waited = self._await(generation, wait, DONE,
                                    lambda s: s.abort is not None or s.failed or s.stopped or self._lost(s)
                                    or members <= s.done)
        if state is None:
            return Agreement()
        if members <= state.done:
            self.emit("sync_all_done", generation=generation, waited=round(waited, 3))
            return Agreement()
        if state.abort is None and not state.failed and not state.stopped:  # nobody failed: lost, or late
            return self._end_for_lost(generation, state, 1) if self._lost(state) \
                else self._timed_out(generation, [i for i in self.members if i not in state.done], DONE)
        cause = state.failures()
        log.error("this node's ranks finished, but the job failed on another node in generation %d: %s",
                  generation, f"{cause[0].label} ({cause[0].info.describe()})" if cause else "see its log")
        return Agreement(exit_code=state.exit_code(), reason="failed")

    def _await(self, generation: int, wait: Wait, what: str, ready: Callable[[Generation], bool],
               timeout: Optional[float] = None) -> Tuple[Optional[Generation], float]:
        """Poll ``gen_<g>`` until ``ready``, the timeout (``--sync-timeout`` unless given; returns the
        last state) or the run's end (None)."""
        start = self.clock()
        timeout = self.timeout if timeout is None else timeout
        deadline = start + timeout
        state = self._read(generation)
        done = ready(state)
        if not done:
            waiting = self._named(state.missing(self.members)) or [what]
            self.emit("sync_wait", generation=generation, waiting_for=what, servers=waiting, timeout=timeout)
            log.info("generation %d: waiting for %s (up to %.0f s)", generation, ", ".join(waiting), timeout)
        while not done:
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            if not wait(min(self.interval, remaining)):
                return None, self.clock() - start
            fresh = self._read(generation)
            if fresh is not state:  # a store that kept its snapshot hands back the same object: nothing new
                state, done = fresh, ready(fresh)
        return state, self.clock() - start

    def _named(self, servers: Sequence[int]) -> List[str]:
        """The first ``NAMED`` of ``servers`` by name, then how many more: a barrier of 1,000 nodes
        waits for 999 at first, and each node naming them all (in its log and events.jsonl, 20 kB a
        line) cost more than telling the failure did."""
        more = [f"and {len(servers) - NAMED} more"] if len(servers) > NAMED else []
        return [self.files.name(i) for i in servers[:NAMED]] + more

    def _timed_out(self, generation: int, missing: List[int], what: str) -> Agreement:
        names = ", ".join(self.files.name(i) for i in missing)
        log.error("--sync-timeout: %s did not report generation %d as %s within %.0f s; giving up", names,
                  generation, what, self.timeout)
        self.emit("sync_timeout", generation=generation, waiting_for=what, missing=missing, timeout=self.timeout)
        self._abort(generation, 1, f"sync-timeout: {names} missing")
        return Agreement(exit_code=1, reason="sync-timeout")

    # -- files --------------------------------------------------------------------------------------
    def _read(self, generation: int) -> Generation:
        try:
            state = self.files.read(generation)
        except OSError as exc:
            if self._read_error != str(exc):
                log.warning("--sync-dir: cannot read %s: %s (retrying)", self.files.gen_path(generation), exc)
                self._read_error = str(exc)
            return Generation(generation)
        self._read_error = None
        return state

    def _mark(self, generation: int, what: str) -> None:
        if (generation, what) in self._written:
            return
        self._written.add((generation, what))
        self.files.write(generation, f"{what}.{self.files.index}", {})
        self.emit(f"sync_{what}", generation=generation)

    def _abort(self, generation: int, exit_code: int, reason: str) -> None:
        if (generation, ABORT) in self._written:
            return
        self._written.add((generation, ABORT))
        if self.files.write(generation, ABORT, {"exit_code": exit_code, "reason": reason}, exclusive=True):
            self.emit("sync_abort", generation=generation, exit_code=exit_code, reason=reason)
            log.warning("generation %d: telling the other nodes to stop (%s)", generation, reason)

    def leave(self, generation: int, result: RunResult, quiet: bool = False) -> None:
        """The run ends: ``done`` (exit 0) or ``abort`` for the other nodes, then close the incarnation.

        ``quiet``: on the way out of an error, a file that cannot be written is not another error.
        """
        self._unwatch()
        try:
            if result.exit_code == 0:
                self._mark(generation, DONE)
            else:
                self._abort(generation, result.exit_code if result.reason == "failed" else 1, result.reason)
            self.files.close(result.reason)
        except LauncherError:
            if not quiet:
                raise
