"""The supervisor's inputs and outputs: restart policy, failures, and how a run ended."""

import signal
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from launcher.recovery import RETRY, RecoveryStrategy
from launcher.states import ExitInfo

#: After SIGKILL, how long to wait for the kernel to report the exits before giving up on them.
KILL_SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class RestartPolicy:
    """The restart budget and the stop timeouts.

    Attributes:
        max_restarts: Restarts allowed after the first attempt.
        backoff: Seconds between a failed attempt and the next.
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
        reason: ``succeeded``, ``failed`` (budget spent), ``signal``, ``gasp`` (dying gasp on
            prestop or SIGTERM), ``graceful-exit`` (``launcher exit``, reset.json) or
            ``cluster-timeout`` (the cluster never let the ranks restart).
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
