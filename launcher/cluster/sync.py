"""Coordinated restarts of one job's launchers: the protocol, over a store of records.

Restart generations (docs/multinode.md): generation ``g`` is the attempt number, the same on every
node. :class:`Coordinator` runs the protocol behind the supervisor's hooks over a :class:`Store`:
the files of :mod:`launcher.cluster.syncdir` (``--sync-dir``) or the keys of
:mod:`launcher.cluster.etcdstore` (``--coordinator etcd://``, which adds leased membership: a node
whose launcher dies is *lost*). :mod:`launcher.cluster.syncjoin` joins one for ``launcher run``.
"""

import logging
import time
from typing import Callable, List, Optional, Protocol, Sequence, Set, Tuple

from launcher.cluster.syncdir import ABORT, DONE, STOPPED, Generation, failure_of
from launcher.common.errors import LauncherError
from launcher.supervision.policy import Agreement, Failure, NoSync, PeerUpdate, RunResult, Wait

log = logging.getLogger(__name__)

#: Seconds between two looks at the shared directory (peer failures, the barrier).
POLL_INTERVAL = 0.5

Emit = Callable[..., object]


class Store(Protocol):
    """Where the nodes' records live (``SyncDir``, ``EtcdStore``); ``read`` and ``write`` never block long.

    Attributes:
        index: This server's index; count: how many servers; path: where, for messages.
    """

    index: int
    count: int
    path: str

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""

    def gen_path(self, generation: int) -> str:
        """Where generation ``generation``'s records are, for messages."""

    def read(self, generation: int) -> Generation:
        """Every node's records of ``generation``."""

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Publish ``gen_<g>/<name>``; with ``exclusive``, False when it already exists."""

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended."""

    def shutdown(self) -> None:
        """Release what the store holds (threads, lease)."""


class Coordinator(NoSync):
    """The restart-generation protocol behind the supervisor's hooks.

    Args:
        files: This incarnation's records.
        timeout: ``--sync-timeout``: longest wait for the other nodes at a barrier.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        call_later, cancel, post: The event loop's timers and event queue (``LocalProcessGroup``).
        interval: Seconds between two looks at the store.
        clock: Monotonic clock (tests pass a fake one).
    """

    def __init__(self, files: Store, timeout: float, emit: Emit, call_later: Callable[[float, Callable], int],
                 cancel: Callable[[int], None], post: Callable[[object], None], interval: float = POLL_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.files, self.timeout, self.emit, self.interval, self.clock = files, timeout, emit, interval, clock
        self._call_later, self._cancel, self._post = call_later, cancel, post
        self._timer: Optional[int] = None
        self._generation = 0
        self._written: Set[Tuple[int, str]] = set()
        self._read_error: Optional[str] = None

    # -- while a generation runs --------------------------------------------------------------------
    def attempt_started(self, generation: int) -> None:
        """Watch ``gen_<g>/`` for other nodes' failures and for ``abort`` (first look at once)."""
        self._unwatch()
        self._generation = generation
        self._timer = self._call_later(0.0, self._poll)

    def _unwatch(self) -> None:
        if self._timer is not None:
            self._cancel(self._timer)
            self._timer = None

    def _poll(self) -> None:
        self._timer = None
        update = self._peer_update(self._read(self._generation))
        if update is None:
            self._timer = self._call_later(self.interval, self._poll)
            return
        self.emit("sync_peer_failure", generation=update.generation, rank=update.failure.rank,
                  label=update.failure.label, exit_code=update.failure.info.exit_code, reason=update.reason)
        self._post(update)

    def _peer_update(self, state: Generation) -> Optional[PeerUpdate]:
        failures = state.failures(exclude=self.files.index)
        abort = state.abort if state.abort is not None and state.abort.get("server") != self.files.index else None
        if abort is not None:
            cause = failures[0] if failures else failure_of(state.number, {**abort, "returncode": state.exit_code()})
            return PeerUpdate(state.number, cause, f"{abort.get('name')} ended the job ({abort.get('reason')})")
        if failures:
            first = failures[0]
            return PeerUpdate(state.number, first, f"{first.label} failed ({first.info.describe()})")
        if state.lost:
            names = self._names(state.lost)
            return PeerUpdate(state.number, failure_of(state.number, {"name": names, "exited_at": time.time()}),
                              f"{names} lost (its launcher's lease expired)")
        return None

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
        state, waited = self._await(generation, wait, STOPPED,
                                    lambda s: s.abort is not None or bool(s.done) or not self._waiting(s))
        if state is None:
            return Agreement()
        code = failure.info.exit_code if failure is not None else state.exit_code()
        if state.abort is not None:
            log.error("%s ended the job in generation %d: %s", state.abort.get("name"), generation, state.abort["reason"])
            return Agreement(exit_code=code, reason="failed")
        if state.done:
            names = ", ".join(self.files.name(i) for i in sorted(state.done))
            log.error("%s finished generation %d and starts nothing more: the job cannot restart", names, generation)
            self._abort(generation, code, f"{names} already finished")
            return Agreement(exit_code=code, reason="failed")
        if state.lost:
            return self._end_for_lost(generation, state, code)
        if state.missing(self.files.count):
            return self._timed_out(generation, state.missing(self.files.count), STOPPED)
        ranks = state.failed_ranks()
        self.emit("sync_barrier", generation=generation, waited=round(waited, 3), failed_ranks=list(ranks),
                  failed_servers=sorted(state.failed))
        log.info("every node stopped generation %d (waited %.2f s); failed ranks of the job: %s", generation,
                 waited, list(ranks))
        return Agreement(ranks)

    def _waiting(self, state: Generation) -> List[int]:
        """Servers still expected to report ``state``'s generation (not lost)."""
        return [i for i in state.missing(self.files.count) if i not in state.lost]

    def _end_for_lost(self, generation: int, state: Generation, code: int) -> Agreement:
        """A server is lost: the job cannot go on with the nodes of its rank table."""
        names = self._names(state.lost)
        log.error("%s lost in generation %d (its launcher's lease expired): ending the job", names, generation)
        self.emit("sync_lost", generation=generation, servers=sorted(state.lost))
        self._abort(generation, code, f"{names} lost")
        return Agreement(exit_code=code, reason="failed")

    def _finish_together(self, generation: int, wait: Wait) -> Agreement:
        """``done.<i>``, then wait for every node's outcome: success only if all are done."""
        self._mark(generation, DONE)
        count = self.files.count
        state, waited = self._await(generation, wait, DONE,
                                    lambda s: s.abort is not None or s.failed or s.stopped or s.lost
                                    or len(s.done) == count)
        if state is None:
            return Agreement()
        if len(state.done) == count:
            self.emit("sync_all_done", generation=generation, waited=round(waited, 3))
            return Agreement()
        if state.lost and state.abort is None and not state.failed and not state.stopped:
            return self._end_for_lost(generation, state, 1)
        if state.abort is None and not state.failed and not state.stopped:
            return self._timed_out(generation, [i for i in range(count) if i not in state.done], DONE)
        cause = state.failures()
        log.error("this node's ranks finished, but the job failed on another node in generation %d: %s",
                  generation, f"{cause[0].label} ({cause[0].info.describe()})" if cause else "see its log")
        return Agreement(exit_code=state.exit_code(), reason="failed")

    def _await(self, generation: int, wait: Wait, what: str,
               ready: Callable[[Generation], bool]) -> Tuple[Optional[Generation], float]:
        """Poll ``gen_<g>`` until ``ready``, the timeout (returns the last state) or the run's end (None)."""
        start = self.clock()
        deadline = start + self.timeout
        state = self._read(generation)
        if not ready(state):
            waiting = [self.files.name(i) for i in state.missing(self.files.count)]
            self.emit("sync_wait", generation=generation, waiting_for=what, servers=waiting, timeout=self.timeout)
            log.info("generation %d: waiting for %s (up to %.0f s)", generation, ", ".join(waiting), self.timeout)
        while not ready(state):
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            if not wait(min(self.interval, remaining)):
                return None, self.clock() - start
            state = self._read(generation)
        return state, self.clock() - start

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
