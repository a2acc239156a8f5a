"""Joining the cross-node restart coordination (``--sync-dir``) as an integration of ``launcher run``.

:class:`SyncCoordination` joins this job's incarnation in the shared directory before the first
attempt and hands the supervisor its :class:`launcher.cluster.sync.Coordinator` (an explicit
dependency of the restart loop). The supervisor leaves the coordination when the job ends; if the
launcher fails instead, :meth:`SyncCoordination.stop` leaves it, so the other nodes stop now rather
than at their ``--sync-timeout``.
"""

import logging
from typing import Any, Mapping, Optional

from launcher.cluster.sync import Coordinator
from launcher.cluster.syncdir import SyncDir
from launcher.common.errors import LauncherError, UsageError
from launcher.supervision.integration import Host, Integration
from launcher.supervision.policy import RunResult

log = logging.getLogger(__name__)


class SyncCoordination(Integration):
    """``--sync-dir``: restart generations shared with the other launchers of the job."""

    name = "sync coordinator"

    def __init__(self) -> None:
        self.coordinator: Optional[Coordinator] = None
        self._generation = 0  # the supervisor's attempt number, from its events
        self._left = False

    def start(self, host: Host) -> None:
        """Join ``<sync-dir>/<run id>`` (UsageError when the directory cannot be used)."""
        opts, ctx = host.opts, host.ctx
        if not opts.sync_dir:
            return
        topo = ctx.topology
        names = [server.server_id for server in topo.table.servers]
        try:
            files = SyncDir.join(opts.sync_dir, ctx.run_id, topo.server_index, names)
        except (OSError, LauncherError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            raise UsageError(f"cannot use --sync-dir {opts.sync_dir}: {reason}",
                             ["it must be a directory every node of the job can write"]) from None
        host.emit("sync_join", dir=files.path, server=topo.server_index, server_count=len(names),
                  timeout=opts.sync_timeout)
        log.info("restarts coordinated through %s (%s of %d)", files.path, files.name(topo.server_index), len(names))
        group = host.group
        self.coordinator = Coordinator(files, opts.sync_timeout, host.emit, group.call_later, group.cancel, group.post)

    def on_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """Track the supervisor's attempt number (also counted by restarts) and whether it left."""
        if event in ("attempt_start", "restart"):
            self._generation = max(self._generation, fields["attempt"])
        elif event == "job_end":  # the supervisor left the coordination with the job's result
            self._left = True

    def stop(self) -> None:
        """The launcher failed before the supervisor left: tell the other nodes now."""
        if self.coordinator is not None and not self._left:
            self.coordinator.leave(self._generation, RunResult(1, "launcher-error", 0), quiet=True)
