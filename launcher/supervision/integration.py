"""What runs beside the ranks for a whole ``launcher run``, behind one small interface.

The control server, the reset.json follower, the cross-node sync coordinator and the TaskD manager
sidecar are each an :class:`Integration`: the Session starts them in order before the first attempt,
passes them every supervisor event (attempt start and end included), and stops them in reverse order
when it ends, whatever happened, so a later one (which may rely on an earlier one) goes first. A new
integration is a subclass in its own module plus one line in ``launcher.run.integrations``.

Besides its hooks, an integration may contribute what the restart loop and the ranks need: a hold on
(re)starts (reset.json), the ranks' progress (heartbeat steps), a section of the control socket's
``status`` answer, variables for every rank (TaskD), the cross-node restart coordinator. The Session
asks :class:`Integrations` for each, never a member by name, and hands the answers to the
supervisor through its small interfaces (``launcher.supervision.hooks``), so the restart loop stays
testable with scripted events. Hooks run inside the supervisor's loop: they return at once and never
block.

May import: only for type checking (``Host``'s attributes), nothing at run time: ``launcher.control``
and ``launcher.cluster`` build on it.
"""

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence

if TYPE_CHECKING:
    from launcher.common.rundir import RunDir
    from launcher.jobspec.rankenv import EnvContext
    from launcher.jobspec.runspec import RunSpec
    from launcher.supervision.guard import OrphanGuard
    from launcher.supervision.procgroup import LocalProcessGroup

log = logging.getLogger(__name__)


class Host(Protocol):
    """What an integration may use of the Session that starts it (``launcher.run.session.Session``).

    Attributes:
        spec: The run's options, parsed and grouped (``restart``, ``hangs``, ``restore``, ``cluster``, ...).
        ctx: The job context; replaced when the rank table is rewritten, so read it when needed rather
            than keeping it.
        group: The process group and event loop.
        guard: The orphan guard.
        run_dir: The run dir.
        log_session: This launcher invocation's log directory.
    """

    spec: "RunSpec"
    ctx: "EnvContext"
    group: "LocalProcessGroup"
    guard: "OrphanGuard"
    run_dir: "RunDir"
    log_session: str

    def emit(self, event: str, **fields: object) -> None:
        """Append an event to events.jsonl (and pass it to every integration)."""


class Integration:
    """Something that runs beside the ranks; every hook is optional (the defaults do nothing)."""

    #: Shown in the launcher's log when the integration fails to stop.
    name = "integration"

    def start(self, host: Host) -> None:
        """Before the first attempt; may raise UsageError for a bad option (nothing is running yet)."""

    def starts_processes(self, host: Host) -> bool:
        """Whether :meth:`start` will start a process that outlives it (a sidecar): the session must
        not be moving into the first attempt's cgroup then, or the process would be born there."""
        return False

    def attempt_started(self, attempt: int) -> None:
        """The ranks of ``attempt`` were spawned."""

    def attempt_ended(self, attempt: int, failed: bool) -> None:
        """Every rank of ``attempt`` is gone; ``failed`` when one of them failed."""

    def on_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """Any event the launcher records (events.jsonl names and fields)."""

    def stop(self) -> None:
        """The run ends (normally or not); release everything started. Called once, if started."""

    # -- what it may contribute (the defaults contribute nothing) ----------------------------------
    def hold(self) -> Optional[str]:
        """Why the ranks may not (re)start right now (the cluster holds them), or None."""
        return None

    def progress(self, attempt: int) -> Optional[int]:
        """The highest training step the ranks of ``attempt`` reached, if this integration knows it."""
        return None

    def status(self) -> Dict[str, Any]:
        """Keys merged into the control socket's ``status`` answer."""
        return {}

    def rank_env(self) -> Dict[str, str]:
        """Variables every rank of the next attempt gets."""
        return {}

    def restart_coordinator(self) -> Optional[Any]:
        """The coordinator the nodes restart together through (``launcher.cluster.sync``), or None."""
        return None

    def coordinates_restarts(self) -> bool:
        """Whether the other nodes learn of this node's restarts through this integration."""
        return False


class Integrations:
    """A Session's integrations: started in order, stopped in reverse, each event passed to each.

    Args:
        members: The integrations, in start order.
    """

    def __init__(self, members: Sequence[Integration]):
        self._members = list(members)
        self._started: List[Integration] = []

    def start(self, host: Host) -> None:
        """Start every member in order; those started before a failure are still stopped by :meth:`stop`."""
        for member in self._members:
            member.start(host)
            self._started.append(member)

    def start_processes(self, host: Host) -> bool:
        """Whether starting the members will start a process that outlives the start."""
        return any(member.starts_processes(host) for member in self._members)

    def dispatch(self, event: str, fields: Mapping[str, Any]) -> None:
        """Pass one event to every started member (attempt start / end also to their own hooks)."""
        for member in self._started:
            if event == "attempt_start":
                member.attempt_started(fields["attempt"])
            elif event == "attempt_end":
                member.attempt_ended(fields["attempt"], bool(fields.get("failed")))
            member.on_event(event, fields)

    # -- their contributions, asked of every started member --------------------------------------
    def hold(self) -> Optional[str]:
        """The first hold a member reports, or None."""
        return next((held for held in (m.hold() for m in self._started) if held), None)

    def progress(self, attempt: int) -> Optional[int]:
        """The highest step any member saw ``attempt`` reach (None: none knows)."""
        steps = [step for step in (m.progress(attempt) for m in self._started) if step is not None]
        return max(steps) if steps else None

    def status(self) -> Dict[str, Any]:
        """Every member's ``status`` section, merged."""
        merged: Dict[str, Any] = {}
        for member in self._started:
            merged.update(member.status())
        return merged

    def rank_env(self) -> Dict[str, str]:
        """Every member's variables for the ranks, merged in start order."""
        merged: Dict[str, str] = {}
        for member in self._started:
            merged.update(member.rank_env())
        return merged

    def restart_coordinator(self) -> Optional[Any]:
        """The first member's cross-node restart coordinator, or None."""
        return next((c for c in (m.restart_coordinator() for m in self._started) if c is not None), None)

    def coordinates_restarts(self) -> bool:
        """Whether any member tells the other nodes of this node's restarts."""
        return any(m.coordinates_restarts() for m in self._started)

    def stop(self) -> None:
        """Stop the started members, last first; one failing to stop does not keep the others running."""
        while self._started:
            member = self._started.pop()
            try:
                member.stop()
            except Exception:  # a bug in one integration: report it, stop the rest
                log.error("stopping the %s failed", member.name, exc_info=True)
