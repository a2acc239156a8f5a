"""The restart policy's decisions and what they count: the one place that says restart, wait or stop.

:class:`RestartPolicy` (``launcher.supervision.policy``) is the configuration; :class:`Restarts` is
its state across a run: the ``--max-restarts`` budget, the streak of quick failures behind the
backoff, the restarts without step progress, the transient retries and the last start-up error
(the failure classes of ``launcher.supervision.causes``). The supervisor's loop asks it after every
attempt (:meth:`Restarts.verdict`, then :meth:`Restarts.restart`) and before a recover-in-place
respawn (:meth:`Restarts.in_place`); the decision's event is emitted here, the loop only acts on it.

After a failed attempt, in this order:

1. ``--recover-strategy`` says exit: end (the failing rank's exit code).
2. A transient start-up cause (before the first step): retry after its wait, not counted, at most
   ``MAX_TRANSIENT_RETRIES`` in a row.
3. The same deterministic start-up error as the attempt before: end (``deterministic``).
4. ``--max-no-progress-restarts`` restarts in a row got no further: end (``no-progress``).
5. The budget is spent: end, ``no-progress`` when no restart got past the best step before.
6. Otherwise restart, counted, after the backoff.

Ends 3-5 exit with ``policy.no_progress_exit_code``: the scheduler's cue not to requeue.
"""

import logging
from typing import Callable, Mapping, Optional, Sequence

from launcher.common.records import record
from launcher.supervision.causes import DETERMINISTIC, MAX_TRANSIENT_RETRIES, TRANSIENT, Diagnosis, classify
from launcher.supervision.policy import Attempt, Failure, NoProgress, RestartPolicy, RunResult

log = logging.getLogger(__name__)

Emit = Callable[..., object]


@record(frozen=True)
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
        self.retries = 0  # transient retries in a row
        self._retry: Optional[Diagnosis] = None  # the transient cause the next restart retries
        self._start_error: Optional[str] = None  # the deterministic start-up error of the attempt before

    @property
    def left(self) -> int:
        """Restarts left in the budget."""
        return self.policy.max_restarts - self.count

    def verdict(self, attempt: Attempt, attempts: int, failures: Sequence[Failure], step: Optional[int],
                texts: Mapping[int, str] = {}) -> Optional[RunResult]:
        """How the run ends after ``attempt``, as far as this node can tell; None to restart.

        Args:
            attempt: The attempt that ended.
            attempts: Attempts so far.
            failures: Every failure so far.
            step: The highest heartbeat step its ranks reached (None: unknown, or none).
            texts: Rank -> what it wrote before failing, for each local rank that exited non-zero
                (the failing one first).
        """
        failure = attempt.failure
        self._retry = None
        if attempt.cluster_stop is not None or (failure is None and attempt.membership is not None):
            return None
        if failure is None:
            return RunResult(0, "succeeded", attempts, tuple(failures))
        if self._exit_for_reschedule(failure):
            return RunResult(failure.info.exit_code, "failed", attempts, tuple(failures))
        found = {rank: classify(text) for rank, text in texts.items()} if step is None else {}
        if self._transient(attempt, found.get(failure.rank)):
            return None
        end = self._deterministic(attempt, found) or self._stuck(attempt, step) or self._spent(attempts)
        if end is None:
            return None
        code = failure.info.exit_code if end == "failed" else self.policy.no_progress_exit_code
        return RunResult(code, end, attempts, tuple(failures))

    def _transient(self, attempt: Attempt, found: Optional[Diagnosis]) -> bool:
        """A transient start-up cause of the failing rank: retry it (True) while retries are left."""
        if found is None or found.cause.kind != TRANSIENT:
            self.retries = 0
            return False
        if self.retries >= MAX_TRANSIENT_RETRIES:  # until a different outcome, it counts like any failure
            log.warning("%s failed at start-up again (%s) after %d transient retries in a row: counted "
                        "against --max-restarts", attempt.failure.label, found.cause.what, self.retries)
            return False
        self._retry = found
        return True

    def _deterministic(self, attempt: Attempt, found: Mapping[int, Optional[Diagnosis]]) -> Optional[str]:
        """The same deterministic start-up error as the attempt before, on every rank that showed one."""
        lines = {d.line for d in found.values() if d is not None}
        first = found.get(attempt.failure.rank)
        error = first.line if first is not None and first.cause.kind == DETERMINISTIC and len(lines) == 1 \
            else None
        repeated, self._start_error = error is not None and error == self._start_error, error
        if not repeated:
            return None
        ranks = sorted(rank for rank, d in found.items() if d is not None)
        self.emit("deterministic_failure", attempt=attempt.number, cause=first.cause.name, error=error, ranks=ranks,
                  exit_code=self.policy.no_progress_exit_code)
        log.error("attempts %d and %d failed the same way before their first step (%s: %s, rank(s) %s): "
                  "a restart cannot fix it; ending the job (exit %d)", attempt.number - 1, attempt.number,
                  first.cause.what, error, ", ".join(map(str, ranks)), self.policy.no_progress_exit_code)
        return "deterministic"

    def _exit_for_reschedule(self, failure: Failure) -> bool:
        strategy = self.policy.strategy
        if not strategy.exit_on_failure:
            return False
        self.emit("exit_for_reschedule", strategy=strategy.describe(), exit_code=failure.info.exit_code)
        log.warning("recovery strategy %s: exiting for rescheduling", strategy.describe())
        return True

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
        stuck = self.no_progress
        # Every restart got no further than the best step before: the budget went on one step.
        nowhere = self.count > 0 and stuck.best is not None and stuck.stalled >= self.count
        self.emit("restart_budget_spent", attempts=attempts, restarts=self.count,
                  max_restarts=self.policy.max_restarts, progress=not nowhere)
        if nowhere:
            log.error("the restart budget (%d) is spent and no restart got past step %s", self.count, stuck.best)
        return "no-progress" if nowhere else "failed"

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
        if self._retry is not None:
            return self._retry_transient(attempt, number, self._retry)
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

    def _retry_transient(self, attempt: Attempt, number: int, found: Diagnosis) -> Restart:
        self.retries += 1
        failure, cause = attempt.failure, found.cause
        self.emit("restart", attempt=number, after_rank=failure.rank if failure else None, scope="retry",
                  cause=cause.name, error=found.line, backoff=cause.wait, counted=False, retry=self.retries,
                  max_retries=MAX_TRANSIENT_RETRIES, restarts_left=self.left)
        log.warning("%s failed at start-up: %s (%s); retrying in %.0f s, not counted against --max-restarts "
                    "(transient retry %d of %d)", failure.label if failure else "a rank", cause.what, found.line,
                    cause.wait, self.retries, MAX_TRANSIENT_RETRIES)
        return Restart(f"retrying after a transient start-up failure ({cause.name})", cause.wait)

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
