"""Following ``reset.json`` during a run, and what its changes ask of the supervisor.

* :class:`ResetFollower`: re-reads on every change seen by a :class:`launcher.common.filewatch.PathWatcher`,
  keeps the last good state across malformed content and reports real changes;
* :func:`changes`: the pure decision of what a state transition asks the supervisor to do;
* :class:`ResetJsonFollower`: the follower as an integration of ``launcher run`` (started when the
  container has the file), and the hold it puts on (re)starting the ranks.
"""

import logging
import os
from typing import Any, Callable, FrozenSet, Iterable, Optional

from launcher.cluster.resetjson import EMPTY, ResetState, Snapshot, loads_reset, read_snapshot
from launcher.common.filewatch import PathWatcher
from launcher.common.inputfiles import InputFileError
from launcher.common.records import record
from launcher.jobspec.options import DEFAULT_RESET_JSON
from launcher.supervision.integration import Host, Integration
from launcher.supervision.procgroup import ClusterUpdate

log = logging.getLogger(__name__)

__all__ = ["ResetChange", "ResetFollower", "ResetJsonFollower", "changes"]


# -- following ------------------------------------------------------------------------------------
class ResetFollower:
    """Keeps the current good state of ``reset.json`` and reports its real changes.

    Args:
        path: The ``reset.json`` path.
        watcher_factory: ``(path, on_change) -> watcher`` with a ``close()``, normally
            ``lambda p, cb: PathWatcher(p, cb, group.add_reader, group.remove_reader, group.call_later,
            group.cancel)``.
        on_update: ``(new_state, previous_state)``, called from the event loop only when the parsed state
            differs from the current one (``previous_state`` is None if there was none). It is not called
            for the state read at construction: read :attr:`current` then.

    Missing or empty content keeps the current state (a reader can catch an in-place write half done,
    and a ConfigMap starts empty). Malformed content keeps it too, with one warning per distinct content.
    """

    def __init__(self, path: str, watcher_factory: Callable[[str, Callable[[], None]], Any],
                 on_update: Callable[[ResetState, Optional[ResetState]], None]):
        self.path = path
        self._on_update = on_update
        self._current: Optional[ResetState] = None
        self._snapshot: Optional[Snapshot] = None
        self._error: Optional[str] = None
        self._watcher = watcher_factory(path, self.refresh)  # first: a change after the read is seen
        self._load(notify=False)

    @property
    def current(self) -> Optional[ResetState]:
        """The last good state, or None if no good content was ever read."""
        return self._current

    def refresh(self) -> None:
        """Re-read now (the watcher calls this; the supervisor may too, e.g. before a restart)."""
        self._load(notify=True)

    def close(self) -> None:
        """Stop watching."""
        self._watcher.close()

    def _load(self, notify: bool) -> None:
        try:
            snapshot = read_snapshot(self.path)
        except OSError as exc:
            self._warn_once(f"cannot read {self.path}: {exc}; keeping the last good state")
            return
        except InputFileError as exc:  # a FIFO or /dev/zero where the file was: never opened or read
            self._warn_once(f"{exc}; keeping the last good state")
            return
        self._error = None
        if snapshot == self._snapshot:
            return  # same bytes: nothing to do, and nothing to warn about again
        self._snapshot = snapshot
        try:
            state = loads_reset(*snapshot, self.path)
        except InputFileError as exc:
            log.warning("%s is malformed (%s); keeping the last good state", self.path, exc.problem)
            return
        except ValueError as exc:
            log.warning("%s is malformed (%s); keeping the last good state", self.path, exc)
            return
        if state is None:
            log.info("%s is missing or empty; keeping the last state", self.path)
            return
        for warning in state.warnings:
            log.warning("%s: %s", self.path, warning)
        previous, self._current = self._current, state
        if notify and state != previous:
            self._on_update(state, previous)

    def _warn_once(self, message: str) -> None:
        if message != self._error:
            log.warning("%s", message)
            self._error = message
        self._snapshot = None  # read again in full once the file is readable


# -- decisions ------------------------------------------------------------------------------------
@record(frozen=True)
class ResetChange:
    """What a transition of ``reset.json`` asks of this node's supervisor.

    Attributes:
        newly_faulty_local: local ranks that are unrecovered/fault/failed now and were not before.
        recovered_all: every listed rank is recovered now, and was not before.
        retry_bumped: ``RetryTime`` increased.
        graceful_exit_requested: ``GracefulExit`` went from 0 to 1.
        hold: the new state forbids (re)starting workers (FaultFlushing, or a local rank in ``fault``).
    """

    newly_faulty_local: FrozenSet[int]
    recovered_all: bool
    retry_bumped: bool
    graceful_exit_requested: bool
    hold: bool

    @property
    def restart(self) -> bool:
        """The job-wide recovery finished or was re-triggered: restart with a fresh restore plan."""
        return self.recovered_all or self.retry_bumped


def changes(old: Optional[ResetState], new: ResetState, local_ranks: Iterable[int]) -> ResetChange:
    """The decision for the transition ``old -> new`` (pure). ``old`` None means :data:`EMPTY`.

    Args:
        old: The previous state, or None if there was none.
        new: The new state.
        local_ranks: Global rank ids of the ranks on this node; other ranks never count as local.
    """
    before = EMPTY if old is None else old
    local = set(local_ranks)
    return ResetChange(
        newly_faulty_local=frozenset(new.faulty(local) - before.faulty(local)),
        recovered_all=new.all_recovered() and not before.all_recovered(),
        retry_bumped=new.retry_time > before.retry_time,
        graceful_exit_requested=new.graceful_exit and not before.graceful_exit,
        hold=new.hold(local))


class ResetJsonFollower(Integration):
    """Follows MindCluster's reset.json when this container has it (or the user asked for it).

    Each real change is posted to the supervisor's loop as a ``ClusterUpdate``; :meth:`hold` says why
    the current state forbids (re)starting the ranks.
    """

    name = "reset.json follower"

    def __init__(self) -> None:
        self.follower: Optional[ResetFollower] = None
        self._host: Optional[Host] = None

    def start(self, host: Host) -> None:
        """Follow ``--reset-json`` if set and, for the default path, if its directory is mounted."""
        path = host.spec.restore.reset_json_path
        if not path or (path == DEFAULT_RESET_JSON and not os.path.isdir(os.path.dirname(path))):
            return
        self._host = host
        group = host.group

        def watcher(watched: str, on_change):
            return PathWatcher(watched, on_change, group.add_reader, group.remove_reader, group.call_later,
                               group.cancel)

        def on_update(new, old) -> None:
            group.post(ClusterUpdate(changes(old, new, host.ctx.topology.server.ranks)))

        self.follower = ResetFollower(path, watcher, on_update)
        log.info("following %s", path)

    def hold(self) -> Optional[str]:
        """Why reset.json forbids (re)starting the ranks now, or None."""
        state = self.follower.current if self.follower is not None else None
        if state is None:
            return None
        if state.fault_flushing:
            return "reset.json: FaultFlushing"
        faulty = sorted(r for r in self._host.ctx.topology.server.ranks if state.status_of(r) == "fault")
        return f"reset.json: local rank(s) {faulty} in fault" if faulty else None

    def coordinates_restarts(self) -> bool:
        """MindCluster restarts the nodes together when this node follows its reset.json."""
        return self.follower is not None

    def stop(self) -> None:
        """Stop watching."""
        if self.follower is not None:
            self.follower.close()
