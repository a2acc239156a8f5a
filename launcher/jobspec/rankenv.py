"""The per-rank environment: one pure function from the job's context to each rank's variables.

``build_rank_env`` returns only the variables the launcher sets (what ``--dry-run --json`` shows);
the spawned process gets the launcher's own environment overlaid with them. No I/O happens here, so
every framework's contract is unit-tested without spawning anything.
"""

import json
import os
import signal
from dataclasses import field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from launcher.common import envnames as ev
from launcher.common.errors import UsageError
from launcher.common.records import record
from launcher.common.signals import STOP_SIGNALS
from launcher.jobspec.ranktable.model import Device
from launcher.jobspec.topology import Topology

ROLE_WORKER = "worker"
ROLE_SCHEDULER = "scheduler"
SCHEDULER_RANK = -1  # the MindSpore scheduler is supervised like a rank but has no global rank
# msrun's --cluster_time_out default (mindspore/parallel/cluster/run.py), which it exports as
# MS_TOPO_TIMEOUT: the same cluster-building window as msrun unless the operator sets one.
MSRUN_TOPO_TIMEOUT = "600"
#: The signals the launcher stops the job on (torchrun 2.13 gives its ranks SIGTERM,SIGINT,SIGHUP,SIGQUIT).
SIGNALS_TO_HANDLE = ",".join(signal.Signals(signum).name for signum in STOP_SIGNALS)


@record(frozen=True)
class EnvContext:
    """Job-wide facts every rank's environment is derived from.

    Attributes:
        framework: ``pytorch``, ``mindspore`` or ``tensorflow``.
        topology: Rank table and this server.
        run_id: The job's id (``TORCHELASTIC_RUN_ID``, ``JOB_ID``).
        max_restarts: The restart budget (``TORCHELASTIC_MAX_RESTARTS``).
        run_dir: The launcher's run dir (``LAUNCHER_RUN_DIR``).
        group_info_root: Root of ``<root>/device<RANK_ID>/group_info.pb`` (``--group-info-root``), or
            None: no ``GROUP_INFO_FILE``, which MindSpore reads as "semi-auto parallel restore" and
            then rejects a data-parallel job on CPU, so it is only set when asked for.
        base_env: The launcher's environment, read for "set only when unset" rules.
        extra: Variables every rank gets on top (e.g. graceful-exit file), already resolved.
        visible_devices: Physical NPU ids this container sees, ascending (``ASCEND_VISIBLE_DEVICES``,
            else ``/dev/davinci<N>``), or None when unknown (no NPU: logical id = local index).
        local_addresses: This container's own addresses (host networking test for ``HCCL_IF_IP``).
        hccl_if_ip: ``--hccl-if-ip``, when given.
        role: The workers' ``ROLE_NAME`` (torchrun's ``--role``).
    """

    framework: str
    topology: Topology
    run_id: str
    max_restarts: int
    run_dir: str
    group_info_root: Optional[str]
    base_env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)
    visible_devices: Optional[Tuple[int, ...]] = None
    local_addresses: Tuple[str, ...] = ()
    hccl_if_ip: Optional[str] = None
    role: str = "default"


@record(frozen=True)
class WorkerSpec:
    """One process to start: a rank (or the MindSpore scheduler) of one attempt.

    Attributes:
        rank: Global rank, or ``SCHEDULER_RANK`` for the MindSpore scheduler.
        local_rank: Index on this server.
        device_id: Physical device index (the rank table's ``device_id``).
        role: ``worker`` or ``scheduler``.
        argv: The command to run.
        env: Only the variables the launcher sets.
        serves: The TCP port on which this process hosts the job's rendezvous, which every other rank
            connects to (torch's TCPStore on global rank 0, MindSpore's scheduler); None for the others.
    """

    rank: int
    local_rank: int
    device_id: int
    role: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]
    serves: Optional[int] = None

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
    logical, physical = device_ids(ctx, device, local_rank)
    env: Dict[str, str] = {
        ev.RANK_ID: str(rank),
        ev.RANK_SIZE: str(table.world_size),
        ev.DEVICE_ID: str(logical),
        ev.ASCEND_DEVICE_ID: str(logical),
        ev.LAUNCHER_PHYSICAL_DEVICE_ID: str(physical),
        ev.DEVICE_NUM: str(len(server.devices)),
        ev.SERVER_ID: str(topo.server_index),
        ev.SERVER_NUM: str(table.server_count),
        ev.JOB_ID: ctx.run_id,
        ev.LOCAL_RANK: str(local_rank),
        ev.LAUNCHER_RUN_DIR: ctx.run_dir,
        ev.LAUNCHER_ATTEMPT: str(attempt),
        **_unbuffered(ctx),
    }
    if ctx.group_info_root:
        env[ev.GROUP_INFO_FILE] = os.path.join(ctx.group_info_root, f"device{rank}", "group_info.pb")
    if topo.table_file:
        env[ev.RANK_TABLE_FILE] = topo.table_file
    hccl_if_ip = _hccl_if_ip(ctx)
    if hccl_if_ip:
        env[ev.HCCL_IF_IP] = hccl_if_ip
    if ctx.framework == "pytorch":
        env.update(_torchrun_env(ctx, rank, local_rank, attempt))
    elif ctx.framework == "tensorflow":
        env[ev.DEVICE_INDEX] = str(rank)  # the global rank, not DEVICE_ID + 8*server (defect 8)
    elif topo.dynamic_cluster:
        env.update(_ms_worker_env(ctx, rank))
    env.update(ctx.extra)
    env.update(per_rank or {})
    return env


def device_ids(ctx: EnvContext, device: Device, local_rank: int) -> Tuple[int, int]:
    """``(logical, physical)`` NPU id of one rank.

    The process addresses its NPU by the logical id (``DEVICE_ID`` / ``ASCEND_DEVICE_ID``, what
    ``set_device`` takes): the position of the physical id among the NPUs this container sees, in
    ascending order; without visible-device information, the local index. A rank table's
    ``device_id`` is physical; a table the launcher built numbers the local ranks, which are logical.
    """
    visible = ctx.visible_devices or ()
    if ctx.topology.table_file is None:  # built by the launcher: device_id is the local index
        logical = device.device_id
        return logical, visible[logical] if logical < len(visible) else logical
    if device.device_id in visible:
        return visible.index(device.device_id), device.device_id
    # Visibility unknown (or the id not visible, which check_visible_devices refuses at start):
    # the local index, as the legacy scripts' device loop.
    return local_rank, device.device_id


def check_visible_devices(ctx: EnvContext) -> None:
    """Refuse a rank table whose NPUs for this server are not the ones this container sees.

    Raises:
        UsageError: one line per rank whose ``device_id`` is not visible.
    """
    visible = ctx.visible_devices
    if not visible or ctx.topology.table_file is None:
        return
    missing = [f"rank {d.rank_id}: device_id {d.device_id}" for d in ctx.topology.server.devices
               if d.device_id not in visible]
    if missing:
        shown = ",".join(map(str, visible))
        raise UsageError(f"the rank table gives this server NPUs the container does not see (visible: {shown})",
                         missing + ["check ASCEND_VISIBLE_DEVICES / the pod's NPU allocation against the table"])


def _unbuffered(ctx: EnvContext) -> Dict[str, str]:
    # Rank output goes to a pipe: block-buffered, a rank killed by SIGKILL would lose its last lines.
    return {} if ev.PYTHONUNBUFFERED in ctx.base_env else {ev.PYTHONUNBUFFERED: "1"}


def _hccl_if_ip(ctx: EnvContext) -> Optional[str]:
    """HCCL's host NIC address: the operator's own value (inherited, never replaced), else
    ``--hccl-if-ip``, else ``XDL_IP`` (the node address) only with host networking, where it is an
    address of this container. With pod networking it is not, and HCCL would fail to bind to it."""
    if ev.HCCL_IF_IP in ctx.base_env:
        return None
    if ctx.hccl_if_ip:
        return ctx.hccl_if_ip
    node_ip = ctx.base_env.get(ev.XDL_IP)
    if node_ip and (ctx.base_env.get(ev.POD_IP) == node_ip or node_ip in ctx.local_addresses):
        return node_ip
    return None


def derived_run_id(topology: Topology, command: Sequence[str]) -> str:
    """The default job id: a digest of what every node of the job shares, so every launcher of the
    job (and ``--dry-run``) computes the same id without talking to the others.

    A rank table file: its version and its servers (addresses, rank and device ids), plus the command.
    A table built from ``--nproc-per-node``: master address and port, node count, plus the command.
    """
    table = topology.table
    if topology.table_file is None:
        shared = {"master": [table.master_addr, topology.master_port], "nnodes": table.server_count}
    else:
        shared = {"version": table.format_version,
                  "servers": [[s.server_id, [[d.rank_id, d.device_id] for d in s.devices]] for s in table.servers]}
    shared["command"] = list(command)
    digest = _sha256_hex(json.dumps(shared, sort_keys=True).encode())
    return f"job-{digest[:12]}"


def _sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` in hex, from CPython's own SHA-256 module where it has one: the same digest
    as ``hashlib``'s, without loading OpenSSL (``import hashlib`` is about 2.5 ms of every launch)."""
    try:
        from _sha256 import sha256  # CPython up to 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # CPython from 3.12
        except ImportError:  # a Python built without them
            from hashlib import sha256
    return sha256(data).hexdigest()


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
        ev.ROLE_NAME: ctx.role,
        ev.MASTER_ADDR: topo.table.master_addr,
        ev.MASTER_PORT: str(topo.master_port),
        ev.TORCHELASTIC_RESTART_COUNT: str(attempt),
        ev.TORCHELASTIC_MAX_RESTARTS: str(ctx.max_restarts),
        ev.TORCHELASTIC_RUN_ID: ctx.run_id,
        # No agent-hosted TCPStore here: rank 0 creates the store, as with a static rendezvous.
        ev.TORCHELASTIC_USE_AGENT_STORE: "False",
        # torchrun's agent exports the signals it handles; the launcher's are fewer (no SIGQUIT).
        ev.TORCHELASTIC_SIGNALS_TO_HANDLE: SIGNALS_TO_HANDLE,
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
        ev.MS_TOPO_TIMEOUT: ctx.base_env.get(ev.MS_TOPO_TIMEOUT, MSRUN_TOPO_TIMEOUT),
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
                ev.LAUNCHER_RUN_DIR: ctx.run_dir, ev.LAUNCHER_ATTEMPT: str(attempt), ev.JOB_ID: ctx.run_id,
                **_unbuffered(ctx)})
    env.update(ctx.extra)
    return env


def rendezvous_port(env: Mapping[str, str]) -> Optional[int]:
    """The port of the rendezvous a process with ``env`` hosts, which every rank connects to:
    MindSpore's scheduler (``MS_ROLE=MS_SCHED``) at ``MS_SCHED_PORT``; PyTorch's global rank 0 at
    ``MASTER_PORT``, its TCPStore in ``init_process_group``'s env:// rendezvous when no agent hosts it
    (``TORCHELASTIC_USE_AGENT_STORE`` false, as the launcher sets it). None for any other process."""
    if env.get(ev.MS_ROLE) == ev.MS_ROLE_SCHED:
        port = env.get(ev.MS_SCHED_PORT, "")
    elif env.get(ev.RANK) == "0" and env.get(ev.TORCHELASTIC_USE_AGENT_STORE) == "False":
        port = env.get(ev.MASTER_PORT, "")
    else:
        return None
    return int(port) if port.isascii() and port.isdigit() and 0 < int(port) < 65536 else None


def worker_specs(ctx: EnvContext, command: Sequence[str], attempt: int,
                 per_rank: Optional[Mapping[int, Mapping[str, str]]] = None) -> List[WorkerSpec]:
    """Every process this server starts for one attempt: the local ranks, plus the MindSpore
    scheduler on the server hosting rank 0 in dynamic-cluster mode."""
    per_rank = per_rank or {}
    argv = tuple(command)
    specs = []
    for i, d in enumerate(ctx.topology.server.devices):
        env = build_rank_env(ctx, d, i, attempt, per_rank.get(d.rank_id))
        specs.append(WorkerSpec(d.rank_id, i, d.device_id, ROLE_WORKER, argv, env, rendezvous_port(env)))
    if ctx.topology.dynamic_cluster and ctx.topology.hosts_rank0:
        env = scheduler_env(ctx, attempt)
        specs.insert(0, WorkerSpec(SCHEDULER_RANK, -1, -1, ROLE_SCHEDULER, argv, env, rendezvous_port(env)))
    return specs
