"""``RunSpec``: what ``launcher run`` was asked to do, parsed once and grouped by who uses it.

``RunOptions`` holds the options as the command line, the environment and the ``--config`` file gave
them (one field per row of ``launcher.commands.optiontable``). :func:`run_spec` turns them, once, at
the runner's edge, into small frozen specs, each read by one part of the launcher:

* ``restart`` (:class:`RestartSpec`): the restart budget, backoff, recovery strategy, exit codes, the
  stop and the dying gasp: the supervisor's policy;
* ``hangs`` (:class:`HangRules`): heartbeat and section timeouts, stragglers: the hang watch;
* ``restore`` (:class:`RestoreSpec`): checkpoints and fault reports: the restore planner, for
  ``launcher run`` and ``launcher plan`` alike (both build it with :func:`restore_spec`);
* ``preload`` (:class:`PreloadSpec`): the warm standbys;
* ``cluster`` (:class:`ClusterSpec`): where this node stands in the job and how it meets the others
  (rank table, ``--nnodes``, the coordinator with its TLS files, ``--sync-dir``, TaskD);
* ``output`` (:class:`OutputSpec`) and ``debug`` (:class:`DebugSpec`): logs, metrics, the debugged rank.

Every text that needs parsing (``--recover-strategy`` with the operator's variables, ``--coordinator``,
``--preload``, ``--gasp-signal``) is parsed here, so a mistake is exit 2 before anything runs and no
consumer parses an option again.
"""

import signal
from dataclasses import field
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple

from launcher.common.records import record
from launcher.jobspec.options import (TASKD_DEFAULT_PORT, RunOptions, coordinator_tls, parse_coordinator,
                                      parse_signal)
from launcher.jobspec.recovery import RETRY, RecoveryStrategy, resolve_strategy


@record(frozen=True)
class RestartSpec:
    """How the ranks are restarted and stopped (``Supervision and restarts``, ``Failures before the ranks run``).

    Attributes:
        max_restarts: ``--max-restarts``.
        backoff: ``--restart-backoff``: the first delay of a crash loop.
        backoff_max: ``--restart-backoff-max``.
        stop_timeout: ``--stop-timeout``: SIGTERM -> SIGKILL after a rank failed.
        strategy: ``--recover-strategy``, else the operator's variables, else retry.
        max_no_progress_restarts: ``--max-no-progress-restarts`` (0: off).
        no_progress_exit_code: ``--no-progress-exit-code``.
        node_fault_exit_code: ``--node-fault-exit-code``.
        device_wait_timeout: ``--device-wait-timeout``.
        health_check: ``--health-check`` CMD, or None.
        gasp_timeout: ``--gasp-timeout``, else what fits ``--termination-grace-period``.
        gasp_signal: ``--gasp-signal`` as a number.
        gasp_min_interval: ``--gasp-min-interval``.
        graceful_exit: ``--graceful-exit`` (MindSpore's MS_ENABLE_GRACEFUL_EXIT).
    """

    max_restarts: int = 0
    backoff: float = 0.5
    backoff_max: float = 30.0
    stop_timeout: float = 10.0
    strategy: RecoveryStrategy = RecoveryStrategy(frozenset({RETRY}), "default")
    max_no_progress_restarts: int = 0
    no_progress_exit_code: int = 93
    node_fault_exit_code: int = 94
    device_wait_timeout: float = 60.0
    health_check: Optional[str] = None
    gasp_timeout: float = 25.0
    gasp_signal: int = int(signal.SIGTERM)
    gasp_min_interval: float = 0.0
    graceful_exit: bool = False

    @property
    def gasp_signal_name(self) -> str:
        """``SIGTERM``: the gasp signal as ``launcher prestop`` reads it from the run dir."""
        return signal.Signals(self.gasp_signal).name


@record(frozen=True)
class HangRules:
    """When a rank counts as hung (seconds; 0 or None: that check is off).

    Attributes:
        steady: ``--heartbeat-timeout``: longest silence once the rank showed progress.
        initial: ``--heartbeat-initial-timeout``: longest wait for the first sign of progress
            (start-up, model load); defaults to ``steady``.
        sections: ``--section-timeout NAME=SECONDS``: the longest stay in a named section; inside
            one, the steady timeout does not apply.
        no_progress: ``--max-no-progress-restarts``: not a timeout, but it needs the slots' steps.
        straggler: ``--straggler-threshold``: a rank whose step rate is this fraction below the
            median of its peers' is a straggler (0: off).
    """

    steady: float = 0.0
    initial: Optional[float] = None
    sections: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # read-only
    no_progress: int = 0
    straggler: float = 0.0

    @property
    def enabled(self) -> bool:
        """Whether the ranks get heartbeat slots (any check is on)."""
        return bool(self.steady or self.initial or self.sections or self.no_progress or self.straggler)


@record(frozen=True)
class RestoreSpec:
    """The restore options, read by the restore planner (``launcher.restore.PlanInputs`` adds the run's
    world size and failed ranks to them) for ``launcher run`` and ``launcher plan`` alike.

    Attributes:
        fault_npus_path: ``--fault-npus``: the cluster's fault-npus file (None: not read; a missing
            file: no faults).
        reset_json_path: ``--reset-json``: the cluster's reset.json (None: not read; a missing file: no
            faults); ``launcher run`` also follows it while the job runs.
        extra_fault_ranks: ``--fault-ranks``: ranks the user declares faulty, sorted.
        group_info_root: ``--group-info-root``: directory of ``device<r>/group_info.pb`` files.
        groups_file: ``--groups-file``: JSON/YAML replica groups file.
        dp: ``--dp``: data-parallel size of a ``dp x tp x pp`` layout (``launcher.restore.groups``).
        tp: ``--tp``: tensor-parallel size.
        pp: ``--pp``: pipeline-parallel size.
        checkpoint_dir: ``--checkpoint-dir``: holds ``rank_<r>/``; None means nothing to resume from.
        checkpoint_pattern: ``--checkpoint-pattern``: file-name regex with ``(?P<step>)``; None for the defaults.
        checkpoint_marker: ``--checkpoint-marker``: completion-marker template, e.g. ``{name}.done``.
        strategy_file: ``--strategy-file``: MindSpore's sharding-strategy file of this world; with it a
            step another world wrote (``manifests/``) is converted for this one.
    """

    fault_npus_path: Optional[str] = None
    reset_json_path: Optional[str] = None
    extra_fault_ranks: Tuple[int, ...] = ()
    group_info_root: Optional[str] = None
    groups_file: Optional[str] = None
    dp: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_pattern: Optional[str] = None
    checkpoint_marker: Optional[str] = None
    strategy_file: Optional[str] = None


@record(frozen=True)
class PreloadSpec:
    """``--preload``: warm standby ranks.

    Attributes:
        auto: ``auto``: the ranks record what they import and the standbys learn it.
        modules: The modules named (empty with ``auto`` or ``none``).
        max_rss: ``--preload-max-rss`` in bytes (0: no cap).
        python: Whether the command is a Python interpreter running a script or ``-m module``,
            the only commands a standby can stand in for.
    """

    auto: bool = True
    modules: Tuple[str, ...] = ()
    max_rss: int = 4096 << 20
    python: bool = False

    @property
    def learns(self) -> bool:
        """The ranks record the modules they import (``auto`` for a Python command)."""
        return self.auto and self.python

    @property
    def wanted(self) -> bool:
        """Standbys were asked for (``auto`` or modules), whether or not the command allows them."""
        return self.auto or bool(self.modules)


@record(frozen=True)
class CoordinatorSpec:
    """``--coordinator``: the etcd the launchers restart together through.

    Attributes:
        url: As given (for messages).
        endpoints: ``(host, port)`` of each etcd member.
        tls: ``etcds://`` or ``https://``.
        ttl: ``--coordinator-ttl``.
        cacert: ``--coordinator-cacert``.
        cert: ``--coordinator-cert``.
        key: ``--coordinator-key``.
        user: ``--coordinator-user``.
        password_file: ``--coordinator-password-file``.
    """

    url: str
    endpoints: Tuple[Tuple[str, int], ...]
    tls: bool = False
    ttl: int = 5
    cacert: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    user: Optional[str] = None
    password_file: Optional[str] = None


@record(frozen=True)
class ClusterSpec:
    """Where this node stands in the job and how it meets the other nodes.

    Attributes:
        rank_table: ``--rank-table``.
        rank_table_timeout: ``--rank-table-timeout``.
        server_id: ``--server-id``.
        nproc_per_node: ``--nproc-per-node``.
        nnodes: ``--nnodes`` (MAX of MIN:MAX).
        min_nodes: MIN of ``--nnodes MIN:MAX`` (elastic), else None.
        node_rank: ``--node-rank``.
        master_addr: ``--master-addr`` (MindSpore: resolved to an IP address by the runner).
        master_port: ``--master-port``.
        coordinator: ``--coordinator`` and its TLS and authentication options, or None.
        sync_dir: ``--sync-dir``.
        sync_timeout: ``--sync-timeout``.
        elastic_wait: ``--elastic-wait``.
        taskd: ``--taskd`` (auto, on, off).
        taskd_port: ``--taskd-port``.
    """

    rank_table: Optional[str] = None
    rank_table_timeout: float = 300.0
    server_id: Optional[str] = None
    nproc_per_node: Optional[int] = None
    nnodes: int = 1
    min_nodes: Optional[int] = None
    node_rank: int = 0
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    coordinator: Optional[CoordinatorSpec] = None
    sync_dir: Optional[str] = None
    sync_timeout: float = 300.0
    elastic_wait: float = 30.0
    taskd: str = "auto"
    taskd_port: int = TASKD_DEFAULT_PORT

    @property
    def coordinated(self) -> bool:
        """The launchers of the job restart together (``--sync-dir`` or ``--coordinator``)."""
        return bool(self.sync_dir or self.coordinator)


@record(frozen=True)
class OutputSpec:
    """What the launcher shows and writes (``Logs and state``, ``--dry-run``)."""

    log_dir: Optional[str] = None
    console_ranks: Optional[Tuple[int, ...]] = None  # None: every rank
    metrics_port: Optional[int] = None
    metrics_textfile: Optional[str] = None
    dry_run: bool = False
    json_output: bool = False


@record(frozen=True)
class DebugSpec:
    """``--debug-rank`` and ``--pdb``."""

    rank: Optional[int] = None
    pdb: bool = False

    @property
    def enabled(self) -> bool:
        """A rank is debugged on this terminal."""
        return self.rank is not None or self.pdb


@record(frozen=True)
class RunSpec:
    """One ``launcher run``, parsed (see the module docstring for the groups).

    Attributes:
        command: The ranks' command line.
        framework: pytorch, mindspore or tensorflow (``--framework``, else ``$framework``, else pytorch).
        run_dir: ``--run-dir`` as given, or None.
        run_id: ``--run-id`` as given, or None.
        job_name: ``--job-name``.
        role: ``--role``.
        hccl_if_ip: ``--hccl-if-ip``.
        bind_cores: ``--bind-cores``.
        rank_env: Variables every rank gets on top (msrun's options).
    """

    command: Tuple[str, ...]
    framework: str = "pytorch"
    restart: RestartSpec = RestartSpec()
    hangs: HangRules = HangRules()
    restore: RestoreSpec = RestoreSpec()
    preload: PreloadSpec = PreloadSpec()
    cluster: ClusterSpec = ClusterSpec()
    output: OutputSpec = OutputSpec()
    debug: DebugSpec = DebugSpec()
    run_dir: Optional[str] = None
    run_id: Optional[str] = None
    job_name: Optional[str] = None
    role: str = "default"
    hccl_if_ip: Optional[str] = None
    bind_cores: str = "none"
    rank_env: Tuple[Tuple[str, str], ...] = ()


def run_spec(opts: RunOptions, environ: Mapping[str, str]) -> RunSpec:
    """Parse ``opts`` (with the launcher's environment, for ``$framework`` and the operator's recovery
    variables) into the run's specs, once.

    Raises:
        UsageError: an option that does not parse (one line, exit 2).
    """
    return RunSpec(
        command=tuple(opts.command), framework=opts.resolved_framework(dict(environ)),
        restart=restart_spec(opts, environ), hangs=hang_rules(opts), restore=restore_spec(vars(opts)),
        preload=preload_spec(opts), cluster=cluster_spec(opts),
        output=OutputSpec(opts.log_dir, opts.console_ranks, opts.metrics_port, opts.metrics_textfile, opts.dry_run,
                          opts.json_output),
        debug=DebugSpec(opts.debug_rank, opts.pdb), run_dir=opts.run_dir, run_id=opts.run_id,
        job_name=opts.job_name, role=opts.role, hccl_if_ip=opts.hccl_if_ip, bind_cores=opts.bind_cores,
        rank_env=tuple(opts.rank_env))


def restart_spec(opts: RunOptions, environ: Mapping[str, str]) -> RestartSpec:
    """The restart group of ``opts``; the recovery strategy from the option or the operator's variables."""
    return RestartSpec(
        max_restarts=opts.max_restarts, backoff=opts.restart_backoff, backoff_max=opts.restart_backoff_max,
        stop_timeout=opts.stop_timeout, strategy=resolve_strategy(opts.recover_strategy, environ),
        max_no_progress_restarts=opts.max_no_progress_restarts, no_progress_exit_code=opts.no_progress_exit_code,
        node_fault_exit_code=opts.node_fault_exit_code, device_wait_timeout=opts.device_wait_timeout,
        health_check=opts.health_check or None, gasp_timeout=opts.resolved_gasp_timeout(),
        gasp_signal=parse_signal(opts.gasp_signal), gasp_min_interval=opts.gasp_min_interval,
        graceful_exit=opts.graceful_exit)


def hang_rules(opts: RunOptions) -> HangRules:
    """The hang detector's timeouts from ``--heartbeat-timeout`` and its siblings (off by default)."""
    return HangRules(opts.heartbeat_timeout, opts.heartbeat_initial_timeout,
                     MappingProxyType(dict(opts.section_timeout)), opts.max_no_progress_restarts,
                     opts.straggler_threshold)


def restore_spec(values: Mapping[str, Any]) -> RestoreSpec:
    """The restore group from option values by option name (``RunOptions`` fields, or ``launcher plan``'s
    parameters, which use the same names and the same ``--fault-ranks`` type)."""
    return RestoreSpec(
        fault_npus_path=values.get("fault_npus") or None, reset_json_path=values.get("reset_json") or None,
        extra_fault_ranks=tuple(values.get("fault_ranks") or ()), group_info_root=values.get("group_info_root"),
        groups_file=values.get("groups_file"), dp=values.get("dp"), tp=values.get("tp"), pp=values.get("pp"),
        checkpoint_dir=values.get("checkpoint_dir") or None, checkpoint_pattern=values.get("checkpoint_pattern"),
        checkpoint_marker=values.get("checkpoint_marker"), strategy_file=values.get("strategy_file"))


def preload_spec(opts: RunOptions) -> PreloadSpec:
    """``--preload`` and ``--preload-max-rss`` for the run's command."""
    from launcher.jobspec.preload import preload_mode, python_entry

    auto, modules = preload_mode(opts.preload)
    return PreloadSpec(auto, modules, int(opts.preload_max_rss * (1 << 20)), python_entry(opts.command) is not None)


def cluster_spec(opts: RunOptions) -> ClusterSpec:
    """The cluster group of ``opts``, ``--coordinator``'s URL parsed."""
    coordinator = None
    if opts.coordinator:
        coordinator = CoordinatorSpec(
            opts.coordinator, tuple(parse_coordinator(opts.coordinator)), coordinator_tls(opts.coordinator),
            opts.coordinator_ttl, opts.coordinator_cacert, opts.coordinator_cert, opts.coordinator_key,
            opts.coordinator_user, opts.coordinator_password_file)
    return ClusterSpec(
        rank_table=opts.rank_table, rank_table_timeout=opts.rank_table_timeout, server_id=opts.server_id,
        nproc_per_node=opts.nproc_per_node, nnodes=opts.nnodes, min_nodes=opts.min_nodes, node_rank=opts.node_rank,
        master_addr=opts.master_addr, master_port=opts.master_port, coordinator=coordinator, sync_dir=opts.sync_dir,
        sync_timeout=opts.sync_timeout, elastic_wait=opts.elastic_wait, taskd=opts.taskd, taskd_port=opts.taskd_port)
