"""What the supervisor does when asked from outside its ranks, whatever it is doing.

Control requests (``launcher prestop``'s gasp, ``exit``, ``status``, the debug console), the dying
gasp they and SIGTERM trigger, reset.json changes with the cluster's hold on restarts, and another
node's failure (``--sync-dir``). The supervisor (``launcher.supervision.supervisor``) routes these
events here from its dispatch table; what both sides change is one explicit :class:`RunState`, and
ranks are stopped through the ``stop`` callable the supervisor passes in.
"""

import logging
import signal
import time
from dataclasses import field
from typing import Callable, List, Optional

from launcher.common.records import record
from launcher.supervision.debugging import DEBUG_REQUEST, DebugConsole
from launcher.supervision.hooks import Cluster, Job
from launcher.supervision.loopevents import ClusterUpdate, ControlRequest, Event, RankHung
from launcher.supervision.procgroup import ProcessGroup
from launcher.supervision.states import WorkerState
from launcher.supervision.policy import Attempt as _Attempt, Failure, PeerUpdate, RestartPolicy

log = logging.getLogger(__name__)

#: ``stop(attempt, signum, timeout, reason)``: stop the attempt's running ranks (the supervisor's).
Stop = Callable[[_Attempt, int, float, str], None]


@record
class RunState:
    """What the supervisor and these handlers both change while a run lasts.

    Attributes:
        final: Why the run ends, once no more restarts may happen: ``signal``, ``gasp``,
            ``graceful-exit`` or ``cluster-timeout``; None while it goes on.
        signal: The first stop signal received.
        awaiting_recovery: Stopped for a fault: restart when the cluster says so.
        waiters: prestop / exit clients answered when the job ends.
        failures: Every rank failure, in order (local, and other nodes' with ``--sync-dir``).
    """

    final: Optional[str] = None
    signal: Optional[int] = None
    awaiting_recovery: bool = False
    waiters: List[ControlRequest] = field(default_factory=list)
    failures: List[Failure] = field(default_factory=list)


class OutsideRequests:
    """The supervisor's handlers for requests and news from outside its ranks.

    Args:
        state: The run's shared state.
        policy: The stop timeouts and the gasp signal.
        group: The process group (to kill a hung rank, and to wait while the cluster holds).
        emit: ``emit(event_name, **fields)``.
        job: For the ``status`` answer.
        cluster: The reset.json hold and the graceful-exit request.
        debug: The debug console, or None.
        stop: Stops an attempt's ranks (the supervisor's stop with its deadline).
        idle: Handles one event (or None: a timeout) while no ranks run.
    """

    def __init__(self, state: RunState, policy: RestartPolicy, group: ProcessGroup, emit: Callable[..., object],
                 job: Job, cluster: Cluster, debug: Optional[DebugConsole], stop: Stop,
                 idle: Callable[[Optional[Event]], None]):
        self.state, self.policy, self.group, self.emit = state, policy, group, emit
        self.job, self.cluster, self.debug = job, cluster, debug
        self._stop, self._idle_event = stop, idle

    def on_peer(self, attempt: _Attempt, event: PeerUpdate) -> None:
        """Another node failed or ended the job (--sync-dir): stop the local ranks so that they save."""
        if event.generation != attempt.number or attempt.failure or self.state.final or attempt.finished:
            return
        if event.membership:  # nothing failed: the ranks stop for a new world size
            attempt.membership = event.reason
            log.warning("%s: membership change, not counted against --max-restarts; stopping the local ranks "
                        "(%s, up to %.0f s to save)", event.reason, signal.Signals(self.policy.gasp_signal).name,
                        self.policy.stop_timeout)
            self._stop(attempt, self.policy.gasp_signal, self.policy.stop_timeout, event.reason)
            return
        attempt.failure = event.failure
        self.state.failures.append(event.failure)
        log.warning("%s; stopping the local ranks (%s, up to %.0f s to save)", event.reason,
                    signal.Signals(self.policy.gasp_signal).name, self.policy.stop_timeout)
        self._stop(attempt, self.policy.gasp_signal, self.policy.stop_timeout, event.reason)

    def on_hung(self, attempt: _Attempt, event: RankHung) -> None:
        """A rank judged hung: SIGKILL its process group, so that it fails like a crash (and the
        failure path stops the others, restarts within the budget, plans the rank as faulty)."""
        worker = attempt.workers.get(event.rank)
        if worker is None or worker.state is not WorkerState.RUNNING or self.state.final or attempt.failure:
            return
        attempt.hung[event.rank] = (event.reason, *event.diagnosis)
        log.warning("%s is hung (%s); killing it", worker.label, event.reason)
        self.group.kill_groups([event.rank])

    def on_cluster(self, attempt: Optional[_Attempt], event: ClusterUpdate) -> None:
        """reset.json: graceful exit, local faults, a retry: stop this attempt for the cluster."""
        change = event.change
        self.emit("cluster_update", newly_faulty_local=sorted(change.newly_faulty_local),
                  recovered_all=change.recovered_all, retry_bumped=change.retry_bumped,
                  graceful_exit=change.graceful_exit_requested, hold=change.hold)
        if change.graceful_exit_requested and self.state.final is None:
            self.state.final = "graceful-exit"
            self.cluster.request_exit()
            log.info("reset.json asks for a graceful exit: ranks stop at their next step boundary")
            return
        if change.restart:
            self.state.awaiting_recovery = False
        reason = "fault" if change.newly_faulty_local else "retry" if change.retry_bumped else None
        if reason is None or attempt is None or attempt.finished:
            return
        attempt.cluster_stop = reason
        self.state.awaiting_recovery = reason == "fault"
        what = (f"rank(s) {sorted(change.newly_faulty_local)} reported faulty" if reason == "fault"
                else "RetryTime increased")
        log.warning("reset.json: %s; stopping the local ranks until the cluster says to restart", what)
        self._stop(attempt, signal.SIGTERM, self.policy.stop_timeout, f"reset.json: {what}")

    def _hold_reason(self) -> Optional[str]:
        if self.state.awaiting_recovery:
            return "reset.json: waiting until every rank is recovered or RetryTime increases"
        return self.cluster.hold()

    def wait_for_cluster(self) -> bool:
        """Before a (re)start: wait while the cluster forbids it; False when the run must end."""
        reason = self._hold_reason()
        if reason is None:
            return True
        self.emit("cluster_hold", reason=reason, timeout=self.policy.hold_timeout)
        log.info("waiting before starting the ranks: %s (up to %.0f s)", reason, self.policy.hold_timeout)
        deadline = time.monotonic() + self.policy.hold_timeout
        while reason is not None and self.state.final is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.error("the cluster did not allow a restart within %.0f s: %s", self.policy.hold_timeout, reason)
                self.state.final = "cluster-timeout"
                return False
            self._idle_event(self.group.wait_event(remaining))
            reason = self._hold_reason()
        self.emit("cluster_hold_end", waited_for=reason is None)
        return self.state.final is None

    def on_request(self, attempt: Optional[_Attempt], request: ControlRequest) -> None:
        """prestop (``gasp``), ``exit``, ``status`` and debug-console requests, whatever the supervisor is doing."""
        self.emit("control_request", command=request.command)
        answer = {"status": self._status, "gasp": self._prestop, "exit": self._exit}.get(request.command)
        if request.command == DEBUG_REQUEST and self.debug is not None:
            answer = self._debug_request
        if answer is None:
            request.reply({"ok": False, "error": f"unknown request {request.command!r}"}, final=True)
            return
        answer(attempt, request)

    def _status(self, attempt: Optional[_Attempt], request: ControlRequest) -> None:
        workers = attempt.workers.values() if attempt else ()
        request.reply({"ok": True, "attempt": attempt.number if attempt else None, "final": self.state.final,
                       "ranks": {w.rank: w.state.value for w in workers}, **self.job.status()}, final=True)

    def _prestop(self, attempt: Optional[_Attempt], request: ControlRequest) -> None:
        request.reply({"ok": True, "accepted": True})  # at once: prestop's proof of a live loop
        self.state.waiters.append(request)
        if self.state.final is None and attempt is not None:
            self.gasp(attempt, "prestop")
        else:
            self.state.final = self.state.final or "gasp"

    def _exit(self, attempt: Optional[_Attempt], request: ControlRequest) -> None:
        request.reply({"ok": True, "accepted": True})
        self.state.waiters.append(request)
        if self.state.final is None:
            self.state.final = "graceful-exit"
            self.cluster.request_exit()
            self.emit("graceful_exit_requested")
            log.info("graceful exit requested: ranks stop at their next step boundary; no restarts")

    def _debug_request(self, attempt: Optional[_Attempt], request: ControlRequest) -> None:
        request.reply(self.debug.request(request.args, attempt.number if attempt else None,
                                         bool(attempt and attempt.failure)), final=True)

    def gasp(self, attempt: _Attempt, source: str, final: bool = True) -> None:
        """The dying gasp: one save signal to each rank's main process, wait, SIGKILL what is left.

        ``final=False`` is the ``dump`` strategy after a rank failure: the healthy ranks save, and the
        restart policy decides what comes next.
        """
        if final:
            self.state.final = "gasp"
        save = self.policy.gasp_allowed()
        signum = self.policy.gasp_signal if save else signal.SIGKILL
        self.emit("gasp", source=source, save=save, signal=signal.Signals(signum).name,
                  timeout=self.policy.grace_period)
        if save:
            log.info("dying gasp (%s): %s to every rank, up to %.0f s to save", source,
                     signal.Signals(signum).name, self.policy.grace_period)
        else:
            log.warning("dying gasp (%s) within --gasp-min-interval of the previous one: "
                        "stopping the ranks without the save signal", source)
        self._stop(attempt, signum, self.policy.grace_period if save else 0.0, f"dying gasp ({source})")
        ranks = attempt.exit_report()
        self.emit("gasp_done", ranks=ranks)
        for waiter in self.state.waiters:
            waiter.reply({"ok": True, "gasp": ranks})
