"""The job's topology between attempts: a rank table the cluster rewrote, a membership the nodes agreed on.

Each function records the change (an event, a warning) and returns the new topology, or None when it
is unchanged; the session takes it from there (launcher.run.session).
"""

import logging
from typing import Callable, Mapping, Optional

from launcher.jobspec.runspec import ClusterSpec
from launcher.jobspec.topology import Topology

log = logging.getLogger(__name__)


def reread_rank_table(topo: Topology, cluster: ClusterSpec, framework: str, base_env: Mapping[str, str],
                      emit: Callable[..., None]) -> Optional[Topology]:
    """Before a restart: the rank table again, if the cluster rewrote it (its version changed). A file
    that cannot be read or is incomplete is said in one warning, and the table in use is kept."""
    if not topo.table_file:
        return None
    from launcher.common.inputfiles import InputFileError
    from launcher.jobspec.ranktable.files import read_version

    try:
        revision = read_version(topo.table_file)
    except InputFileError as exc:  # a bad file during the run: say so, keep the table we have
        log.warning("%s; keeping the rank table of version %s", exc, topo.table.revision)
        return None
    if revision is None or revision == (topo.table.revision or ""):
        return None
    from launcher.jobspec import topology
    from launcher.jobspec.ranktable import RankTableError
    from launcher.jobspec.ranktable.wait import wait_for_rank_table

    try:
        table = wait_for_rank_table(topo.table_file, timeout=cluster.rank_table_timeout)
    except RankTableError as exc:
        log.warning("%s; keeping the rank table of version %s", exc.message, topo.table.revision)
        return None
    new = topology.resolve(cluster, framework, base_env, table)
    emit("rank_table_changed", old_revision=topo.table.revision, new_revision=table.revision,
         old_ranks=list(topo.server.ranks), new_ranks=list(new.server.ranks), world_size=table.world_size)
    log.warning("rank table rewritten (version %s -> %s): local ranks %s -> %s", topo.table.revision,
                table.revision, list(topo.server.ranks), list(new.server.ranks))
    return new


def regrouped(base: Topology, current: Topology, sync, attempt: int, emit: Callable[..., None]) -> Optional[Topology]:
    """Elastic membership: the job on the servers the nodes agreed on for ``attempt`` (ranks renumbered,
    world size changed), from every server's ``base`` topology; None without elastic membership or
    when the servers are those of ``current``.

    Args:
        sync: The run's cross-node coordination (``launcher.cluster.syncjoin.SyncCoordination``).
    """
    members = sync.members()
    if members is None:
        return None
    from launcher.jobspec import topology

    new = topology.regroup(base, members, sync.addresses(), sync.endpoint())
    if new.table.servers == current.table.servers:
        return None
    emit("world_size_changed", attempt=attempt, old_world_size=current.table.world_size,
         new_world_size=new.table.world_size, servers=list(members), old_ranks=list(current.server.ranks),
         new_ranks=list(new.server.ranks), master_addr=new.table.master_addr, master_port=new.master_port)
    log.warning("attempt %d: world size %d -> %d (%d server(s)); local ranks %s -> %s; master %s:%d", attempt,
                current.table.world_size, new.table.world_size, len(members), list(current.server.ranks),
                list(new.server.ranks), new.table.master_addr, new.master_port)
    return new
