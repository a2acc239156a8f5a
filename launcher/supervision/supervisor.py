"""Policy: the restart loop. It sees only the ``ProcessGroup`` interface and scripted-able events.

One attempt = start every local rank, wait for events, and end when all ranks succeeded, one failed
(then stop the rest: SIGTERM to each main process, SIGKILL of the process groups at the deadline), or
the launcher was told to stop. A failed attempt is restarted while the budget lasts; a restart starts
only after every process of the previous attempt is gone.
"""

import logging
import signal
import time
from typing import Callable, Dict, List, Optional, Sequence

from launcher.supervision.debugging import DebugConsole
from launcher.supervision.jobtree import report_escaped
from launcher.supervision.requests import OutsideRequests
from launcher.supervision.loopevents import RankHung
from launcher.supervision.procgroup import (ClusterUpdate, ControlRequest, Event, ProcessGroup, RankExited,
                                            SignalReceived)
from launcher.supervision.policy import (KILL_SETTLE_SECONDS, Attempt as _Attempt, Failure, NoProgress, NoSync,
                                         PeerUpdate, RestartPolicy, RunResult)
from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.states import Worker, WorkerState

log = logging.getLogger(__name__)

Emit = Callable[..., object]

#: Stop signals that mean "the pod is going away": they trigger the dying gasp.
GASP_TRIGGERS = (signal.SIGTERM, signal.SIGHUP)


class Supervisor(OutsideRequests):
    """Runs attempts until success, a spent budget, a stop signal, a dying gasp or an exit request.

    Args:
        group: The process-group mechanism.
        specs_for: ``(attempt, ranks that failed in the previous attempt) -> specs``.
        policy: Restart budget and timeouts.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        on_spawned: Called with ``(attempt, {rank: pid})`` after each start (state file).
        log_path: ``rank -> log file`` of the current attempt, for failure reports.
        request_exit: Writes the graceful-exit request the ranks poll (``launcher exit``).
        hold: ``() -> reason or None``: why the cluster forbids (re)starting ranks right now.
        sync: Restart generations shared with the other nodes (``launcher.cluster.sync.Coordinator``);
            default ``NoSync``: this node decides alone.
        resume_note: ``attempt -> text``: what the ranks of a (re)start resume from, for the restart line.
        clock: Monotonic clock for attempt durations and the restart backoff (tests pass a fake).
        debug: The rank holding the terminal (``--debug-rank``, ``--pdb``), or None.
        progress: ``attempt -> highest heartbeat step its ranks reached`` (None: unknown), for
            ``policy.max_no_progress_restarts``.
        status: ``() -> dict`` merged into the control socket's ``status`` answer (the stragglers).
    """

    def __init__(self, group: ProcessGroup, specs_for: Callable[[int, Sequence[int]], Sequence[WorkerSpec]],
                 policy: RestartPolicy, emit: Emit,
                 on_spawned: Optional[Callable[[int, Dict[int, int]], None]] = None,
                 log_path: Optional[Callable[[int], Optional[str]]] = None,
                 request_exit: Optional[Callable[[], None]] = None,
                 hold: Optional[Callable[[], Optional[str]]] = None, sync: Optional[NoSync] = None,
                 resume_note: Optional[Callable[[int], str]] = None, clock: Callable[[], float] = time.monotonic,
                 debug: Optional[DebugConsole] = None, progress: Callable[[int], Optional[int]] = lambda n: None,
                 status: Callable[[], dict] = dict):
        self.group = group
        self.specs_for = specs_for
        self.policy = policy
        self.emit = emit
        self.on_spawned = on_spawned or (lambda attempt, pids: None)
        self.log_path = log_path or (lambda rank: None)
        self.request_exit = request_exit or (lambda: None)
        self.hold = hold or (lambda: None)
        self.sync = sync or NoSync()
        self.resume_note = resume_note
        self.debug = debug
        self.progress = progress
        self.status = status
        self._no_progress = NoProgress(policy.max_no_progress_restarts)
        self._restart_note: Optional[str] = None  # said once the restart's specs (and plan) are known
        self.clock = clock
        self._quick_failures = 0  # attempts in a row that failed before policy.healthy_seconds
        self.failures: List[Failure] = []
        self.restarts = 0  # group and in-place restarts after failures: the --max-restarts budget
        self.attempt_no = 0  # every (re)start, also cluster-directed ones: TORCHELASTIC_RESTART_COUNT
        self._awaiting_recovery = False  # stopped for a fault: restart when the cluster says so
        self._signal: Optional[int] = None      # first stop signal received
        self._final: Optional[str] = None       # "signal" | "gasp" | "graceful-exit": no more restarts
        self._waiters: List[ControlRequest] = []  # prestop / exit clients answered when the job ends

    def run(self) -> RunResult:
        """Run attempts until the job ends; returns how it ended."""
        failed_ranks, attempts = (), 0
        while self._final is None:
            if not self._wait_for_cluster():
                break
            attempt = self._run_attempt(self.attempt_no, failed_ranks)
            attempts += 1
            if self._final is not None:
                break
            result = self._verdict(attempt, attempts)
            agreed = self.sync.settle(attempt.number, result, attempt.failure, attempt.failed_ranks,
                                      self._wait_quietly)
            if agreed.exit_code is not None:  # the nodes ended the job together
                result = RunResult(agreed.exit_code, agreed.reason, attempts, tuple(self.failures))
            if result is not None:
                return self._finish(result)
            if self._final is not None:
                break
            failed_ranks = agreed.failed_ranks  # every node's, with --sync-dir
            self._restart(attempt, agreed.membership)
        return self._finish(self._final_result(attempts, attempt if attempts else None))

    def _verdict(self, attempt: _Attempt, attempts: int) -> Optional[RunResult]:
        """How the run ends after ``attempt``, as far as this node can tell; None to restart."""
        failure = attempt.failure
        if attempt.cluster_stop is not None or (failure is None and attempt.membership is not None):
            return None
        if failure is None:
            return RunResult(0, "succeeded", attempts, tuple(self.failures))
        if self.policy.strategy.exit_on_failure:
            self.emit("exit_for_reschedule", strategy=self.policy.strategy.describe(),
                      exit_code=failure.info.exit_code)
            log.warning("recovery strategy %s: exiting for rescheduling", self.policy.strategy.describe())
            return RunResult(failure.info.exit_code, "failed", attempts, tuple(self.failures))
        if self._no_progress.stuck_after(self.progress(attempt.number)):
            self.emit("no_progress", attempt=attempt.number, step=self._no_progress.best,
                      restarts=self._no_progress.stalled)
            log.error("%d restart(s) in a row got no further than step %s: ending the job (a crash loop; "
                      "--max-no-progress-restarts)", self._no_progress.stalled, self._no_progress.best)
            return RunResult(failure.info.exit_code, "no-progress", attempts, tuple(self.failures))
        if self.restarts >= self.policy.max_restarts:
            self.emit("restart_budget_spent", attempts=attempts, restarts=self.restarts,
                      max_restarts=self.policy.max_restarts)
            return RunResult(failure.info.exit_code, "failed", attempts, tuple(self.failures))
        return None

    def _restart(self, attempt: _Attempt, membership: bool) -> None:
        """Count the restart after ``attempt``, then back off; outside the budget: cluster-directed ones
        and a membership change (the coordinator's word: no rank failed, no node lost, launchers joined)."""
        self.attempt_no += 1
        if attempt.cluster_stop is not None:
            self.emit("restart", attempt=self.attempt_no, scope="cluster", reason=attempt.cluster_stop)
            self._restart_note = f"restarting as the cluster asks ({attempt.cluster_stop})"
            return
        if membership:
            reason = attempt.membership or "launchers joined"
            self.emit("restart", attempt=self.attempt_no, scope="membership", reason=reason, counted=False,
                      restarts_left=self.policy.max_restarts - self.restarts)
            self._restart_note = f"restarting for a membership change, not counted ({reason})"
            return
        self.restarts += 1
        failure = attempt.failure
        # No failure of its own: it saw only a join, but another node's rank failed in the generation.
        cause = "a failure on another node" if failure is None else f"{failure.label} failed " \
            f"({'hung: ' + failure.hang[0] if failure.hang else failure.info.describe()})"
        self._restart_note = f"restarting (restart {self.restarts} of {self.policy.max_restarts}) after {cause}"
        healthy = attempt.duration >= self.policy.healthy_seconds
        self._quick_failures = 0 if healthy else self._quick_failures + 1
        delay = self.policy.restart_delay(self._quick_failures)
        self.emit("restart", attempt=self.attempt_no, after_rank=failure.rank if failure else None, scope="group",
                  backoff=delay, ran_for=round(attempt.duration, 3), quick_failures=self._quick_failures,
                  restarts_left=self.policy.max_restarts - self.restarts)
        if delay:
            log.info("%d quick failure(s) in a row: restarting in %.1f s", self._quick_failures, delay)
            self._wait_quietly(delay)

    def _final_result(self, attempts: int, attempt: Optional[_Attempt]) -> RunResult:
        if self._final == "cluster-timeout":
            return RunResult(1, "cluster-timeout", attempts, tuple(self.failures))
        if self._final == "graceful-exit":
            code = attempt.failure.info.exit_code if attempt and attempt.failure else 0
            return RunResult(code, "graceful-exit", attempts, tuple(self.failures))
        signum = self._signal or signal.SIGTERM
        return RunResult(128 + signum, self._final, attempts, tuple(self.failures), signum)

    def _finish(self, result: RunResult) -> RunResult:
        self.sync.leave(self.attempt_no, result)
        self.emit("job_end", reason=result.reason, exit_code=result.exit_code, attempts=result.attempts)
        for waiter in self._waiters:
            waiter.reply({"ok": True, "done": True, "reason": result.reason, "exit_code": result.exit_code},
                         final=True)
        self._waiters.clear()
        return result

    # -- one attempt --------------------------------------------------------------------------
    def _run_attempt(self, number: int, failed_before: Sequence[int]) -> _Attempt:
        specs = self.specs_for(number, failed_before)
        if self._restart_note is not None:
            note = self.resume_note(number) if self.resume_note else None
            log.info("%s%s", self._restart_note, f"; {note}" if note else "")
            self._restart_note = None
        workers = {s.rank: Worker(s.rank, s.label, on_change=self._changed(number)) for s in specs}
        attempt = _Attempt(number, workers)
        started = self.clock()
        self.emit("attempt_start", attempt=number, ranks=[s.rank for s in specs])
        self.group.start(specs, number)
        pids = self.group.pids()
        for rank, worker in workers.items():
            worker.transition(WorkerState.RUNNING)
            self.emit("rank_spawned", attempt=number, rank=rank, pid=pids.get(rank))
        self.on_spawned(number, pids)
        self.sync.attempt_started(number)
        while not attempt.finished:
            self._handle(attempt, self.group.wait_event(None))
        leftovers = self.group.ensure_gone(KILL_SETTLE_SECONDS)
        report_escaped(self.emit, self.group.take_escaped(), attempt=number)
        if leftovers:
            log.warning("process groups %s survived SIGKILL (uninterruptible sleep?)", leftovers)
            self.emit("leftover_processes", attempt=number, pgids=leftovers)
        attempt.duration = self.clock() - started
        self.emit("attempt_end", attempt=number, failed=attempt.failure is not None)
        return attempt

    def _handle(self, attempt: _Attempt, event: Optional[Event]) -> None:
        if isinstance(event, RankExited):
            self._on_exit(attempt, event)
        elif isinstance(event, SignalReceived):
            if self._to_debugger(event.signum):
                return
            self._on_signal(event.signum)
            if event.signum in GASP_TRIGGERS:
                self._gasp(attempt, f"signal {signal.Signals(event.signum).name}")
            else:
                log.info("Ctrl-C: stopping the ranks (up to %.0f s to save and exit); Ctrl-C again to kill "
                         "them now", self.policy.grace_period)
                self._final = "signal"
                self._stop(attempt, event.signum, self.policy.grace_period, "launcher signalled")
        elif isinstance(event, ControlRequest):
            self._on_request(attempt, event)
        elif isinstance(event, ClusterUpdate):
            self._on_cluster(attempt, event.change)
        elif isinstance(event, PeerUpdate):
            self._on_peer(attempt, event)
        elif isinstance(event, RankHung):
            self._on_hung(attempt, event)

    def _on_exit(self, attempt: _Attempt, event: RankExited) -> None:
        worker = attempt.workers.get(event.rank)
        if worker is None or worker.done:
            return
        worker.exit = event.info
        if worker.state is WorkerState.STOPPING:  # outlived its SIGKILL settle time, now reaped
            worker.transition(WorkerState.STOPPED)
            return
        if event.info.returncode == 0:
            worker.transition(WorkerState.SUCCEEDED)
            return
        worker.transition(WorkerState.FAILED)
        failure = Failure(attempt.number, worker.rank, worker.label, event.info, self.log_path(worker.rank),
                          attempt.hung.get(worker.rank, ()))
        self.failures.append(failure)
        if self._restart_in_place(attempt, worker, failure):
            return
        attempt.failed_ranks.append(worker.rank)
        attempt.failure = failure
        self.sync.rank_failed(attempt.number, attempt.failed_ranks, failure)  # before the others stop
        log.warning("%s failed (%s); stopping the other local ranks", worker.label, event.info.describe())
        if self.policy.strategy.dump:
            self._gasp(attempt, f"{worker.label} failed", final=False)
        else:
            self._stop(attempt, signal.SIGTERM, self.policy.stop_timeout, f"{worker.label} failed")

    def _restart_in_place(self, attempt: _Attempt, worker: Worker, failure: Failure) -> bool:
        """recover-in-place: respawn only ``worker``'s rank while the others keep running."""
        if not self.policy.strategy.in_place or self._final is not None:
            return False
        if not self.policy.in_place_supported:
            log.info("recover-in-place: the framework cannot re-join a running group; restarting the group")
            return False
        if self.restarts >= self.policy.max_restarts:
            return False
        self.restarts += 1
        self.attempt_no += 1
        spec = next(s for s in self.specs_for(self.attempt_no, [worker.rank]) if s.rank == worker.rank)
        self.emit("restart", attempt=self.attempt_no, after_rank=worker.rank, scope="rank",
                  restarts_left=self.policy.max_restarts - self.restarts)
        log.warning("%s failed (%s); restarting it in place (restart %d of %d)", worker.label,
                    failure.info.describe(), self.restarts, self.policy.max_restarts)
        self.group.respawn(spec, self.attempt_no)
        fresh = Worker(spec.rank, spec.label, on_change=self._changed(self.attempt_no))
        fresh.transition(WorkerState.RUNNING)
        attempt.workers[spec.rank] = fresh
        self.emit("rank_spawned", attempt=self.attempt_no, rank=spec.rank, pid=self.group.pids().get(spec.rank))
        return True

    def _to_debugger(self, signum: int) -> bool:
        """Ctrl-C while a rank holds the terminal: it goes to that rank (pdb breaks), not to the job."""
        return (signum == signal.SIGINT and self.debug is not None
                and self.debug.interrupt(self.group.pids(), self.group.signal_main))

    def _on_signal(self, signum: int) -> None:
        self.emit("signal_received", signal=signal.Signals(signum).name)
        if self._signal is None:
            self._signal = signum

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
        # Auxiliary processes (the MindSpore scheduler, rank < 0) are not signalled: a scheduler gone
        # first leaves the workers hanging in their teardown. Once no worker runs it has nothing to
        # serve or save, and it ignores SIGTERM: its group is killed then, not at the deadline.
        late = [w for w in stopping if w.rank < 0]
        spared = self._debugged(ranks)
        self.group.signal_main([w.rank for w in stopping if w.rank >= 0 and w.rank not in spared], signum)
        deadline, killed = time.monotonic() + timeout, False
        while any(w.state is WorkerState.STOPPING for w in stopping):
            if late and all(w.done for w in attempt.workers.values() if w.rank >= 0):
                self.emit("kill_group", attempt=attempt.number, ranks=[w.rank for w in late], reason="workers gone")
                self.group.kill_groups([w.rank for w in late])
                late = []
            left = [w for w in stopping if w.state is WorkerState.STOPPING and w.rank not in spared]
            # No deadline for a rank at a debugger prompt: it ends when the user quits it.
            event = self.group.wait_event(max(0.0, deadline - time.monotonic()) if left or killed else None)
            if event is None:
                if killed:  # SIGKILL sent and still not reaped (uninterruptible sleep?)
                    self._abandon(attempt, [w for w in stopping if w.state is WorkerState.STOPPING])
                    break
                killed, deadline = True, time.monotonic() + KILL_SETTLE_SECONDS
                self._kill(attempt, left)
            elif isinstance(event, RankExited):
                worker = attempt.workers.get(event.rank)
                if worker is not None and worker.state is WorkerState.STOPPING:
                    worker.exit = event.info
                    worker.transition(WorkerState.STOPPED)
            elif isinstance(event, SignalReceived) and spared and self._to_debugger(event.signum):
                continue
            elif isinstance(event, SignalReceived):
                # Never a second signal to a rank that is saving; a second Ctrl-C means "now".
                if spared and event.signum == signal.SIGINT:  # Ctrl-C twice: kill the debugged rank too
                    self._on_signal(event.signum)
                    spared, deadline = set(), time.monotonic()
                    continue
                first = self._signal is None
                self._on_signal(event.signum)
                self._final = self._final or ("gasp" if event.signum in GASP_TRIGGERS else "signal")
                if event.signum == signal.SIGINT and self._signal == signal.SIGINT and not killed:
                    if first:
                        log.info("Ctrl-C: no restart; Ctrl-C again to kill the ranks now")
                    else:
                        log.warning("Ctrl-C again: killing the ranks now")
                        deadline = time.monotonic()
            elif isinstance(event, ControlRequest):
                self._on_request(None, event)
            elif isinstance(event, ClusterUpdate):
                self._on_cluster(None, event.change)

    def _debugged(self, ranks: List[int]) -> set:
        """The rank among ``ranks`` a stop must leave alone: it holds the terminal, and the stop is the
        launcher's own doing (a failure elsewhere), not the user's (Ctrl-C) or the pod's (SIGTERM)."""
        if self.debug is None or self._final in ("signal", "gasp"):
            return set()
        spared = self.debug.holding(self.group.pids()) & set(ranks)
        if spared:
            log.warning("rank %s holds the terminal (debugger): not stopped, no deadline; the job ends when "
                        "it exits (Ctrl-C twice to kill it)", ", ".join(map(str, sorted(spared))))
        return spared

    def _kill(self, attempt: _Attempt, workers: List[Worker]) -> None:
        ranks = [w.rank for w in workers]
        attempt.killed.extend(ranks)
        log.warning("%s did not exit in time: SIGKILL", ", ".join(w.label for w in workers))
        self.emit("kill_group", attempt=attempt.number, ranks=ranks)
        self.group.kill_groups(ranks)

    def _abandon(self, attempt: _Attempt, workers: List[Worker]) -> None:
        """Give up waiting for processes that survive SIGKILL; ensure_gone reports their groups."""
        for worker in workers:
            worker.transition(WorkerState.STOPPED)
        self.emit("rank_lost", attempt=attempt.number, ranks=[w.rank for w in workers])

    def _wait_quietly(self, seconds: float) -> bool:
        """Wait ``seconds`` (backoff, barrier), honouring stop signals and requests; False once the run ends."""
        deadline = self.clock() + seconds
        while self._final is None and self.clock() < deadline:
            self._idle_event(self.group.wait_event(deadline - self.clock()))
        return self._final is None

    def _idle_event(self, event: Optional[Event]) -> None:
        """An event while no ranks run (backoff, cluster hold): a stop signal ends the run."""
        if isinstance(event, SignalReceived):
            self._on_signal(event.signum)
            self._final = "gasp" if event.signum in GASP_TRIGGERS else "signal"
        elif isinstance(event, ControlRequest):
            self._on_request(None, event)
        elif isinstance(event, ClusterUpdate):
            self._on_cluster(None, event.change)

    def _changed(self, number: int) -> Callable[[Worker, WorkerState], None]:
        def on_change(worker: Worker, old: WorkerState) -> None:
            if worker.done and worker.exit is not None:
                self.emit("rank_exited", attempt=number, rank=worker.rank, state=worker.state.value,
                          returncode=worker.exit.returncode, exit_code=worker.exit.exit_code,
                          signal=worker.exit.signal_name, exited_at=worker.exit.wall_time)
        return on_change
