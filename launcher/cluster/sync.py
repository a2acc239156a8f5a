"""Coordinated restarts of one job's launchers through storage every node shares (``--sync-dir``).

Restart generations (docs/multinode.md): generation ``g`` is the attempt number, the same on every
node. Files, under ``DIR/<run-id>/inc_<k>/`` (an incarnation is one start of the whole job; a job
started again with the same run id, as a Volcano job restart does, gets the next one)::

    join.<i>                  server i joined this incarnation
    closed                    a launcher of this incarnation ended: a new start does not join it
    gen_<g>/failed.<i>.json   server i's ranks that failed on their own in generation g, with exit info
    gen_<g>/stopped.<i>       every process of generation g on server i is gone; it will restart
    gen_<g>/done.<i>          every rank of server i exited 0 in generation g; it starts nothing more
    gen_<g>/abort             the job ends in generation g (first writer wins): exit code and reason

Every file is written whole (temp file, then rename, or link for the exclusive ones), so a reader sees
all of it or nothing, and a node only ever creates its own files. Other nodes' files are found by
listing the generation directory every ``interval`` seconds from the event loop: inotify does not
see other NFS clients' writes.
"""

import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from launcher.common.errors import LauncherError
from launcher.supervision.policy import Agreement, Failure, NoSync, PeerUpdate, RunResult, Wait
from launcher.supervision.states import ExitInfo

log = logging.getLogger(__name__)

#: Seconds between two looks at the shared directory (peer failures, the barrier).
POLL_INTERVAL = 0.5
CLOSED, ABORT, STOPPED, DONE = "closed", "abort", "stopped", "done"
_MARKER = re.compile(r"(failed)\.(\d+)\.json|(stopped|done)\.(\d+)|(abort)")
_INCARNATION = re.compile(r"inc_(\d+)")

Emit = Callable[..., object]


@dataclass(frozen=True)
class Generation:
    """What the files of one generation say.

    Attributes:
        number: The generation (attempt number).
        failed: Server index -> its ``failed.<i>.json`` record.
        stopped: Servers whose processes of this generation are all gone, restarting.
        done: Servers whose ranks all exited 0.
        abort: The ``abort`` record, if the job ends.
    """

    number: int
    failed: Dict[int, dict] = field(default_factory=dict)
    stopped: FrozenSet[int] = frozenset()
    done: FrozenSet[int] = frozenset()
    abort: Optional[dict] = None

    def failed_ranks(self) -> Tuple[int, ...]:
        """The union of every node's failed ranks: the restore plan's fault ranks."""
        return tuple(sorted({int(r) for record in self.failed.values() for r in record.get("ranks", ())}))

    def missing(self, server_count: int) -> List[int]:
        """Servers that have neither stopped nor finished this generation."""
        return [i for i in range(server_count) if i not in self.stopped and i not in self.done]

    def failures(self, exclude: Optional[int] = None) -> List[Failure]:
        """Each node's first failure, earliest first (by the failing node's clock)."""
        found = [(r.get("exited_at", 0.0), i, _failure(self.number, r)) for i, r in self.failed.items() if i != exclude]
        return [f for _, _, f in sorted(found, key=lambda item: item[:2])]

    def exit_code(self) -> int:
        """The job's exit code: the earliest failing rank's, else the abort's, else 1."""
        failures = self.failures()
        if failures:
            return failures[0].info.exit_code
        return int((self.abort or {}).get("exit_code") or 1)


def _failure(generation: int, record: dict) -> Failure:
    rank = int(record.get("rank", -1))
    label = f"rank {rank} on {record.get('name', 'server ?')}" if rank >= 0 else str(record.get("name"))
    return Failure(generation, rank, label, ExitInfo(int(record.get("returncode", 1)),
                                                     float(record.get("exited_at", record.get("ts", 0.0)))))


class SyncDir:
    """The files of one incarnation of the job, as seen by server ``index``.

    Args:
        path: ``DIR/<run-id>/inc_<k>``.
        index: This server's index in the rank table.
        names: Every server's name (``server_id``), by index.
    """

    def __init__(self, path: str, index: int, names: Sequence[str]):
        self.path = path
        self.index = index
        self.names = tuple(names)
        self.count = len(self.names)

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""
        return f"server {index} ({self.names[index]})" if 0 <= index < self.count else f"server {index}"

    @classmethod
    def join(cls, base: str, run_id: str, index: int, names: Sequence[str]) -> "SyncDir":
        """Join the current incarnation of ``run_id``, or start the next one.

        The newest ``inc_<k>`` is joined unless it is ``closed`` or already has this server's
        ``join.<index>`` (a previous start of this node): then ``inc_<k+1>``. Creating a directory
        and ``join.<index>`` are both exclusive, so nodes starting together end in the same one.
        """
        root = os.path.join(os.path.abspath(base), run_id)
        os.makedirs(root, exist_ok=True)
        numbers = [int(m.group(1)) for m in map(_INCARNATION.fullmatch, os.listdir(root)) if m]
        number = max(numbers, default=0)
        while True:
            path = os.path.join(root, f"inc_{number}")
            os.makedirs(path, exist_ok=True)
            files = cls(path, index, names)
            if not os.path.exists(os.path.join(path, CLOSED)) and files._publish("", f"join.{index}", {},
                                                                                 exclusive=True):
                return files
            number += 1

    def gen_path(self, generation: int) -> str:
        """``inc_<k>/gen_<g>``."""
        return os.path.join(self.path, f"gen_{generation}")

    def read(self, generation: int) -> Generation:
        """Every node's files of ``generation`` (files not readable yet are left out)."""
        directory = self.gen_path(generation)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        failed: Dict[int, dict] = {}
        marks: Dict[str, Set[int]] = {STOPPED: set(), DONE: set()}
        abort = None
        for name in names:
            match = _MARKER.fullmatch(name)
            if match is None:
                continue
            if match.group(3):
                marks[match.group(3)].add(int(match.group(4)))
                continue
            record = _load(os.path.join(directory, name))
            if record is not None and match.group(1):
                failed[int(match.group(2))] = record
            elif record is not None:
                abort = record
        return Generation(generation, failed, frozenset(marks[STOPPED]), frozenset(marks[DONE]), abort)

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Publish ``gen_<g>/<name>``; with ``exclusive``, False when it already exists."""
        return self._publish(f"gen_{generation}", name, data, exclusive)

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended: a later start of the job does not join it."""
        self._publish("", CLOSED, {"reason": reason}, exclusive=True)

    def _publish(self, sub: str, name: str, data: dict, exclusive: bool) -> bool:
        directory = os.path.join(self.path, sub) if sub else self.path
        record = {"server": self.index, "name": self.name(self.index), "host": socket.gethostname(),
                  "pid": os.getpid(), "ts": time.time(), **data}
        target = os.path.join(directory, name)
        tmp = os.path.join(directory, f".{name}.{socket.gethostname()}.{os.getpid()}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(record, fh)
                fh.flush()
                os.fsync(fh.fileno())
            if exclusive:
                os.link(tmp, target)  # fails if it exists, where a rename would replace it
            else:
                os.replace(tmp, target)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise LauncherError(f"--sync-dir: cannot write {target}: {exc.strerror or exc}") from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _load(path: str) -> Optional[dict]:
    """A record written by a launcher, or None (unreadable, incomplete, or not one of ours)."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        _failure(0, record)  # the fields the readers convert must convert
        int(record.get("exit_code") or 1) + sum(int(r) for r in record.get("ranks", ()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return record


class Coordinator(NoSync):
    """The restart-generation protocol behind the supervisor's hooks.

    Args:
        files: This incarnation's files.
        timeout: ``--sync-timeout``: longest wait for the other nodes at a barrier.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        call_later, cancel, post: The event loop's timers and event queue (``LocalProcessGroup``).
        interval: Seconds between two looks at the shared directory.
        clock: Monotonic clock (tests pass a fake one).
    """

    def __init__(self, files: SyncDir, timeout: float, emit: Emit, call_later: Callable[[float, Callable], int],
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
            cause = failures[0] if failures else _failure(state.number, {**abort, "returncode": state.exit_code()})
            return PeerUpdate(state.number, cause, f"{abort.get('name')} ended the job ({abort.get('reason')})")
        if failures:
            first = failures[0]
            return PeerUpdate(state.number, first, f"{first.label} failed ({first.info.describe()})")
        return None

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
                                    lambda s: s.abort is not None or bool(s.done) or not s.missing(self.files.count))
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
        if state.missing(self.files.count):
            return self._timed_out(generation, state.missing(self.files.count), STOPPED)
        ranks = state.failed_ranks()
        self.emit("sync_barrier", generation=generation, waited=round(waited, 3), failed_ranks=list(ranks),
                  failed_servers=sorted(state.failed))
        log.info("every node stopped generation %d (waited %.2f s); failed ranks of the job: %s", generation,
                 waited, list(ranks))
        return Agreement(ranks)

    def _finish_together(self, generation: int, wait: Wait) -> Agreement:
        """``done.<i>``, then wait for every node's outcome: success only if all are done."""
        self._mark(generation, DONE)
        count = self.files.count
        state, waited = self._await(generation, wait, DONE,
                                    lambda s: s.abort is not None or s.failed or s.stopped or len(s.done) == count)
        if state is None:
            return Agreement()
        if len(state.done) == count:
            self.emit("sync_all_done", generation=generation, waited=round(waited, 3))
            return Agreement()
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
