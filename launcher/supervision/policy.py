"""The supervisor's inputs and outputs: restart policy, failures, and how a run ended."""

import signal
from dataclasses import field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from launcher.common.records import record
from launcher.jobspec.recovery import RETRY, RecoveryStrategy
from launcher.supervision.states import ExitInfo, Worker

#: ``wait(seconds) -> bool``: run the supervisor's event loop; False once the run must end.
Wait = Callable[[float], bool]

#: After SIGKILL, how long to wait for the kernel to report the exits before giving up on them.
KILL_SETTLE_SECONDS = 5.0

#: The launcher's exit status when the job cannot progress (the same start-up failure twice,
#: ``--max-no-progress-restarts``, the budget spent at one step): a scheduler's "do not requeue".
NO_PROGRESS_EXIT_CODE = 93
#: The launcher's exit status when this node failed its health check: reschedule the pod elsewhere.
NODE_FAULT_EXIT_CODE = 94

#: An attempt that ran this long before failing was healthy: the restart after it is immediate and
#: the backoff starts afresh (Kubernetes resets CrashLoopBackOff after 10 minutes; a training job
#: that got through rendezvous and a minute of steps is past its start-up failures).
HEALTHY_SECONDS = 60.0


@record(frozen=True)
class RestartPolicy:
    """The restart budget and the stop timeouts.

    Attributes:
        max_restarts: Restarts allowed after the first attempt.
        backoff: First delay of a streak of quick failures (``restart_delay``); 0 disables backoff.
        stop_timeout: SIGTERM -> SIGKILL delay when stopping the group after a failure.
        grace_period: Signal -> SIGKILL delay when the launcher is asked to stop: the dying-gasp
            timeout (prestop, SIGTERM) and the SIGINT grace.
        gasp_signal: Signal sent to each rank's main process for the dying gasp.
        gasp_allowed: ``() -> bool``: False within ``--gasp-min-interval`` of the previous gasp,
            when the ranks are stopped without the save signal.
        strategy: The recovery strategy (``retry`` by default).
        in_place_supported: Whether the framework lets a restarted rank re-join a running group.
        hold_timeout: Longest wait for the cluster (reset.json FaultFlushing, a local rank in fault,
            recovery after a fault) before giving up with exit 1.
        backoff_max: Cap of the restart delay; 0 disables backoff.
        healthy_seconds: An attempt that ran this long resets the streak of quick failures.
        max_no_progress_restarts: End the job after this many restarts in a row that reached no
            higher heartbeat step than the attempts before (0: off).
        no_progress_exit_code: The exit status when the job ends because it cannot progress.
        device_wait_timeout: Longest wait, before an attempt, while other processes hold this
            node's devices (0: no wait, no look).
        node_fault_exit_code: The exit status when the node's health check fails.
    """

    max_restarts: int = 0
    backoff: float = 0.0
    stop_timeout: float = 10.0
    grace_period: float = 25.0
    gasp_signal: int = signal.SIGTERM
    gasp_allowed: Callable[[], bool] = lambda: True
    strategy: RecoveryStrategy = RecoveryStrategy(frozenset({RETRY}), "default")
    in_place_supported: bool = False
    hold_timeout: float = 600.0
    backoff_max: float = 0.0
    healthy_seconds: float = HEALTHY_SECONDS
    max_no_progress_restarts: int = 0
    no_progress_exit_code: int = NO_PROGRESS_EXIT_CODE
    device_wait_timeout: float = 0.0
    node_fault_exit_code: int = NODE_FAULT_EXIT_CODE

    def restart_delay(self, quick_failures: int) -> float:
        """Seconds to wait before a restart, after ``quick_failures`` attempts in a row that failed
        within ``healthy_seconds`` of their start (0 after a healthy attempt).

        The first restart is immediate (a one-off failure, and the benchmarked restart latency);
        from the second quick failure in a row the delay doubles from ``backoff`` up to ``backoff_max``.
        """
        if quick_failures < 2:
            return 0.0
        return min(self.backoff_max, self.backoff * 2.0 ** min(quick_failures - 2, 64))


@record(frozen=True)
class Failure:
    """A rank that failed on its own (not one the launcher stopped)."""

    attempt: int
    rank: int
    label: str
    info: ExitInfo
    log_path: Optional[str] = None
    hang: Tuple[str, ...] = ()  # killed as hung: why, then where every rank was


@record
class NoProgress:
    """Restarts in a row whose attempt got no further (highest heartbeat step) than the best before.

    Attributes:
        limit: ``--max-no-progress-restarts`` (0: never ends the job).
        best: The highest step any attempt reached (None: none known yet).
        stalled: Restarts in a row without progress.
    """

    limit: int
    best: Optional[int] = None
    stalled: int = 0

    def stuck_after(self, step: Optional[int]) -> bool:
        """Count an ended attempt that reached ``step`` (None: unknown, not counted); True to end the job
        (never without a limit: the count still tells whether a spent budget got anywhere)."""
        if step is None:
            return False
        self.stalled = self.stalled + 1 if self.best is not None and step <= self.best else 0
        self.best = step if self.best is None else max(self.best, step)
        return bool(self.limit) and self.stalled >= self.limit


@record
class Attempt:
    """The supervisor's record of one attempt.

    Attributes:
        number: The attempt number (with ``--sync-dir``, the generation).
        workers: Rank -> its worker.
        failure: The first rank failure (local, or another node's with ``--sync-dir``).
        failed_ranks: Local ranks that failed on their own.
        killed: Ranks SIGKILLed after their stop timeout.
        cluster_stop: ``fault`` or ``retry`` when the cluster (reset.json) stopped the attempt.
        membership: Why, when another node said the attempt ends for a membership change (a launcher
            joins the running job), not a failure.
        hung: Rank -> why and where (``RankHung``), for ranks killed as hung.
        duration: Seconds from its start until its last process was gone.
    """

    number: int
    workers: Dict[int, Worker]
    failure: Optional[Failure] = None
    failed_ranks: List[int] = field(default_factory=list)
    killed: List[int] = field(default_factory=list)
    cluster_stop: Optional[str] = None
    membership: Optional[str] = None
    duration: float = 0.0
    hung: Dict[int, Tuple[str, ...]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Every worker has exited."""
        return all(w.done for w in self.workers.values())

    def exit_report(self) -> List[dict]:
        """One row per rank: how it exited, and whether it was killed after its timeout."""
        rows = []
        for worker in sorted(self.workers.values(), key=lambda w: w.rank):
            info = worker.exit
            rows.append({"rank": worker.rank, "label": worker.label, "killed_after_timeout": worker.rank in self.killed,
                         "returncode": info.returncode if info else None,
                         "exit_code": info.exit_code if info else None,
                         "signal": info.signal_name if info else None})
        return rows


@record(frozen=True)
class RunResult:
    """How the run ended.

    Attributes:
        exit_code: The launcher's exit status.
        reason: ``succeeded``, ``failed`` (budget spent, or the job failed on another node),
            ``signal``, ``gasp`` (dying gasp on prestop or SIGTERM), ``graceful-exit`` (``launcher
            exit``, reset.json), ``cluster-timeout`` (the cluster never let the ranks restart), ``no-progress``
            (``--max-no-progress-restarts`` restarts in a row reached no higher step, or the budget was
            spent without a higher step), ``deterministic`` (two attempts in a row failed before their
            first step with the same error of a deterministic kind: ``launcher.supervision.causes``),
            ``node-fault`` (the node's health check failed before an attempt) or
            ``sync-timeout`` (another node never reached a ``--sync-dir`` barrier).
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


@record(frozen=True)
class PeerUpdate:
    """Event: another node failed or ended the job in ``generation`` (posted to the event loop).

    ``membership``: nothing failed, a launcher joins the running job (``failure`` is its note): the
    ranks stop for a new world size, a restart that does not count against ``--max-restarts``.
    """

    generation: int
    failure: Failure
    reason: str
    membership: bool = False


@record(frozen=True)
class Agreement:
    """What the nodes agreed on after a generation.

    Attributes:
        failed_ranks: Ranks that failed on their own in the generation, on any node.
        exit_code: Set when the job ends on every node, with this exit status; None to go on.
        reason: The ``RunResult`` reason that goes with ``exit_code``.
        membership: The generation ended only because launchers joined (no rank failed, no node was
            lost): the restart is a membership change and not counted against ``--max-restarts``,
            as torchrun's agent does not count a restart for nodes waiting to join.
    """

    failed_ranks: Tuple[int, ...] = ()
    exit_code: Optional[int] = None
    reason: str = ""
    membership: bool = False


class NoSync:
    """How the supervisor coordinates with the other nodes of the job: here, it does not (the
    default, without ``--sync-dir``). ``launcher.cluster.sync.Coordinator`` implements the same hooks."""

    def attempt_started(self, generation: int) -> None:
        """Generation ``generation``'s ranks are running."""

    def rank_failed(self, generation: int, ranks: Sequence[int], failure: Failure) -> None:
        """A local rank failed on its own."""

    def settle(self, generation: int, result: Optional[RunResult], failure: Optional[Failure],
               failed_ranks: Sequence[int], wait: Wait) -> Agreement:
        """After a generation: this node's failed ranks; the node's own verdict stands."""
        return Agreement(tuple(failed_ranks))

    def leave(self, generation: int, result: RunResult, quiet: bool = False) -> None:
        """The run ends with ``result``."""
