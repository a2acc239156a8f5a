"""The supervisor's loop phases, and the record of one stop (``launcher.supervision.supervisor``).

The loop's dispatch table is keyed by the phase the loop is in when an event comes and the event's
type; a stop (signal sent, SIGKILL deadline running) is the STOPPING phase, its state a
:class:`Stopping`.
"""

import enum
import time
from typing import List, Optional, Set

from launcher.common.records import record
from launcher.supervision.policy import Attempt
from launcher.supervision.states import Worker, WorkerState


class Phase(enum.Enum):
    """What the loop is doing when an event comes: the first key of the dispatch table."""

    RUNNING = "running"    # an attempt's ranks run
    STOPPING = "stopping"  # the launcher stops them: signal sent, deadline running
    IDLE = "idle"          # no ranks: backoff, the cluster's hold, a barrier


@record
class Stopping:
    """One stop of an attempt's ranks, while it lasts.

    Attributes:
        attempt: The attempt.
        workers: The ranks being stopped.
        signum: The stop signal.
        late: Auxiliary processes (the MindSpore scheduler, rank < 0): never signalled, their groups killed
            once no worker runs (it ignores SIGTERM and has nothing to save).
        spared: Ranks at a debugger prompt: no deadline for them.
        deadline: Monotonic time of the SIGKILL (or, once killed, of giving up on the exits).
        killed: SIGKILL was sent.
    """

    attempt: Attempt
    workers: List[Worker]
    signum: int
    late: List[Worker]
    spared: Set[int]
    deadline: float
    killed: bool = False

    @property
    def over(self) -> bool:
        """Every rank of the stop has exited (or was given up on)."""
        return not any(w.state is WorkerState.STOPPING for w in self.workers)

    def left(self) -> List[Worker]:
        """Ranks still stopping that the deadline applies to."""
        return [w for w in self.workers if w.state is WorkerState.STOPPING and w.rank not in self.spared]

    def wait(self) -> Optional[float]:
        """How long to wait for the next event: until the deadline; no deadline for a rank at a
        debugger prompt (it ends when the user quits it)."""
        return max(0.0, self.deadline - time.monotonic()) if self.left() or self.killed else None
