"""The restart policy's decisions and what they count: the one place that says restart, wait or stop.

:class:`RestartPolicy` (``launcher.supervision.policy``) is the configuration; :class:`Restarts` is
its state across a run: the ``--max-restarts`` budget, the streak of quick failures behind the
backoff, the restarts without step progress. The supervisor's loop asks it after every attempt
(:meth:`Restarts.verdict`, then :meth:`Restarts.restart`) and before a recover-in-place respawn
(:meth:`Restarts.in_place`); the decision's event is emitted here, the loop only acts on it.
"""

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from launcher.supervision.policy import Attempt, Failure, NoProgress, RestartPolicy, RunResult

log = logging.getLogger(__name__)

Emit = Callable[..., object]


@dataclass(frozen=True)
class Restart:
    """How the next attempt starts.

    Attributes:
        note: The restart line (said once the restart's specs and plan are known).
        delay: Seconds to wait first (the backoff).
    """

    note: str
    delay: float = 0.0


class Restarts:
    """The restart policy, stateful: what is spent and what comes next.

    Args:
        policy: The configuration.
        emit: ``emit(event_name, **fields)`` for events.jsonl.
    """

    def __init__(self, policy: RestartPolicy, emit: Emit):
        self.policy = policy
        self.emit = emit
        self.count = 0  # group and in-place restarts after failures: the --max-restarts budget
        self.quick_failures = 0  # attempts in a row that failed before policy.healthy_seconds
        self.no_progress = NoProgress(policy.max_no_progress_restarts)

    @property
    def left(self) -> int:
        """Restarts left in the budget."""
        return self.policy.max_restarts - self.count

    def verdict(self, attempt: Attempt, attempts: int, failures: Sequence[Failure],
                step: Optional[int]) -> Optional[RunResult]:
        """How the run ends after ``attempt`` (``step``: the highest it reached), as far as this node
        can tell; None to restart."""
        failure = attempt.failure
        if attempt.cluster_stop is not None or (failure is None and attempt.membership is not None):
            return None
        if failure is None:
            return RunResult(0, "succeeded", attempts, tuple(failures))
        end = self._exit_for_reschedule(failure) or self._stuck(attempt, step) or self._spent(attempts)
        return RunResult(failure.info.exit_code, end, attempts, tuple(failures)) if end else None

    def _exit_for_reschedule(self, failure: Failure) -> Optional[str]:
        strategy = self.policy.strategy
        if not strategy.exit_on_failure:
            return None
        self.emit("exit_for_reschedule", strategy=strategy.describe(), exit_code=failure.info.exit_code)
        log.warning("recovery strategy %s: exiting for rescheduling", strategy.describe())
        return "failed"

    def _stuck(self, attempt: Attempt, step: Optional[int]) -> Optional[str]:
        stuck = self.no_progress
        if not stuck.stuck_after(step):
            return None
        self.emit("no_progress", attempt=attempt.number, step=stuck.best, restarts=stuck.stalled)
        log.error("%d restart(s) in a row got no further than step %s: ending the job (a crash loop; "
                  "--max-no-progress-restarts)", stuck.stalled, stuck.best)
        return "no-progress"

    def _spent(self, attempts: int) -> Optional[str]:
        if self.left > 0:
            return None
        self.emit("restart_budget_spent", attempts=attempts, restarts=self.count,
                  max_restarts=self.policy.max_restarts)
        return "failed"

    def restart(self, attempt: Attempt, number: int, membership: bool) -> Restart:
        """Count the restart into attempt ``number`` after ``attempt``; outside the budget:
        cluster-directed ones and a membership change (the coordinator's word: no rank failed, no node
        lost, launchers joined)."""
        if attempt.cluster_stop is not None:
            self.emit("restart", attempt=number, scope="cluster", reason=attempt.cluster_stop)
            return Restart(f"restarting as the cluster asks ({attempt.cluster_stop})")
        if membership:
            reason = attempt.membership or "launchers joined"
            self.emit("restart", attempt=number, scope="membership", reason=reason, counted=False,
                      restarts_left=self.left)
            return Restart(f"restarting for a membership change, not counted ({reason})")
        self.count += 1
        failure = attempt.failure
        # No failure of its own: it saw only a join, but another node's rank failed in the generation.
        cause = "a failure on another node" if failure is None else f"{failure.label} failed " \
            f"({'hung: ' + failure.hang[0] if failure.hang else failure.info.describe()})"
        healthy = attempt.duration >= self.policy.healthy_seconds
        self.quick_failures = 0 if healthy else self.quick_failures + 1
        delay = self.policy.restart_delay(self.quick_failures)
        self.emit("restart", attempt=number, after_rank=failure.rank if failure else None, scope="group",
                  backoff=delay, ran_for=round(attempt.duration, 3), quick_failures=self.quick_failures,
                  restarts_left=self.left)
        if delay:
            log.info("%d quick failure(s) in a row: restarting in %.1f s", self.quick_failures, delay)
        return Restart(f"restarting (restart {self.count} of {self.policy.max_restarts}) after {cause}", delay)

    def in_place(self) -> bool:
        """recover-in-place: whether a failed rank restarts alone (counted when it does)."""
        if not self.policy.strategy.in_place:
            return False
        if not self.policy.in_place_supported:
            log.info("recover-in-place: the framework cannot re-join a running group; restarting the group")
            return False
        if self.left <= 0:
            return False
        self.count += 1
        return True
