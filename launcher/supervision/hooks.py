"""What the supervisor asks of the job and of the cluster: two small interfaces, with defaults.

The restart loop (``launcher.supervision.supervisor``) sees the process group (mechanism), the restart
policy (decisions), and these: the :class:`Job` builds each attempt's ranks and knows how far they
got; the :class:`Cluster` may hold restarts and relays a graceful exit to the ranks. The Session
implements both (``launcher.run.session``); unit tests build them from a few callables with
:class:`JobHooks` and :class:`ClusterHooks`.
"""

from typing import Callable, Dict, List, Optional, Protocol, Sequence

from launcher.common.records import record
from launcher.jobspec.rankenv import WorkerSpec


class Job(Protocol):
    """The job the supervisor runs."""

    def specs_for(self, attempt: int, failed_before: Sequence[int]) -> Sequence[WorkerSpec]:
        """The ranks of ``attempt``; ``failed_before``: the ranks that failed in the previous one."""

    def spawned(self, attempt: int, pids: Dict[int, int]) -> None:
        """The ranks of ``attempt`` run with these pids (the state file)."""

    def log_path(self, rank: int) -> Optional[str]:
        """The log file of ``rank`` in the current attempt, for failure reports."""

    def failure_text(self, attempt: int, rank: int) -> str:
        """The end of what ``rank`` of ``attempt`` wrote before failing (its error file, else its
        log's last lines): what the restart policy classifies a failure by; empty when unknown."""

    def resume_note(self, attempt: int) -> Optional[str]:
        """What the ranks of a restart resume from, for the restart line."""

    def progress(self, attempt: int) -> Optional[int]:
        """The highest heartbeat step the ranks of ``attempt`` reached (None: unknown or no step)."""

    def status(self) -> dict:
        """Merged into the control socket's ``status`` answer."""

    def busy_devices(self, here: bool) -> Dict[int, List[str]]:
        """This node's devices that other processes hold -> who holds them (empty: all free);
        ``here``: also look for this container's processes (else only the node's device tool)."""

    def health(self) -> Optional[str]:
        """Before an attempt: why this node is unfit to run it (``--health-check``), or None."""


class Cluster(Protocol):
    """The cluster above this node, as far as restarts go (reset.json)."""

    def hold(self) -> Optional[str]:
        """Why the ranks may not (re)start right now, or None."""

    def request_exit(self) -> None:
        """Ask the ranks to exit at their next step boundary (the graceful-exit file)."""


def _no_note(attempt: int) -> Optional[str]:
    return None


def _unknown(*args: object) -> None:
    return None


@record
class JobHooks:
    """A :class:`Job` from callables (the defaults know nothing and record nothing)."""

    specs_for: Callable[[int, Sequence[int]], Sequence[WorkerSpec]]
    spawned: Callable[[int, Dict[int, int]], None] = _unknown
    log_path: Callable[[int], Optional[str]] = _unknown
    failure_text: Callable[[int, int], str] = lambda attempt, rank: ""
    resume_note: Callable[[int], Optional[str]] = _no_note
    progress: Callable[[int], Optional[int]] = _unknown
    status: Callable[[], dict] = dict
    busy_devices: Callable[[bool], Dict[int, List[str]]] = lambda here: {}
    health: Callable[[], Optional[str]] = _unknown


@record
class ClusterHooks:
    """A :class:`Cluster` from callables; the default never holds and has no ranks to tell."""

    hold: Callable[[], Optional[str]] = _unknown
    request_exit: Callable[[], None] = _unknown
