"""The process-group interface: what the supervisor (policy) needs from the processes of an attempt.

:class:`launcher.supervision.procgroup.LocalProcessGroup` is the mechanism behind it (spawning,
signalling, reaping, output); the supervisor's tests script it.
"""

import abc
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from launcher.common.records import record
from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.jobtree import Stray
from launcher.supervision.loopevents import Event


class ProcessGroup(abc.ABC):
    """What the supervisor needs from the processes of an attempt."""

    @abc.abstractmethod
    def start(self, specs: Sequence[WorkerSpec], attempt: int) -> None:
        """Spawn every spec (each in its own session)."""

    @abc.abstractmethod
    def wait_event(self, timeout: Optional[float]) -> Optional[Event]:
        """The next event, or None when ``timeout`` seconds pass without one."""

    @abc.abstractmethod
    def signal_main(self, ranks: Iterable[int], signum: int) -> None:
        """Send ``signum`` to the main process of each rank still running (not its children)."""

    @abc.abstractmethod
    def kill_groups(self, ranks: Optional[Iterable[int]] = None) -> None:
        """SIGKILL the whole process group of each rank (all of this attempt's when None)."""

    @abc.abstractmethod
    def ensure_gone(self, timeout: float) -> List[int]:
        """Kill and reap every process of the attempt; returns pgids still present at the timeout."""

    def take_escaped(self) -> List[Stray]:
        """Processes outside the ranks' groups killed since the last call (by ``ensure_gone``, ``respawn``)."""
        return []

    @abc.abstractmethod
    def pids(self) -> Dict[int, int]:
        """Rank -> pid of its main process, for ranks still running."""

    @abc.abstractmethod
    def respawn(self, spec: WorkerSpec, attempt: int) -> None:
        """Replace one rank of the running attempt: its old process group is gone first."""


@record(frozen=True)
class Started:
    """An attempt whose ranks were started (:func:`start_attempt`).

    Attributes:
        attempt: Its number.
        specs: Its ranks.
        pids: Rank -> pid of each rank's main process, right after the spawns.
    """

    attempt: int
    specs: Tuple[WorkerSpec, ...]
    pids: Dict[int, int]


def start_attempt(group: ProcessGroup, specs: Sequence[WorkerSpec], attempt: int,
                  emit: Callable[..., object]) -> Started:
    """Start ``attempt``'s ranks through ``group`` and record it: ``attempt_start`` before the spawns,
    ``rank_spawned`` for each rank after them. The supervisor starts every attempt so, and the session
    the first one before the supervisor exists, where nothing has to come before its ranks."""
    emit("attempt_start", attempt=attempt, ranks=[s.rank for s in specs])
    group.start(specs, attempt)
    pids = group.pids()
    for spec in specs:
        emit("rank_spawned", attempt=attempt, rank=spec.rank, pid=pids.get(spec.rank))
    return Started(attempt, tuple(specs), pids)
