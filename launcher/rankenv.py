"""The per-rank environment: one pure function from the job's context to each rank's variables.

``build_rank_env`` returns only the variables the launcher sets (what ``--dry-run --json`` shows);
the spawned process gets the launcher's own environment overlaid with them. No I/O happens here, so
every framework's contract is unit-tested without spawning anything.
"""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from launcher import envnames as ev
from launcher.ranktable.model import Device
from launcher.topology import Topology

ROLE_WORKER = "worker"
ROLE_SCHEDULER = "scheduler"
SCHEDULER_RANK = -1  # the MindSpore scheduler is supervised like a rank but has no global rank


@dataclass(frozen=True)
class EnvContext:
    """Job-wide facts every rank's environment is derived from.

    Attributes:
        framework: ``pytorch``, ``mindspore`` or ``tensorflow``.
        topology: Rank table and this server.
        run_id: The job's id (``TORCHELASTIC_RUN_ID``, ``JOB_ID``).
        max_restarts: The restart budget (``TORCHELASTIC_MAX_RESTARTS``).
        run_dir: The launcher's run dir (``LAUNCHER_RUN_DIR``).
        group_info_root: Root of ``<root>/device<RANK_ID>/group_info.pb``.
        base_env: The launcher's environment, read for "set only when unset" rules.
        extra: Variables every rank gets on top (e.g. graceful-exit file), already resolved.
    """

    framework: str
    topology: Topology
    run_id: str
    max_restarts: int
    run_dir: str
    group_info_root: str
    base_env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerSpec:
    """One process to start: a rank (or the MindSpore scheduler) of one attempt.

    Attributes:
        rank: Global rank, or ``SCHEDULER_RANK`` for the MindSpore scheduler.
        local_rank: Index on this server.
        device_id: Physical device index.
        role: ``worker`` or ``scheduler``.
        argv: The command to run.
        env: Only the variables the launcher sets.
    """

    rank: int
    local_rank: int
    device_id: int
    role: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]

    @property
    def label(self) -> str:
        """Console/log label: ``rank 3`` or ``scheduler``."""
        return "scheduler" if self.role == ROLE_SCHEDULER else f"rank {self.rank}"


def build_rank_env(ctx: EnvContext, device: Device, local_rank: int, attempt: int,
                   per_rank: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables the launcher sets for one rank of one attempt.

    Args:
        ctx: Job-wide context.
        device: This rank's device entry from the rank table.
        local_rank: Index of the rank on this server.
        attempt: Restart count (0 for the first start).
        per_rank: Extra variables for this rank only (restore plan, error file).

    Returns:
        Variable name -> value, all strings.
    """
    topo = ctx.topology
    table, server = topo.table, topo.server
    rank = device.rank_id
    env: Dict[str, str] = {
        ev.RANK_ID: str(rank),
        ev.RANK_SIZE: str(table.world_size),
        ev.DEVICE_ID: str(device.device_id),
        ev.ASCEND_DEVICE_ID: str(device.device_id),
        ev.DEVICE_NUM: str(len(server.devices)),
        ev.SERVER_ID: str(topo.server_index),
        ev.SERVER_NUM: str(table.server_count),
        ev.JOB_ID: ctx.run_id,
        ev.LOCAL_RANK: str(local_rank),
        ev.GROUP_INFO_FILE: os.path.join(ctx.group_info_root, f"device{rank}", "group_info.pb"),
        ev.LAUNCHER_RUN_DIR: ctx.run_dir,
        ev.LAUNCHER_ATTEMPT: str(attempt),
    }
    if topo.table_file:
        env[ev.RANK_TABLE_FILE] = topo.table_file
    if ctx.base_env.get(ev.XDL_IP):
        env[ev.HCCL_IF_IP] = ctx.base_env[ev.XDL_IP]
    if ctx.framework == "pytorch":
        env.update(_torchrun_env(ctx, rank, local_rank, attempt))
    elif ctx.framework == "tensorflow":
        env[ev.DEVICE_INDEX] = str(rank)  # the global rank, not DEVICE_ID + 8*server (defect 8)
    elif topo.dynamic_cluster:
        env.update(_ms_worker_env(ctx, rank))
    env.update(ctx.extra)
    env.update(per_rank or {})
    return env


def _torchrun_env(ctx: EnvContext, rank: int, local_rank: int, attempt: int) -> Dict[str, str]:
    topo = ctx.topology
    local_world = len(topo.server.devices)
    env = {
        ev.RANK: str(rank),
        ev.WORLD_SIZE: str(topo.table.world_size),
        ev.LOCAL_WORLD_SIZE: str(local_world),
        ev.GROUP_RANK: str(topo.server_index),
        ev.GROUP_WORLD_SIZE: str(topo.table.server_count),
        ev.ROLE_RANK: str(rank),
        ev.ROLE_WORLD_SIZE: str(topo.table.world_size),
        ev.ROLE_NAME: "default",
        ev.MASTER_ADDR: topo.table.master_addr,
        ev.MASTER_PORT: str(topo.master_port),
        ev.TORCHELASTIC_RESTART_COUNT: str(attempt),
        ev.TORCHELASTIC_MAX_RESTARTS: str(ctx.max_restarts),
        ev.TORCHELASTIC_RUN_ID: ctx.run_id,
        # No agent-hosted TCPStore here: rank 0 creates the store, as with a static rendezvous.
        ev.TORCHELASTIC_USE_AGENT_STORE: "False",
    }
    if local_world > 1 and ev.OMP_NUM_THREADS not in ctx.base_env:
        env[ev.OMP_NUM_THREADS] = "1"  # torchrun's rule: avoid N ranks x all cores threads
    if ev.TORCH_NCCL_ASYNC_ERROR_HANDLING not in ctx.base_env:
        # torchrun's agent default: a failed NCCL collective aborts the rank instead of hanging it.
        env[ev.TORCH_NCCL_ASYNC_ERROR_HANDLING] = "1"
    return env


def _ms_common_env(ctx: EnvContext) -> Dict[str, str]:
    topo = ctx.topology
    return {
        ev.MS_SCHED_HOST: topo.table.master_addr,
        ev.MS_SCHED_PORT: str(topo.master_port),
        ev.MS_WORKER_NUM: str(topo.table.world_size),
        ev.MS_LOCAL_WORKER: str(len(topo.server.devices)),
        ev.MS_NODE_RANK: str(topo.server_index),
        ev.MS_SERVER_NUM: "0",
        # msrun's --cluster_time_out default, which it exports as MS_TOPO_TIMEOUT.
        ev.MS_TOPO_TIMEOUT: ctx.base_env.get(ev.MS_TOPO_TIMEOUT, "600"),
    }


def _ms_worker_env(ctx: EnvContext, rank: int) -> Dict[str, str]:
    env = _ms_common_env(ctx)
    env.update({ev.MS_ROLE: ev.MS_ROLE_WORKER, ev.MS_NODE_ID: str(rank)})
    return env


def scheduler_env(ctx: EnvContext, attempt: int) -> Dict[str, str]:
    """Variables for the MindSpore dynamic-cluster scheduler process (``MS_ROLE=MS_SCHED``)."""
    env = _ms_common_env(ctx)
    # msrun gives its scheduler RANK_ID=0 and RANK_SIZE: scripts read them before mindspore's init().
    env.update({ev.MS_ROLE: ev.MS_ROLE_SCHED, ev.RANK_ID: "0", ev.RANK_SIZE: str(ctx.topology.table.world_size),
                ev.LAUNCHER_RUN_DIR: ctx.run_dir,
                ev.LAUNCHER_ATTEMPT: str(attempt), ev.JOB_ID: ctx.run_id})
    env.update(ctx.extra)
    return env


def worker_specs(ctx: EnvContext, command: Sequence[str], attempt: int,
                 per_rank: Optional[Mapping[int, Mapping[str, str]]] = None) -> List[WorkerSpec]:
    """Every process this server starts for one attempt: the local ranks, plus the MindSpore
    scheduler on the server hosting rank 0 in dynamic-cluster mode."""
    per_rank = per_rank or {}
    argv = tuple(command)
    specs = [WorkerSpec(d.rank_id, i, d.device_id, ROLE_WORKER, argv,
                        build_rank_env(ctx, d, i, attempt, per_rank.get(d.rank_id)))
             for i, d in enumerate(ctx.topology.server.devices)]
    if ctx.topology.dynamic_cluster and ctx.topology.hosts_rank0:
        specs.insert(0, WorkerSpec(SCHEDULER_RANK, -1, -1, ROLE_SCHEDULER, argv, scheduler_env(ctx, attempt)))
    return specs
