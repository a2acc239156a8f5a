"""``launcher run [OPTIONS] -- COMMAND [ARGS]...``: parse, then delegate to ``launcher.runner``."""

from typing import Any, Callable, Optional

import click

from launcher.options import (DEFAULT_FAULT_NPUS, DEFAULT_RESET_JSON, FRAMEWORKS, TASKD_DEFAULT_PORT, RunOptions,
                              env_var_for, load_config)


def _load_config(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> Optional[str]:
    # Eager: runs before the other options, so the file becomes their default_map and click's
    # precedence (command line > environment > default_map > default) applies unchanged.
    if value:
        ctx.default_map = {**(ctx.default_map or {}), **load_config(value)}
    return value


def _ip_address(_ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> Optional[str]:
    import ipaddress

    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not an IPv4 or IPv6 address") from None
    return value


def _opt(*decls: str, **kwargs: Any) -> Callable:
    """A ``run`` option that can also be set as ``LAUNCHER_<NAME>`` in the environment."""
    name = decls[0].lstrip("-").replace("-", "_")
    kwargs.setdefault("envvar", env_var_for(name))
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


# Options after the command belong to the command: `launcher run --x 1 python t.py --y 2`.
@click.command(context_settings={"allow_interspersed_args": False, "show_default": True})
@click.option("--config", type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
              callback=_load_config, envvar="LAUNCHER_CONFIG", show_envvar=True,
              help="YAML file holding any run option (keys as option names).")
@_opt("--rank-table", type=click.Path(dir_okay=False),
      help="Rank table (hccl.json). Default: $RANK_TABLE_FILE, else "
           "/user/serverid/devindex/config/hccl.json when it exists.")
@_opt("--rank-table-timeout", type=click.FloatRange(min=0), default=300.0,
      help="Seconds to wait for the rank table's status to become 'completed'.")
@_opt("--nproc-per-node", type=click.IntRange(min=1),
      help="Build the rank table here: N ranks per node (torchrun style, no hccl.json).")
@_opt("--nnodes", type=click.IntRange(min=1), default=1, help="Number of nodes (with --nproc-per-node).")
@_opt("--node-rank", type=click.IntRange(min=0), default=0, help="This node's index (with --nproc-per-node).")
@_opt("--master-addr", help="Rendezvous address (default: the server hosting rank 0 / 127.0.0.1).")
@_opt("--master-port", type=click.IntRange(1, 65535),
      help="Rendezvous port (default 29500; MindSpore scheduler 8118).")
@_opt("--server-id", help="This server's address in the rank table (default $XDL_IP, $POD_IP, host addresses).")
@_opt("--framework", type=click.Choice(FRAMEWORKS, case_sensitive=False),
      help="Environment flavour for the ranks (default: $framework, else pytorch).")
@_opt("--max-restarts", type=click.IntRange(min=0), default=0,
      help="Restart the local group this many times after a rank fails.")
@_opt("--restart-backoff", type=click.FloatRange(min=0), default=0.0,
      help="Seconds to wait between a failure and the restart.")
@_opt("--stop-timeout", type=click.FloatRange(min=0), default=10.0,
      help="Seconds between SIGTERM and SIGKILL when stopping the group after a failure.")
@_opt("--gasp-timeout", "--grace-period", type=click.FloatRange(min=0),
      help="Seconds ranks get to save and exit after prestop / SIGTERM / SIGINT before SIGKILL "
           "(default: --termination-grace-period minus a margin of 5 s or 10 %).")
@_opt("--termination-grace-period", type=click.FloatRange(min=1), default=30.0,
      help="The pod's terminationGracePeriodSeconds, which the gasp must fit in.")
@_opt("--gasp-signal", default="SIGTERM", help="Signal asking a rank to save its dying-gasp checkpoint.")
@_opt("--gasp-min-interval", type=click.FloatRange(min=0), default=0.0,
      help="A gasp within this many seconds of the previous one stops the ranks without the save "
           "signal (crash loops; the seed's rule is 60). 0 disables.")
@_opt("--log-dir", type=click.Path(file_okay=False),
      help="Per-rank log files: DIR/<session>/attempt_<n>/rank_<r>.log (default: <run-dir>/logs).")
@_opt("--console-ranks", default="all", help="Ranks whose output is shown on the console: all, none, or 0,3,5-7.")
@_opt("--run-dir", type=click.Path(file_okay=False),
      help="Private state directory: pid, state, events.jsonl (default $XDG_RUNTIME_DIR/launcher "
           "or /tmp/launcher-<uid>).")
@_opt("--run-id", help="Job id for TORCHELASTIC_RUN_ID / JOB_ID (default $MINDX_TASK_ID, else a digest of "
                        "what every node of the job shares: rank table or master/nnodes, and the command).")
@_opt("--group-info-root", type=click.Path(file_okay=False),
      help="Hybrid-parallel restore: every rank gets GROUP_INFO_FILE=<root>/device<RANK_ID>/group_info.pb "
           "and the restore plan reads them (default: no GROUP_INFO_FILE).")
@_opt("--graceful-exit", is_flag=True,
      help="Framework graceful exit on request: MindSpore ranks get MS_ENABLE_GRACEFUL_EXIT=1, which "
           "OnRequestExit needs (an MS_ENABLE_GRACEFUL_EXIT already set is kept).")
@_opt("--hccl-if-ip", callback=_ip_address,
      help="HCCL_IF_IP for every rank (default: XDL_IP with host networking, else unset; an HCCL_IF_IP "
           "already set is kept).")
@_opt("--checkpoint-dir", type=click.Path(file_okay=False),
      help="Checkpoints as <dir>/rank_<r>/...: compute a restore plan before every (re)start and "
           "hand each rank RESTORE_RANKS, RESTORE_RANKS_MAP and LAUNCHER_RESUME_*.")
@_opt("--checkpoint-pattern", help="Checkpoint file-name regex with (?P<step>...) (and (?P<epoch>...)).")
@_opt("--fault-npus", default=DEFAULT_FAULT_NPUS, help="The cluster's fault-npus file (faulty ranks).")
@_opt("--reset-json", default=DEFAULT_RESET_JSON, help="MindCluster's reset.json (rank statuses).")
@_opt("--fault-ranks", help="Ranks to treat as faulty in the restore plan, e.g. 3,5.")
@_opt("--groups-file", type=click.Path(dir_okay=False), help="Replica groups (JSON/YAML) for the restore plan.")
@_opt("--dp", type=click.IntRange(min=1), help="Data-parallel size: replica groups from a dp x tp x pp layout.")
@_opt("--tp", type=click.IntRange(min=1), help="Tensor-parallel size (with --dp).")
@_opt("--pp", type=click.IntRange(min=1), help="Pipeline-parallel size (with --dp).")
@_opt("--recover-strategy",
      help="Comma-separated: retry, recover, recover-in-place, dump, exit, elastic-training (default: "
           "from HIGH_AVAILABILITY / MS_ENABLE_TFT / PROCESS_RECOVER, else retry).")
@_opt("--sync-dir", type=click.Path(file_okay=False),
      help="Directory on storage shared by every node: the launchers of the job restart together "
           "(restart generations under DIR/<run-id>/; needs the same --run-id everywhere).")
@_opt("--sync-timeout", type=click.FloatRange(min=0), default=300.0,
      help="With --sync-dir: seconds to wait for the other nodes at a restart barrier before exiting 1.")
@_opt("--taskd", type=click.Choice(["auto", "on", "off"]), default="auto",
      help="MindCluster TaskD manager on the node hosting rank 0, libtaskd.so preloaded in every rank "
           "(auto: when the taskd package is installed and TASKD_PROCESS_ENABLE is not off).")
@_opt("--taskd-port", type=click.IntRange(1, 65535), default=TASKD_DEFAULT_PORT,
      help="The TaskD manager's port, checked free before it starts.")
@_opt("--dry-run", is_flag=True, help="Resolve and print everything without spawning.")
@click.option("--json", "json_output", is_flag=True, help="With --dry-run: one JSON object.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(**kwargs: Any) -> int:
    """Start one process per local rank, supervise them, and restart the group on failure.

    Examples:

      launcher run --nproc-per-node 4 -- python train.py

      launcher run --rank-table /user/serverid/devindex/config/hccl.json -- python train.py
    """
    from launcher.runner import execute

    kwargs["command"] = tuple(kwargs["command"])
    if kwargs.get("framework"):
        kwargs["framework"] = kwargs["framework"].lower()
    return execute(RunOptions(**kwargs))
