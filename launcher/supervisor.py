"""Policy: the restart loop. It sees only the ``ProcessGroup`` interface and scripted-able events.

One attempt = start every local rank, wait for events, and end when all ranks succeeded, one failed
(then stop the rest: SIGTERM to each main process, SIGKILL of the process groups at the deadline), or
the launcher was told to stop. A failed attempt is restarted while the budget lasts; a restart starts
only after every process of the previous attempt is gone.
"""

import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from launcher.procgroup import ControlRequest, Event, ProcessGroup, RankExited, SignalReceived
from launcher.rankenv import WorkerSpec
from launcher.states import ExitInfo, Worker, WorkerState

log = logging.getLogger(__name__)

#: After SIGKILL, how long to wait for the kernel to report the exits before giving up on them.
KILL_SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class RestartPolicy:
    """The restart budget and the stop timeouts.

    Attributes:
        max_restarts: Restarts allowed after the first attempt.
        backoff: Seconds between a failed attempt and the next.
        stop_timeout: SIGTERM -> SIGKILL delay when stopping the group after a failure.
        grace_period: SIGTERM -> SIGKILL delay when the launcher itself is asked to stop.
    """

    max_restarts: int = 0
    backoff: float = 0.0
    stop_timeout: float = 10.0
    grace_period: float = 25.0


@dataclass(frozen=True)
class Failure:
    """A rank that failed on its own (not one the launcher stopped)."""

    attempt: int
    rank: int
    label: str
    info: ExitInfo
    log_path: Optional[str] = None


@dataclass(frozen=True)
class RunResult:
    """How the run ended.

    Attributes:
        exit_code: The launcher's exit status.
        reason: ``succeeded``, ``failed`` (budget spent) or ``signal``.
        attempts: Attempts started.
        failures: Every rank failure, in order (first of each attempt).
        signum: The stop signal, for ``reason == "signal"``.
    """

    exit_code: int
    reason: str
    attempts: int
    failures: Tuple[Failure, ...] = ()
    signum: Optional[int] = None

    @property
    def root_cause(self) -> Optional[Failure]:
        """The first failure of the last failed attempt."""
        return self.failures[-1] if self.failures else None


Emit = Callable[..., object]


@dataclass
class _Attempt:
    number: int
    workers: Dict[int, Worker]
    failure: Optional[Failure] = None
    signum: Optional[int] = None
    failed_ranks: List[int] = field(default_factory=list)


class Supervisor:
    """Runs attempts until success, a spent budget, or a stop signal.

    Args:
        group: The process-group mechanism.
        specs_for: ``(attempt, ranks that failed in the previous attempt) -> specs``.
        policy: Restart budget and timeouts.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        on_spawned: Called with ``(attempt, {rank: pid})`` after each start (state file).
        log_path: ``rank -> log file`` of the current attempt, for failure reports.
    """

    def __init__(self, group: ProcessGroup, specs_for: Callable[[int, Sequence[int]], Sequence[WorkerSpec]],
                 policy: RestartPolicy, emit: Emit,
                 on_spawned: Optional[Callable[[int, Dict[int, int]], None]] = None,
                 log_path: Optional[Callable[[int], Optional[str]]] = None):
        self.group = group
        self.specs_for = specs_for
        self.policy = policy
        self.emit = emit
        self.on_spawned = on_spawned or (lambda attempt, pids: None)
        self.log_path = log_path or (lambda rank: None)
        self.failures: List[Failure] = []
        self._pending_signal: Optional[int] = None

    def run(self) -> RunResult:
        """Run attempts until the job ends; returns how it ended."""
        number, failed_ranks = 0, ()
        while True:
            if self._pending_signal is not None:
                return self._signal_result(number)
            attempt = self._run_attempt(number, failed_ranks)
            if attempt.signum is not None or self._pending_signal is not None:
                return self._signal_result(number + 1)
            if attempt.failure is None:
                self.emit("job_succeeded", attempts=number + 1)
                return RunResult(0, "succeeded", number + 1, tuple(self.failures))
            if number >= self.policy.max_restarts:
                cause = attempt.failure
                self.emit("restart_budget_spent", attempts=number + 1, max_restarts=self.policy.max_restarts)
                return RunResult(cause.info.exit_code, "failed", number + 1, tuple(self.failures))
            self.emit("restart", attempt=number + 1, after_rank=attempt.failure.rank,
                      backoff=self.policy.backoff, restarts_left=self.policy.max_restarts - number - 1)
            if self.policy.backoff and self._wait_quietly(self.policy.backoff):
                return self._signal_result(number + 1)
            number, failed_ranks = number + 1, tuple(attempt.failed_ranks)

    def _signal_result(self, attempts: int) -> RunResult:
        signum = self._pending_signal or signal.SIGTERM
        self.emit("stopped_by_signal", signal=signal.Signals(signum).name)
        return RunResult(128 + signum, "signal", attempts, tuple(self.failures), signum)

    # -- one attempt --------------------------------------------------------------------------
    def _run_attempt(self, number: int, failed_before: Sequence[int]) -> _Attempt:
        specs = self.specs_for(number, failed_before)
        workers = {s.rank: Worker(s.rank, s.label, on_change=self._changed(number)) for s in specs}
        attempt = _Attempt(number, workers)
        self.emit("attempt_start", attempt=number, ranks=[s.rank for s in specs])
        self.group.start(specs, number)
        pids = self.group.pids()
        for rank, worker in workers.items():
            worker.transition(WorkerState.RUNNING)
            self.emit("rank_spawned", attempt=number, rank=rank, pid=pids.get(rank))
        self.on_spawned(number, pids)
        while not all(w.done for w in workers.values()):
            self._handle(attempt, self.group.wait_event(None))
        leftovers = self.group.ensure_gone(KILL_SETTLE_SECONDS)
        if leftovers:
            log.warning("process groups %s survived SIGKILL (uninterruptible sleep?)", leftovers)
            self.emit("leftover_processes", attempt=number, pgids=leftovers)
        self.emit("attempt_end", attempt=number, failed=attempt.failure is not None)
        return attempt

    def _handle(self, attempt: _Attempt, event: Optional[Event]) -> None:
        if isinstance(event, RankExited):
            worker = attempt.workers.get(event.rank)
            if worker is None or worker.done:
                return
            worker.exit = event.info
            if event.info.returncode == 0:
                worker.transition(WorkerState.SUCCEEDED)
                return
            worker.transition(WorkerState.FAILED)
            attempt.failed_ranks.append(worker.rank)
            attempt.failure = Failure(attempt.number, worker.rank, worker.label, event.info, self.log_path(worker.rank))
            self.failures.append(attempt.failure)
            log.warning("%s failed (%s); stopping the other local ranks", worker.label, event.info.describe())
            self._stop(attempt, signal.SIGTERM, self.policy.stop_timeout, f"{worker.label} failed")
        elif isinstance(event, SignalReceived):
            self._on_signal(event.signum)
            log.info("received %s: forwarding to the ranks (grace period %.0f s)",
                     signal.Signals(event.signum).name, self.policy.grace_period)
            attempt.signum = event.signum
            self._stop(attempt, event.signum, self.policy.grace_period, "launcher signalled")
        elif isinstance(event, ControlRequest):
            event.reply({"ok": False, "error": f"unsupported request {event.command!r}"}, final=True)

    def _on_signal(self, signum: int) -> None:
        self.emit("signal_received", signal=signal.Signals(signum).name)
        if self._pending_signal is None:
            self._pending_signal = signum

    def _stop(self, attempt: _Attempt, signum: int, timeout: float, reason: str) -> None:
        """Signal every running rank's main process once, then SIGKILL its group at the deadline."""
        stopping = [w for w in attempt.workers.values() if not w.done]
        if not stopping:
            return
        for worker in stopping:
            worker.transition(WorkerState.STOPPING)
        ranks = [w.rank for w in stopping]
        self.emit("stop_group", attempt=attempt.number, signal=signal.Signals(signum).name, ranks=ranks,
                  reason=reason, timeout=timeout)
        self.group.signal_main(ranks, signum)
        deadline, killed = time.monotonic() + timeout, False
        while any(w.state is WorkerState.STOPPING for w in stopping):
            event = self.group.wait_event(max(0.0, deadline - time.monotonic()))
            if event is None:
                if killed:
                    break  # SIGKILL sent and still not reaped: ensure_gone reports it
                killed, deadline = True, time.monotonic() + KILL_SETTLE_SECONDS
                self._kill([w for w in stopping if w.state is WorkerState.STOPPING], attempt.number)
            elif isinstance(event, RankExited):
                worker = attempt.workers.get(event.rank)
                if worker is not None and worker.state is WorkerState.STOPPING:
                    worker.exit = event.info
                    worker.transition(WorkerState.STOPPED)
            elif isinstance(event, SignalReceived):
                # Never a second signal to a rank that is saving; a second Ctrl-C means "now".
                self._on_signal(event.signum)
                if event.signum == signal.SIGINT and attempt.signum == signal.SIGINT and not killed:
                    deadline = time.monotonic()
            elif isinstance(event, ControlRequest):
                event.reply({"ok": False, "error": "the job is already stopping"}, final=True)

    def _kill(self, workers: List[Worker], number: int) -> None:
        ranks = [w.rank for w in workers]
        log.warning("%s did not exit in time: SIGKILL", ", ".join(w.label for w in workers))
        self.emit("kill_group", attempt=number, ranks=ranks)
        self.group.kill_groups(ranks)

    def _wait_quietly(self, seconds: float) -> bool:
        """Wait ``seconds`` (restart backoff); True if a stop signal arrived meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            event = self.group.wait_event(deadline - time.monotonic())
            if isinstance(event, SignalReceived):
                self._on_signal(event.signum)
                return True
            if isinstance(event, ControlRequest):
                event.reply({"ok": False, "error": "no ranks running (restart backoff)"}, final=True)
        return False

    def _changed(self, number: int) -> Callable[[Worker, WorkerState], None]:
        def on_change(worker: Worker, old: WorkerState) -> None:
            if worker.done and worker.exit is not None:
                self.emit("rank_exited", attempt=number, rank=worker.rank, state=worker.state.value,
                          returncode=worker.exit.returncode, exit_code=worker.exit.exit_code,
                          signal=worker.exit.signal_name, exited_at=worker.exit.wall_time)
        return on_change
