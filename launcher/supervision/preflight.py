"""Before each attempt: is the node fit to run it, and are its devices free?

The supervisor asks :class:`Preflight` before spawning an attempt's ranks. What is checked is the
job's (``launcher.supervision.hooks.Job``: the session runs ``--health-check`` and looks for
processes holding the devices); what to do about it is here, bounded by the policy: a failed check
ends this node's part with ``policy.node_fault_exit_code`` (the cluster reschedules it), a held
device is waited for up to ``policy.device_wait_timeout`` (then the ranks start anyway, and if the
device is really taken they fail and the restart policy takes over). The wait runs the supervisor's
idle loop, so stop signals and requests are handled meanwhile.
"""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

from launcher.supervision.policy import Failure, RestartPolicy, RunResult, Wait

log = logging.getLogger(__name__)

#: Seconds between two looks at this node's devices while another process holds one.
DEVICE_POLL_SECONDS = 0.5


class Preflight:
    """The checks before an attempt.

    Args:
        job: Runs the checks (a ``launcher.supervision.hooks.Job``; not imported here, which would
            bring the rank-spec module and psutil to the policy side).
        policy: The node-fault exit code and the device-wait timeout.
        emit: ``emit(event_name, **fields)``.
        clock: The supervisor's monotonic clock.
        wait: The supervisor's idle wait (False once the run must end).
    """

    def __init__(self, job: Any, policy: RestartPolicy, emit: Callable[..., object], clock: Callable[[], float],
                 wait: Wait):
        self.job, self.policy, self.emit, self.clock, self.wait = job, policy, emit, clock, wait

    def unfit(self, attempt: int, attempts: int, failures: Sequence[Failure]) -> Optional[RunResult]:
        """The node's health check before ``attempt``: how the run ends when it fails, else None."""
        why = self.job.health()
        if why is None:
            return None
        code = self.policy.node_fault_exit_code
        self.emit("health_check_failed", attempt=attempt, reason=why, exit_code=code)
        log.error("the node's health check failed before attempt %d (%s): ending this node's part with exit %d, "
                  "for the cluster to reschedule it", attempt, why, code)
        return RunResult(code, "node-fault", attempts, tuple(failures))

    def devices_free(self, attempt: int, unclean: bool) -> bool:
        """Wait (bounded) while other processes hold this node's devices; False when the run ended
        meanwhile. ``unclean``: look for this container's processes too, which is needed only before
        the first attempt and after one that left processes behind (ensure_gone proved the rest gone)."""
        timeout = self.policy.device_wait_timeout
        busy = self.job.busy_devices(unclean) if timeout else {}
        if not busy:
            return True
        started = self.clock()
        holders = {str(d): h for d, h in sorted(busy.items())}
        self.emit("device_wait", attempt=attempt, devices=sorted(busy), holders=holders, timeout=timeout)
        log.info("waiting for device(s) %s, still held by another process (%s), up to %.0f s", _ids(busy),
                 "; ".join(f"{d}: {', '.join(h)}" for d, h in holders.items()), timeout)
        going_on, deadline = True, started + timeout
        while busy and going_on and self.clock() < deadline:
            going_on = self.wait(min(DEVICE_POLL_SECONDS, deadline - self.clock()))
            busy = self.job.busy_devices(True) if going_on else busy
        self.emit("device_wait_end", attempt=attempt, seconds=round(self.clock() - started, 3), free=not busy)
        if busy and going_on:
            log.warning("device(s) %s still held after %.0f s: starting the ranks anyway", _ids(busy), timeout)
        return going_on


def _ids(busy: Dict[int, List[str]]) -> str:
    return ", ".join(map(str, sorted(busy)))
