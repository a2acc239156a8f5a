"""Policy: the restart loop. It sees only the ``ProcessGroup`` interface and scripted-able events.

One attempt = start every local rank, wait for events, and end when all ranks succeeded, one failed
(then stop the rest: SIGTERM to each main process, SIGKILL of the process groups at the deadline), or
the launcher was told to stop. After each attempt the restart policy (:class:`Restarts`) decides:
restart (within the budget, after its backoff) or end; a restart starts only after every process of
the previous attempt is gone.

Every event the loop waits for goes through one dispatch table keyed by the loop's phase (ranks
running, ranks being stopped, no ranks) and the event's type (:meth:`Supervisor._table`).
"""

import logging
import signal
import time
from typing import Callable, Dict, List, Optional

from launcher.supervision.debugging import DebugConsole
from launcher.supervision.hooks import Cluster, ClusterHooks, Job
from launcher.supervision.jobtree import report_escaped
from launcher.supervision.requests import OutsideRequests, RunState
from launcher.supervision.loopevents import RankHung
from launcher.supervision.procgroup import (ClusterUpdate, ControlRequest, Event, ProcessGroup, RankExited,
                                            SignalReceived, Started, start_attempt)
from launcher.supervision.policy import (KILL_SETTLE_SECONDS, Attempt as _Attempt, Failure, NoSync, PeerUpdate,
                                         RestartPolicy, RunResult)
from launcher.supervision.phases import Phase, Stopping as _Stopping
from launcher.supervision.preflight import Preflight
from launcher.supervision.restarts import Restarts
from launcher.supervision.states import Worker, WorkerState

log = logging.getLogger(__name__)

Emit = Callable[..., object]

#: Stop signals that mean "the pod is going away": they trigger the dying gasp.
GASP_TRIGGERS = (signal.SIGTERM, signal.SIGHUP)


Handler = Callable[[object, Optional[Event]], None]


class Supervisor:
    """Runs attempts until success, a spent budget, a stop signal, a dying gasp or an exit request.

    Args:
        group: The process-group mechanism.
        job: Builds each attempt's ranks and reports on them (``launcher.supervision.hooks.Job``).
        policy: Restart budget and timeouts; its decisions are :class:`Restarts`'.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
        cluster: The reset.json hold and the graceful-exit request (default: no hold).
        sync: Restart generations shared with the other nodes (``launcher.cluster.sync.Coordinator``);
            default ``NoSync``: this node decides alone.
        debug: The rank holding the terminal (``--debug-rank``, ``--pdb``), or None.
        clock: Monotonic clock for attempt durations and the restart backoff (tests pass a fake).
        first_attempt: The first attempt's number (> 0 when joining a running elastic job).
        started: The first attempt, when its ranks were started before the supervisor was built
            (``launcher.run.session``: only where no hold, health check or busy device could have
            kept them back, so its checks before a start are not taken again).
    """

    def __init__(self, group: ProcessGroup, job: Job, policy: RestartPolicy, emit: Emit, *,
                 cluster: Optional[Cluster] = None, sync: Optional[NoSync] = None,
                 debug: Optional[DebugConsole] = None, clock: Callable[[], float] = time.monotonic,
                 first_attempt: int = 0, started: Optional[Started] = None):
        self.group = group
        self.job = job
        self.policy = policy
        self.emit = emit
        self.sync = sync or NoSync()
        self.debug = debug
        self.clock = clock
        self.decide = Restarts(policy, emit)
        self.state = RunState()
        self.outside = OutsideRequests(self.state, policy, group, emit, job, cluster or ClusterHooks(), debug,
                                       self._stop, self._idle_event)
        self.attempt_no = first_attempt  # every (re)start, also cluster-directed ones: TORCHELASTIC_RESTART_COUNT
        self._restart_note: Optional[str] = None  # said once the restart's specs (and plan) are known
        self._unclean = True  # processes outside the last attempt's control may hold devices (or no attempt yet)
        self.preflight = Preflight(job, policy, emit, clock, self._wait_quietly)
        self._handlers = self._table()
        if started is not None and started.attempt != first_attempt:
            raise ValueError(f"attempt {started.attempt} was started, but the first attempt is {first_attempt}")
        self._started = started

    @property
    def restarts(self) -> int:
        """Restarts after failures so far (the ``--max-restarts`` budget spent)."""
        return self.decide.count

    @property
    def failures(self) -> List[Failure]:
        """Every rank failure so far, in order."""
        return self.state.failures

    def _table(self) -> Dict[tuple, Handler]:
        """The loop's dispatch table: (phase, event type) -> handler(context, event). The context is
        the attempt (RUNNING), the stop (STOPPING) or None (IDLE); a pair not listed is ignored."""
        out = self.outside
        return {
            (Phase.RUNNING, RankExited): self._on_exit,
            (Phase.RUNNING, SignalReceived): self._on_signal_running,
            (Phase.RUNNING, ControlRequest): out.on_request,
            (Phase.RUNNING, ClusterUpdate): out.on_cluster,
            (Phase.RUNNING, PeerUpdate): out.on_peer,
            (Phase.RUNNING, RankHung): out.on_hung,
            (Phase.STOPPING, RankExited): self._on_exit_stopping,
            (Phase.STOPPING, SignalReceived): self._on_signal_stopping,
            (Phase.STOPPING, ControlRequest): lambda stop, event: out.on_request(None, event),
            (Phase.STOPPING, ClusterUpdate): lambda stop, event: out.on_cluster(None, event),
            (Phase.STOPPING, type(None)): self._on_deadline,
            (Phase.IDLE, SignalReceived): self._on_signal_idle,
            (Phase.IDLE, ControlRequest): out.on_request,
            (Phase.IDLE, ClusterUpdate): out.on_cluster,
        }

    def _dispatch(self, phase: Phase, context: object, event: Optional[Event]) -> None:
        handler = self._handlers.get((phase, type(event)))
        if handler is not None:
            handler(context, event)

    @property
    def _final(self) -> Optional[str]:
        return self.state.final

    def run(self) -> RunResult:
        """Run attempts until the job ends; returns how it ended."""
        failed_ranks, attempts, attempt = (), 0, None
        while self._final is None and self.outside.wait_for_cluster():
            if self._started is None:
                unfit = self.preflight.unfit(self.attempt_no, attempts, self.failures)
                if unfit is not None:
                    return self._finish(unfit)
                if not self.preflight.devices_free(self.attempt_no, self._unclean):
                    break
            attempt = self._run_attempt(self.attempt_no, failed_ranks)
            attempts += 1
            if self._final is not None:
                break
            result = self.decide.verdict(attempt, attempts, self.failures, self.job.progress(attempt.number),
                                         self._failure_texts(attempt))
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
        return self._finish(self._final_result(attempts, attempt))

    def _failure_texts(self, attempt: _Attempt) -> Dict[int, str]:
        """What each local rank that exited non-zero wrote last (the failing rank first), for the
        policy's failure classes; empty when no local rank failed."""
        failure = attempt.failure
        if failure is None or failure.rank not in attempt.workers:
            return {}
        ranks = [failure.rank] + sorted(w.rank for w in attempt.workers.values()
                                        if w.exit is not None and w.exit.returncode and w.rank != failure.rank)
        return {rank: self.job.failure_text(attempt.number, rank) for rank in ranks}

    def _restart(self, attempt: _Attempt, membership: bool) -> None:
        self.attempt_no += 1
        restart = self.decide.restart(attempt, self.attempt_no, membership)
        self._restart_note = restart.note
        if restart.delay:
            self._wait_quietly(restart.delay)

    def _final_result(self, attempts: int, attempt: Optional[_Attempt]) -> RunResult:
        failures = tuple(self.failures)
        if self._final == "cluster-timeout":
            return RunResult(1, "cluster-timeout", attempts, failures)
        if self._final == "graceful-exit":
            code = attempt.failure.info.exit_code if attempt and attempt.failure else 0
            return RunResult(code, "graceful-exit", attempts, failures)
        signum = self.state.signal or signal.SIGTERM
        return RunResult(128 + signum, self._final, attempts, failures, signum)

    def _finish(self, result: RunResult) -> RunResult:
        self.sync.leave(self.attempt_no, result)
        self.emit("job_end", reason=result.reason, exit_code=result.exit_code, attempts=result.attempts)
        for waiter in self.state.waiters:
            waiter.reply({"ok": True, "done": True, "reason": result.reason, "exit_code": result.exit_code},
                         final=True)
        self.state.waiters.clear()
        return result

    # -- one attempt --------------------------------------------------------------------------
    def _run_attempt(self, number: int, failed_before) -> _Attempt:
        started, self._started = self._started, None
        specs = started.specs if started is not None else self.job.specs_for(number, failed_before)
        if self._restart_note is not None:
            note = self.job.resume_note(number)
            log.info("%s%s", self._restart_note, f"; {note}" if note else "")
            self._restart_note = None
        workers = {s.rank: Worker(s.rank, s.label, on_change=self._changed(number)) for s in specs}
        attempt = _Attempt(number, workers)
        clock_start = self.clock()
        if started is None:
            started = start_attempt(self.group, specs, number, self.emit)
        for worker in workers.values():
            worker.transition(WorkerState.RUNNING)
        self.job.spawned(number, started.pids)
        self.sync.attempt_started(number)
        while not attempt.finished:
            self._dispatch(Phase.RUNNING, attempt, self.group.wait_event(None))
        leftovers = self.group.ensure_gone(KILL_SETTLE_SECONDS)
        escaped = self.group.take_escaped()
        report_escaped(self.emit, escaped, attempt=number)
        self._unclean = bool(leftovers or escaped)
        if leftovers:
            log.warning("process groups %s survived SIGKILL (uninterruptible sleep?)", leftovers)
            self.emit("leftover_processes", attempt=number, pgids=leftovers)
        attempt.duration = self.clock() - clock_start
        self.emit("attempt_end", attempt=number, failed=attempt.failure is not None)
        return attempt

    # -- RUNNING: the attempt's ranks run -----------------------------------------------------
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
        failure = Failure(attempt.number, worker.rank, worker.label, event.info, self.job.log_path(worker.rank),
                          attempt.hung.get(worker.rank, ()))
        self.failures.append(failure)
        if self._restart_in_place(attempt, worker, failure):
            return
        attempt.failed_ranks.append(worker.rank)
        attempt.failure = failure
        self.sync.rank_failed(attempt.number, attempt.failed_ranks, failure)  # before the others stop
        log.warning("%s failed (%s); stopping the other local ranks", worker.label, event.info.describe())
        if self.policy.strategy.dump:
            self.outside.gasp(attempt, f"{worker.label} failed", final=False)
        else:
            self._stop(attempt, signal.SIGTERM, self.policy.stop_timeout, f"{worker.label} failed")

    def _restart_in_place(self, attempt: _Attempt, worker: Worker, failure: Failure) -> bool:
        """recover-in-place: respawn only ``worker``'s rank while the others keep running."""
        if self._final is not None or not self.decide.in_place():
            return False
        self.attempt_no += 1
        spec = next(s for s in self.job.specs_for(self.attempt_no, [worker.rank]) if s.rank == worker.rank)
        self.emit("restart", attempt=self.attempt_no, after_rank=worker.rank, scope="rank",
                  restarts_left=self.decide.left)
        log.warning("%s failed (%s); restarting it in place (restart %d of %d)", worker.label,
                    failure.info.describe(), self.decide.count, self.policy.max_restarts)
        self.group.respawn(spec, self.attempt_no)
        fresh = Worker(spec.rank, spec.label, on_change=self._changed(self.attempt_no))
        fresh.transition(WorkerState.RUNNING)
        attempt.workers[spec.rank] = fresh
        self.emit("rank_spawned", attempt=self.attempt_no, rank=spec.rank, pid=self.group.pids().get(spec.rank))
        return True

    def _on_signal_running(self, attempt: _Attempt, event: SignalReceived) -> None:
        if self._to_debugger(event.signum):
            return
        self._on_signal(event.signum)
        if event.signum in GASP_TRIGGERS:
            self.outside.gasp(attempt, f"signal {signal.Signals(event.signum).name}")
            return
        log.info("Ctrl-C: stopping the ranks (up to %.0f s to save and exit); Ctrl-C again to kill "
                 "them now", self.policy.grace_period)
        self.state.final = "signal"
        self._stop(attempt, event.signum, self.policy.grace_period, "launcher signalled")

    def _to_debugger(self, signum: int) -> bool:
        """Ctrl-C while a rank holds the terminal: it goes to that rank (pdb breaks), not to the job."""
        return (signum == signal.SIGINT and self.debug is not None
                and self.debug.interrupt(self.group.pids(), self.group.signal_main))

    def _on_signal(self, signum: int) -> None:
        self.emit("signal_received", signal=signal.Signals(signum).name)
        if self.state.signal is None:
            self.state.signal = signum

    # -- STOPPING: the launcher stops the attempt's ranks ---------------------------------------
    def _stop(self, attempt: _Attempt, signum: int, timeout: float, reason: str) -> None:
        """Signal every running rank's main process once, then SIGKILL its group at the deadline."""
        stop = self._begin_stop(attempt, signum, timeout, reason)
        while stop is not None and not stop.over:
            if stop.late and all(w.done for w in stop.attempt.workers.values() if w.rank >= 0):
                self.emit("kill_group", attempt=attempt.number, ranks=[w.rank for w in stop.late],
                          reason="workers gone")
                self.group.kill_groups([w.rank for w in stop.late])
                stop.late = []
            self._dispatch(Phase.STOPPING, stop, self.group.wait_event(stop.wait()))

    def _begin_stop(self, attempt: _Attempt, signum: int, timeout: float, reason: str) -> Optional[_Stopping]:
        stopping = [w for w in attempt.workers.values() if not w.done]
        if not stopping:
            return None
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
        return _Stopping(attempt, stopping, signum, late, spared, time.monotonic() + timeout)

    def _on_deadline(self, stop: _Stopping, event: None) -> None:
        if stop.killed:  # SIGKILL sent and still not reaped (uninterruptible sleep?)
            self._abandon(stop.attempt, [w for w in stop.workers if w.state is WorkerState.STOPPING])
            return
        stop.killed, stop.deadline = True, time.monotonic() + KILL_SETTLE_SECONDS
        self._kill(stop.attempt, stop.left())

    def _on_exit_stopping(self, stop: _Stopping, event: RankExited) -> None:
        worker = stop.attempt.workers.get(event.rank)
        if worker is not None and worker.state is WorkerState.STOPPING:
            worker.exit = event.info
            worker.transition(WorkerState.STOPPED)

    def _on_signal_stopping(self, stop: _Stopping, event: SignalReceived) -> None:
        """Never a second signal to a rank that is saving; a second Ctrl-C means "now"."""
        if stop.spared and self._to_debugger(event.signum):
            return
        if stop.spared and event.signum == signal.SIGINT:  # Ctrl-C twice: kill the debugged rank too
            self._on_signal(event.signum)
            stop.spared, stop.deadline = set(), time.monotonic()
            return
        first = self.state.signal is None
        self._on_signal(event.signum)
        self.state.final = self._final or ("gasp" if event.signum in GASP_TRIGGERS else "signal")
        if event.signum == signal.SIGINT and self.state.signal == signal.SIGINT and not stop.killed:
            if first:
                log.info("Ctrl-C: no restart; Ctrl-C again to kill the ranks now")
            else:
                log.warning("Ctrl-C again: killing the ranks now")
                stop.deadline = time.monotonic()

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

    # -- IDLE: no ranks run -------------------------------------------------------------------
    def _wait_quietly(self, seconds: float) -> bool:
        """Wait ``seconds`` (backoff, barrier), honouring stop signals and requests; False once the run ends."""
        deadline = self.clock() + seconds
        while self._final is None and self.clock() < deadline:
            self._idle_event(self.group.wait_event(deadline - self.clock()))
        return self._final is None

    def _idle_event(self, event: Optional[Event]) -> None:
        """An event while no ranks run (backoff, cluster hold)."""
        self._dispatch(Phase.IDLE, None, event)

    def _on_signal_idle(self, context: None, event: SignalReceived) -> None:
        """A stop signal while no ranks run ends the run."""
        self._on_signal(event.signum)
        self.state.final = "gasp" if event.signum in GASP_TRIGGERS else "signal"

    def _changed(self, number: int) -> Callable[[Worker, WorkerState], None]:
        def on_change(worker: Worker, old: WorkerState) -> None:
            if worker.done and worker.exit is not None:
                self.emit("rank_exited", attempt=number, rank=worker.rank, state=worker.state.value,
                          returncode=worker.exit.returncode, exit_code=worker.exit.exit_code,
                          signal=worker.exit.signal_name, exited_at=worker.exit.wall_time)
        return on_change
