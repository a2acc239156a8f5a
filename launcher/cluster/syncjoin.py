"""Joining the cross-node restart coordination (``--coordinator``, ``--sync-dir``) as an integration.

:class:`SyncCoordination` joins this job's incarnation in etcd or in the shared directory before the
first attempt and hands the supervisor its :class:`launcher.cluster.sync.Coordinator` (an explicit
dependency of the restart loop). The supervisor leaves the coordination when the job ends; if the
launcher fails instead, :meth:`SyncCoordination.stop` leaves it, so the other nodes stop now rather
than at their ``--sync-timeout``.
"""

from __future__ import annotations  # the coordination's own modules only when a run coordinates

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Tuple

from launcher.common.errors import LauncherError, UsageError
from launcher.jobspec.runspec import ClusterSpec
from launcher.jobspec.topology import Topology, advertised_address, master_port_on, moved_master
from launcher.supervision.integration import Host, Integration
from launcher.supervision.loopevents import SignalReceived

if TYPE_CHECKING:  # imported where used: a run without --sync-dir or --coordinator never needs them
    from launcher.cluster.sync import Coordinator
    from launcher.cluster.syncmaster import MasterMove
    from launcher.cluster.syncstore import Store

log = logging.getLogger(__name__)

#: Seconds between two looks at etcd's snapshot at a barrier and at the start (it is in memory, kept
#: current by a watch); while ranks run the watch cues the event loop instead (``_Waker``).
ETCD_POLL_INTERVAL = 0.05


class SyncCoordination(Integration):
    """``--coordinator`` / ``--sync-dir``: restart generations shared with the other launchers of the job."""

    name = "sync coordinator"

    def __init__(self) -> None:
        self.coordinator: Optional[Coordinator] = None
        self.files: Optional[Store] = None
        self.first_generation = 0  # a launcher that joined a running job starts at the next generation
        self._generation = 0  # the supervisor's attempt number, from its events
        self._left = False

    def start(self, host: Host) -> None:
        """Join the job's incarnation (UsageError when the directory cannot be used, LauncherError
        when etcd does not answer)."""
        cluster, ctx = host.spec.cluster, host.ctx
        if not cluster.coordinated:
            return
        from launcher.cluster.sync import POLL_INTERVAL, Coordinator, Elastic

        topo = ctx.topology
        names = [server.server_id for server in topo.table.servers]
        files: Store = self._join_etcd(cluster, ctx.run_id, topo.server_index, names,
                                       advertised_address(topo, ctx.base_env), host.emit) if cluster.coordinator \
            else self._join_dir(cluster.sync_dir, ctx.run_id, topo.server_index, names)
        self.files = files
        host.emit("sync_join", dir=files.path, server=topo.server_index, server_count=len(names),
                  timeout=cluster.sync_timeout)
        log.info("restarts coordinated through %s (%s of %d)", files.path, files.name(topo.server_index), len(names))
        group = host.group
        elastic = Elastic(cluster.min_nodes, cluster.elastic_wait) if cluster.min_nodes is not None else None
        handover = getattr(group, "call_soon_threadsafe", None) if cluster.coordinator else None
        self.coordinator = Coordinator(files, cluster.sync_timeout, host.emit, group.call_later, group.cancel,
                                       group.post, interval=ETCD_POLL_INTERVAL if cluster.coordinator else POLL_INTERVAL,
                                       elastic=elastic, master=self._master_move(topo) if elastic else None,
                                       poll_interval=POLL_INTERVAL if handover else None)
        if handover is not None:  # etcd's watch tells of each change: no look every 50 ms while ranks run
            files.on_change = _Waker(handover, self.coordinator.changed)
        running = getattr(files, "running", None)
        if running is not None:
            self._join_running(host, running)
        elif cluster.coordinator:
            self._await_start(host, files, cluster.sync_timeout)

    def _await_start(self, host: Host, files: Any, timeout: float) -> None:
        """The barrier before the first generation: every server of the table has joined (etcd only:
        ``--sync-dir`` starts at once, as it always did); elastic: see :func:`elastic_start`."""
        start = time.monotonic()
        if self.coordinator.elastic is not None:
            self._await_elastic_start(host, files, start)
            return
        missing = files.not_joined()
        if missing:
            names = ", ".join(files.name(i) for i in missing)
            host.emit("sync_wait", generation=0, waiting_for="join", servers=missing, timeout=timeout)
            log.info("waiting for %s to join (up to %.0f s)", names, timeout)
        while missing:
            if time.monotonic() - start >= timeout:
                names = ", ".join(files.name(i) for i in missing)
                raise LauncherError(f"--sync-timeout: {names} did not join within {timeout:.0f} s")
            if not _idle(host.group, ETCD_POLL_INTERVAL):
                raise LauncherError("stopped while waiting for the other nodes to join")
            missing = files.not_joined()
        host.emit("sync_start", waited=round(time.monotonic() - start, 3))

    def _await_elastic_start(self, host: Host, files: Any, start: float) -> None:
        """``--nnodes MIN:MAX``: start with the servers agreed on, or join them at the next generation."""
        from launcher.cluster.syncstart import announce_join, elastic_start

        servers = elastic_start(self.coordinator, lambda: set(range(files.count)) - set(files.not_joined()),
                                lambda seconds: _idle(host.group, seconds))
        if servers is None:
            raise LauncherError("stopped while waiting for the other nodes to join")
        if files.index not in servers:
            announce_join(self.coordinator)
            self._join_running(host, 0)
            return
        if len(servers) < files.count and self.coordinator.move_master(-1, 1, lambda s: _idle(host.group, s)):
            raise LauncherError("no endpoint agreed for the master of generation 0")  # the reason is logged
        host.emit("sync_start", waited=round(time.monotonic() - start, 3), servers=list(servers))

    def _join_running(self, host: Host, generation: int) -> None:
        """Elastic: this launcher joined a running job in ``generation``; wait for its barrier (the
        others stop their ranks), then start with them at the next generation."""
        log.warning("joining the running job: the other nodes stop generation %d and restart with this one",
                    generation)
        host.emit("sync_join_running", generation=generation)
        agreed = self.coordinator.join_running(generation, lambda seconds: _idle(host.group, seconds))
        if agreed.exit_code is not None:
            raise LauncherError(f"could not join the running job in generation {generation}")
        self.first_generation = generation + 1

    def restart_coordinator(self) -> Optional[Coordinator]:
        """The coordinator of ``--sync-dir`` / ``--coordinator`` (None without either)."""
        return self.coordinator

    def coordinates_restarts(self) -> bool:
        return self.coordinator is not None

    def members(self) -> Optional[Sequence[int]]:
        """The servers of the current generation (elastic membership), or None without coordination."""
        return self.coordinator.members if self.coordinator is not None else None

    def _master_move(self, topo: Topology) -> MasterMove:
        """Where the master goes when rank 0 moves (elastic): the server that then hosts it, at the
        address it registered; the port checked on that server's host."""
        from launcher.cluster.syncmaster import MasterMove

        # The addresses only when the master moves: a follower of etcd's view reads them from etcd.
        return MasterMove(lambda servers: moved_master(topo, servers) and moved_master(topo, servers, self.addresses()),
                          topo.master_port, master_port_on)

    def endpoint(self) -> Optional[Tuple[str, int]]:
        """The master's address and port while it is away from the job's master server, as its new
        host published them (None: the job's own, or no coordination)."""
        return self.coordinator.endpoint if self.coordinator is not None else None

    def addresses(self) -> Mapping[int, str]:
        """The address each server gave when it joined (etcd), by index: where the master moves if it
        comes to host rank 0 (:func:`launcher.jobspec.topology.regroup`); empty without etcd."""
        read = getattr(self.files, "addresses", None)
        return read() if read is not None else {}

    @staticmethod
    def _join_dir(sync_dir: str, run_id: str, index: int, names: Sequence[str]) -> Store:
        from launcher.cluster.syncdir import SyncDir

        try:
            return SyncDir.join(sync_dir, run_id, index, names)
        except (OSError, LauncherError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            raise UsageError(f"cannot use --sync-dir {sync_dir}: {reason}",
                             ["it must be a directory every node of the job can write"]) from None

    @staticmethod
    def _join_etcd(cluster: ClusterSpec, run_id: str, index: int, names: Sequence[str], address: str,
                   emit: Callable[..., object]) -> Store:
        from launcher.cluster.etcdconf import coordinator_client, forget_password
        from launcher.cluster.etcdclient import EtcdError, EtcdRejected
        from launcher.cluster.etcdstore import EtcdStore

        coordinator = cluster.coordinator
        client = coordinator_client(coordinator, os.environ)
        forget_password(os.environ)  # read: the ranks do not get it
        try:
            return EtcdStore.join(client, run_id, index, names, coordinator.ttl, write_for=cluster.sync_timeout,
                                  elastic=cluster.min_nodes is not None, address=address, emit=emit)
        except EtcdRejected as exc:  # the configuration must change: bad input, not an outage
            raise UsageError(f"the coordinator {coordinator.url} refused this launcher: {exc}") from None
        except EtcdError as exc:
            raise LauncherError(f"cannot reach the coordinator {coordinator.url}: {exc}") from None

    def on_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """Track the supervisor's attempt number (also counted by restarts) and whether it left."""
        if event in ("attempt_start", "restart"):
            self._generation = max(self._generation, fields["attempt"])
        elif event == "job_end":  # the supervisor left the coordination with the job's result
            self._left = True

    def stop(self) -> None:
        """Tell the other nodes now if the launcher failed before the supervisor left; release the store."""
        if self.coordinator is not None and not self._left:
            from launcher.supervision.policy import RunResult  # the restart loop's: imported after the first ranks

            self.coordinator.leave(self._generation, RunResult(1, "launcher-error", 0), quiet=True)
        if self.files is not None:
            self.files.shutdown()


class _Waker:
    """``on_change`` of an etcd store: hands ``changed`` to the event loop once for any number of
    changes before the loop runs it (the leader's watch brings one per node at a barrier)."""

    def __init__(self, handover: Callable[[Callable[[], None]], None], changed: Callable[[], None]):
        self._handover, self._changed, self._pending = handover, changed, False

    def __call__(self) -> None:  # the store's watch thread
        if not self._pending:
            self._pending = True
            self._handover(self._run)

    def _run(self) -> None:  # the event loop
        self._pending = False
        self._changed()


def _idle(group: Any, seconds: float) -> bool:
    """Run the event loop for up to ``seconds`` before the first attempt; False on a stop signal."""
    return not isinstance(group.wait_event(seconds), SignalReceived)
