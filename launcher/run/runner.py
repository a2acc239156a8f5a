"""``launcher run``: resolve the job, then hand it to the supervisor and report how it ended."""

import dataclasses
import json
import logging
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple

from launcher.supervision import debugging
from launcher.common import envnames
from launcher.jobspec import hostfacts, topology
from launcher.common.errors import UsageError
from launcher.common.programs import which
from launcher.jobspec.options import RunOptions, check_sync_options
from launcher.jobspec.runspec import ClusterSpec, RunSpec, run_spec
from launcher.common.rundir import base_dir
from launcher.jobspec.rankenv import EnvContext, WorkerSpec, check_visible_devices, derived_run_id
from launcher.jobspec.topology import Topology

log = logging.getLogger(__name__)


def execute(opts: RunOptions, environ: Optional[Mapping[str, str]] = None) -> int:
    """Run the job described by ``opts``; returns the launcher's exit status."""
    environ = dict(os.environ if environ is None else environ)
    spec = run_spec(opts, environ)  # every option parsed, once: a mistake is exit 2 before anything runs
    check_command(spec.command, environ)
    spec, topo = resolve_topology(spec, environ)
    ctx = job_context(spec, topo, environ)
    check_visible_devices(ctx)
    debugging.check_options(spec.debug.rank, spec.debug.pdb, spec.command, topo.server.ranks)
    check_cluster(spec.cluster, topo, ctx.run_id, bool(spec.run_id or environ.get(envnames.MINDX_TASK_ID)), environ)
    if spec.output.dry_run:
        print_dry_run(ctx, *preview_first_attempt(spec, ctx), as_json=spec.output.json_output)
        return 0
    if not (spec.run_dir or environ.get(envnames.LAUNCHER_RUN_DIR)):
        from launcher.common import jobs

        jobs.prune(os.path.dirname(ctx.run_dir), exclude=[os.path.basename(ctx.run_dir)])
    from launcher.run.jobstart import JobStart  # the spawning machinery is not needed for --dry-run

    start = JobStart.begin()  # the first ranks' cgroup move runs while the session is imported
    try:
        from launcher.run.session import Session

        session = Session(spec, ctx, start)  # a run dir it refuses is exit 2: nothing must be left moving
    except BaseException:
        start.abandon()
        raise
    with session:
        return session.run()


def job_context(spec: RunSpec, topo: Topology, environ: Dict[str, str]) -> EnvContext:
    """The job-wide context every rank's environment is computed from."""
    run_id = spec.run_id or environ.get(envnames.MINDX_TASK_ID) or derived_run_id(topo, spec.command)
    root = spec.restore.group_info_root
    return EnvContext(framework=spec.framework, topology=topo, run_id=run_id,
                      max_restarts=spec.restart.max_restarts, run_dir=choose_run_dir(spec, environ),
                      group_info_root=os.path.abspath(root) if root else None, base_env=environ,
                      visible_devices=hostfacts.visible_devices(environ),
                      local_addresses=hostfacts.local_addresses(environ), hccl_if_ip=spec.hccl_if_ip,
                      role=spec.role, extra=dict(spec.rank_env))


def check_cluster(cluster: ClusterSpec, topo: Topology, run_id: str, chosen_id: bool,
                  environ: Mapping[str, str]) -> None:
    """The options that join this node to the others, checked against the job before anything runs.

    Raises:
        UsageError: both coordination options, a run id the nodes cannot share, a coordinator that
            cannot be used (TLS files, user and password), elastic options without a coordinator.
    """
    if cluster.sync_dir and cluster.coordinator:
        raise UsageError("--sync-dir and --coordinator: choose one")
    if cluster.coordinated:
        check_sync_options(run_id, chosen_id, topo.table.server_count,
                           "--coordinator" if cluster.coordinator else "--sync-dir")
    if cluster.coordinator:
        from launcher.cluster.etcdconf import coordinator_client

        coordinator_client(cluster.coordinator, environ)  # TLS files, user and password: exit 2 before anything runs
    if cluster.min_nodes is not None and not cluster.coordinator:
        raise UsageError(f"--nnodes {cluster.min_nodes}:{cluster.nnodes} (elastic) needs --coordinator etcd://...")
    if cluster.min_nodes is not None and cluster.min_nodes > topo.table.server_count:
        raise UsageError(f"--nnodes {cluster.min_nodes}:{cluster.nnodes}: MIN is above the job's "
                         f"{topo.table.server_count} server(s)")


def scheduler_address(host: str) -> str:
    """MindSpore's scheduler address (``MS_SCHED_HOST``) must be an IP address: a host name is resolved
    here, once, as msrun resolves its ``--master_addr``.

    Raises:
        UsageError: the name does not resolve.
    """
    import ipaddress
    import socket

    name = host.strip("[]")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        address = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError, IndexError) as exc:
        raise UsageError(f"--master-addr {host}: MindSpore's scheduler needs an IP address, and {host!r} does not "
                         f"resolve ({exc})") from None
    log.info("--master-addr %s is %s (MindSpore's scheduler takes an IP address, as msrun resolves it)", host,
             address)
    return address


def choose_run_dir(spec: RunSpec, environ: Mapping[str, str]) -> str:
    """``--run-dir`` (or ``LAUNCHER_RUN_DIR``), else a run dir of the job's own under the base dir:
    ``<base>/<job name>`` (``launcher.common.jobs.job_name``), so two jobs on one machine never share one."""
    explicit = spec.run_dir or environ.get(envnames.LAUNCHER_RUN_DIR)
    if explicit:
        return os.path.abspath(explicit)
    from launcher.common.jobs import job_name

    chosen_id = spec.run_id or environ.get(envnames.MINDX_TASK_ID)
    return os.path.join(os.path.abspath(base_dir(dict(environ))), job_name(spec.job_name, chosen_id))


def preview_first_attempt(spec: RunSpec, ctx: EnvContext):
    """The first attempt's specs and restore plan, exactly as ``run`` would build them, no side effects."""
    from launcher.cluster.taskd import job_rank_env
    from launcher.control.gasp import GASP_STATE, GaspGate
    from launcher.run.attempt import attempt_specs

    gate = GaspGate(os.path.join(ctx.run_dir, GASP_STATE), spec.restart.gasp_min_interval)
    log_session = os.path.join(os.path.abspath(spec.output.log_dir or os.path.join(ctx.run_dir, "logs")), "<session>")
    return attempt_specs(spec, ctx, 0, (), log_session=log_session, gasp_allowed=gate.allowed(),
                         rank_env=job_rank_env(spec.cluster.taskd, ctx.base_env))


def check_command(command: Sequence[str], environ: Mapping[str, str]) -> None:
    """Fail early, with exit 2, when the command cannot be found or executed."""
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UsageError(f"command not found or not executable: {program}")
    elif which(program, environ) is None:
        here = os.path.isfile(program)  # the shell's habit: a file here runs only as ./NAME
        raise UsageError(f"command not found: {program}",
                         [f"(searched $PATH; to run the file in this directory, write ./{program})" if here
                          else "(searched $PATH)"])


def resolve_topology(spec: RunSpec, environ: Mapping[str, str]) -> Tuple[RunSpec, Topology]:
    """The rank table (waiting for the cluster to complete it) and this server's entry; for MindSpore,
    the spec with ``--master-addr`` resolved to the IP address its scheduler needs."""
    cluster = spec.cluster
    if spec.framework == "mindspore" and cluster.master_addr:
        cluster = dataclasses.replace(cluster, master_addr=scheduler_address(cluster.master_addr))
        spec = dataclasses.replace(spec, cluster=cluster)
    path = topology.rank_table_path(cluster, environ)
    table = None
    if path is not None:
        from launcher.common.gcpause import end_startup_pause
        from launcher.jobspec.ranktable.wait import wait_for_rank_table

        end_startup_pause()  # waiting for the cluster may take minutes: the collector is back on first

        # Absolute: ranks get it as RANK_TABLE_FILE and may change directory before opening it.
        table = wait_for_rank_table(os.path.abspath(path), timeout=cluster.rank_table_timeout)
    return spec, topology.resolve(cluster, spec.framework, environ, table)


def print_dry_run(ctx: EnvContext, specs: Sequence[WorkerSpec], plan: object, as_json: bool) -> None:
    """Print what ``run`` would start, without starting it."""
    topo = ctx.topology
    doc = {
        "framework": ctx.framework,
        "source": topo.source,
        "rank_table_file": topo.table_file,
        "world_size": topo.table.world_size,
        "server": {"index": topo.server_index, "server_id": topo.server.server_id,
                   "addresses": list(topo.server.addresses)},
        "master_addr": topo.table.master_addr,
        "master_port": topo.master_port,
        "run_dir": ctx.run_dir,
        "restore_plan": plan.to_json() if plan is not None else None,
        "ranks": [{"rank": s.rank, "local_rank": s.local_rank, "device_id": s.device_id, "role": s.role,
                   "env": dict(s.env), "argv": list(s.argv)} for s in specs],
    }
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    print(f"framework {ctx.framework}; ranks from {topo.source}; world size {topo.table.world_size}")
    print(f"this server: #{topo.server_index} {'/'.join(topo.server.addresses)}; "
          f"master {topo.table.master_addr}:{topo.master_port}")
    if plan is not None:
        print(plan.format_table())
    for rank in doc["ranks"]:
        print(f"\n{rank['role']} rank={rank['rank']} local_rank={rank['local_rank']} device={rank['device_id']}")
        print("  argv: " + " ".join(rank["argv"]))
        for key in sorted(rank["env"]):
            print(f"  {key}={rank['env'][key]}")
