"""Worker states and the one place their transitions happen."""

import enum
import signal
from dataclasses import field
from typing import Callable, Dict, FrozenSet, Optional

from launcher.common.records import record


class WorkerState(enum.Enum):
    """Life of one rank within one attempt."""

    PENDING = "pending"      # spec built, not spawned yet
    RUNNING = "running"
    STOPPING = "stopping"    # the launcher asked it to stop (signal sent)
    SUCCEEDED = "succeeded"  # exited 0 on its own
    FAILED = "failed"        # exited non-zero or by a signal on its own
    STOPPED = "stopped"      # exited after the launcher asked it to stop


_ALLOWED: Dict[WorkerState, FrozenSet[WorkerState]] = {
    WorkerState.PENDING: frozenset({WorkerState.RUNNING, WorkerState.FAILED}),
    WorkerState.RUNNING: frozenset({WorkerState.STOPPING, WorkerState.SUCCEEDED, WorkerState.FAILED}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
    WorkerState.SUCCEEDED: frozenset(),
    WorkerState.FAILED: frozenset(),
    WorkerState.STOPPED: frozenset(),
}

TERMINAL = frozenset({WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED})


@record(frozen=True)
class ExitInfo:
    """How a process ended.

    Attributes:
        returncode: ``os.waitstatus_to_exitcode`` value: the exit code, or ``-signum``.
        wall_time: ``time.time()`` when the launcher reaped it.
    """

    returncode: int
    wall_time: float

    @property
    def exit_code(self) -> int:
        """Shell convention: the code, or 128+signal for a signal."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    @property
    def signal_name(self) -> Optional[str]:
        """Name of the killing signal, or None for a normal exit."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exit code 1`` or ``killed by SIGKILL``."""
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"


class InvalidTransition(RuntimeError):
    """A state change the lifecycle does not allow (a launcher bug, not a user error)."""


@record
class Worker:
    """One rank's record within an attempt: its state, and how it ended."""

    rank: int
    label: str
    state: WorkerState = WorkerState.PENDING
    exit: Optional[ExitInfo] = None
    on_change: Optional[Callable[["Worker", WorkerState], None]] = field(default=None, repr=False)

    def transition(self, new: WorkerState) -> None:
        """Move to ``new``, checking the lifecycle and notifying ``on_change``.

        Raises:
            InvalidTransition: ``new`` is not reachable from the current state.
        """
        if new not in _ALLOWED[self.state]:
            raise InvalidTransition(f"{self.label}: {self.state.value} -> {new.value}")
        old, self.state = self.state, new
        if self.on_change is not None:
            self.on_change(self, old)

    @property
    def done(self) -> bool:
        """True once the worker's process has ended."""
        return self.state in TERMINAL
