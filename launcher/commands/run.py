"""``launcher run [OPTIONS] [--] COMMAND [ARGS]...``: parse, then delegate to ``launcher.run.runner``."""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import click

from launcher.commands import torchrun
from launcher.jobspec.options import (DEFAULT_FAULT_NPUS, DEFAULT_RESET_JSON, FRAMEWORKS, TASKD_DEFAULT_PORT,
                                      RunOptions, SignalType, env_var_for, load_config)

log = logging.getLogger(__name__)

#: ``launcher run --help`` in sections: title -> the options it shows, by their long name. Every shown
#: option is in exactly one section (tests/unit/test_cli.py checks it).
HELP_SECTIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("Where the ranks come from", ("--rank-table", "--rank-table-timeout", "--server-id", "--framework")),
    ("Local runs, torchrun style (no rank table)", ("--nproc-per-node", "--nnodes", "--node-rank",
                                                     "--master-addr", "--master-port")),
    ("How COMMAND runs", ("--no-python", "--module", "--preload", "--preload-max-rss")),
    ("Supervision and restarts", ("--max-restarts", "--restart-backoff", "--restart-backoff-max", "--stop-timeout",
                                  "--recover-strategy",
                                  "--gasp-timeout", "--termination-grace-period", "--gasp-signal",
                                  "--gasp-min-interval", "--graceful-exit")),
    ("Failures before the ranks run", ("--no-progress-exit-code", "--device-wait-timeout", "--health-check",
                                       "--node-fault-exit-code")),
    ("Hangs and stragglers", ("--heartbeat-timeout", "--heartbeat-initial-timeout", "--section-timeout",
                              "--max-no-progress-restarts", "--straggler-threshold")),
    ("Logs and state", ("--console-ranks", "--log-dir", "--run-dir", "--job-name", "--run-id", "--metrics-port",
                        "--metrics-textfile")),
    ("Debugging a rank", ("--debug-rank", "--pdb")),
    ("Restore from checkpoints", ("--checkpoint-dir", "--checkpoint-pattern", "--strategy-file", "--dp", "--tp", "--pp",
                                  "--groups-file", "--fault-ranks", "--group-info-root")),
    ("Cluster integration (MindCluster, several machines)", ("--reset-json", "--fault-npus", "--hccl-if-ip",
                                                             "--coordinator", "--coordinator-ttl", "--elastic-wait",
                                                             "--sync-dir", "--sync-timeout", "--taskd",
                                                             "--taskd-port")),
    ("Other options", ("--config", "--dry-run", "--json", "--help")),
)


def long_name(param: click.Parameter) -> str:
    """The name an option is listed by in ``HELP_SECTIONS``: its first ``--`` spelling."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


class RunCommand(click.Command):
    """``run``: torchrun's spellings and options too, a warning for launcher options after the
    command, and the help in sections."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # After the decorated options, before COMMAND: added here so the decorator list stays the
        # launcher's own options.
        arguments = [p for p in self.params if isinstance(p, click.Argument)]
        self.params[:] = [p for p in self.params if not isinstance(p, click.Argument)]
        self.params.extend(torchrun.command_options() + torchrun.hidden_options() + arguments)

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        misplaced, program = options_after_command(args, self.params)
        if misplaced:
            verb = "is" if len(misplaced) == 1 else "are"
            log.warning("%s after the command %s passed to %s, not to the launcher: put launcher options before "
                        "%s (or -- before %s if it takes %s itself)", ", ".join(misplaced), verb, program,
                        program, program, "it" if len(misplaced) == 1 else "them")
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: Dict[str, Tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                records[long_name(param)] = record
        for title, names in HELP_SECTIONS:
            rows = [records.pop(name) for name in names if name in records]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        if records:  # an option not in HELP_SECTIONS yet is still shown
            with formatter.section("Unsorted options"):
                formatter.write_dl(list(records.values()))


def options_after_command(args: Sequence[str], params: Sequence[click.Parameter]) -> Tuple[List[str], str]:
    """Launcher options written after the command (which receives them), unless ``--`` marks the command.

    Returns:
        The misplaced options as written, and the command's program name.
    """
    takes_value: Dict[str, bool] = {}
    for param in params:
        if isinstance(param, click.Option):
            for opt in param.opts + param.secondary_opts:
                takes_value[torchrun.normalize_token(opt)] = not (param.is_flag or param.count)
    index = 0
    while index < len(args):
        token = args[index]
        if token == "--":
            return [], ""
        if not token.startswith("-") or token == "-":
            break
        name, equals, _ = token.partition("=")
        index += 2 if takes_value.get(torchrun.normalize_token(name)) and not equals else 1
    else:
        return [], ""
    # Long options only: a short one after the command is more likely the command's own (python -m).
    misplaced = [token.partition("=")[0] for token in args[index + 1:]
                 if token.startswith("--") and torchrun.normalize_token(token.partition("=")[0]) in takes_value]
    return list(dict.fromkeys(misplaced)), args[index]


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


def _check_section_timeouts(_ctx: click.Context, _param: click.Parameter, value: Any) -> Tuple[str, ...]:
    from launcher.jobspec.options import parse_section_timeouts

    try:
        parse_section_timeouts(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return tuple(value)


def _check_preload(_ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> Optional[str]:
    from launcher.jobspec.preload import parse_modules

    parse_modules(value)  # UsageError: one line, exit 2 (--dry-run too)
    return value


def _opt(*decls: str, **kwargs: Any) -> Callable:
    """A ``run`` option that can also be set as ``LAUNCHER_<NAME>`` in the environment."""
    name = decls[0].lstrip("-").replace("-", "_")
    kwargs.setdefault("envvar", env_var_for(name))
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


# Options after the command belong to the command: `launcher run --x 1 python t.py --y 2`.
@click.command(cls=RunCommand, context_settings={"allow_interspersed_args": False, "show_default": True,
                                                 "token_normalize_func": torchrun.normalize_token})
@click.option("--config", type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
              callback=_load_config, envvar="LAUNCHER_CONFIG", show_envvar=True,
              help="YAML file holding any run option (keys as option names).")
@_opt("--rank-table", type=click.Path(dir_okay=False),
      help="Rank table file (hccl.json) listing the job's servers and devices. Default: $RANK_TABLE_FILE, "
           "else /user/serverid/devindex/config/hccl.json when it exists.")
@_opt("--rank-table-timeout", type=click.FloatRange(min=0), default=300.0,
      help="Seconds to wait for the cluster to finish writing the rank table.")
@_opt("--nproc-per-node", type=torchrun.NprocType(),
      help="Start N ranks on this machine, no rank table needed; auto, cpu or npu count the devices.")
@_opt("--nnodes", type=torchrun.NnodesType(), default=1,
      help="Number of machines (with --nproc-per-node); MIN:MAX with --coordinator: elastic, the job goes on "
           "with at least MIN when a machine is lost.")
@_opt("--node-rank", type=click.IntRange(min=0), default=0, help="This machine's index, from 0 (with --nproc-per-node).")
@_opt("--master-addr", help="Address of the machine running rank 0 (default: from the rank table, else 127.0.0.1).")
@_opt("--master-port", type=click.IntRange(1, 65535),
      help="Port rank 0 listens on (default: a free port for a one-machine job; across machines 29500, "
           "MindSpore 8118).")
@_opt("--server-id", help="This machine's address in the rank table (default $XDL_IP, $POD_IP, its own addresses).")
@_opt("--framework", type=click.Choice(FRAMEWORKS, case_sensitive=False),
      help="Which framework's environment variables the ranks get (default: $framework, else pytorch).")
@_opt("--max-restarts", type=click.IntRange(min=0), default=0,
      help="Restart the ranks of this machine up to N times after one fails.")
@_opt("--no-progress-exit-code", type=click.IntRange(min=1, max=255), default=93,
      help="Exit status when the job cannot progress: the same start-up error twice in a row, "
           "--max-no-progress-restarts, or the restart budget spent without a higher step (for a Volcano "
           "policy exitCode -> AbortJob or a podFailurePolicy; docs/failures.md).")
@_opt("--device-wait-timeout", type=click.FloatRange(min=0), default=60.0,
      help="Before a rank starts: wait up to this many seconds while another process holds its NPU "
           "(/dev/davinciN open, or listed by npu-smi); then start anyway (0: do not wait).")
@_opt("--health-check", metavar="CMD",
      help="Run CMD (a shell command) before each attempt, with LAUNCHER_DEVICES set to the node's "
           "devices; a non-zero exit ends the node's part with --node-fault-exit-code.")
@_opt("--node-fault-exit-code", type=click.IntRange(min=1, max=255), default=94,
      help="Exit status when --health-check fails: the node is faulty, reschedule the pod elsewhere.")
@_opt("--restart-backoff", type=click.FloatRange(min=0), default=0.5,
      help="Crash-loop backoff: a restart is immediate, unless the attempt before it also failed "
           "within 60 s of its start; then the delay starts at this many seconds and doubles.")
@_opt("--restart-backoff-max", type=click.FloatRange(min=0), default=30.0,
      help="Cap of the crash-loop backoff delay (0: always restart at once).")
@_opt("--stop-timeout", type=click.FloatRange(min=0), default=10.0,
      help="After a rank fails: seconds the others get to exit after SIGTERM, before SIGKILL.")
@_opt("--heartbeat-timeout", type=click.FloatRange(min=0), default=0.0,
      help="A rank with no heartbeat and no output for this many seconds is hung: its stacks and every "
           "local rank's are dumped, then it is failed and the job restarts within --max-restarts (0: off).")
@_opt("--heartbeat-initial-timeout", type=click.FloatRange(min=0),
      help="Seconds a rank may take to its first heartbeat or output line (start-up, model load); "
           "default: --heartbeat-timeout.")
@_opt("--section-timeout", multiple=True, callback=_check_section_timeouts, metavar="NAME=SECONDS",
      help="Longest stay in a named section (launcher_heartbeat.section(NAME)); repeatable.")
@_opt("--max-no-progress-restarts", type=click.IntRange(min=0), default=0,
      help="End the job after this many restarts in a row whose ranks reached no higher heartbeat step "
           "than before (a crash loop at one step; 0: off).")
@_opt("--straggler-threshold", type=click.FloatRange(min=0, max=1, max_open=True), default=0.0,
      help="Name a rank (event straggler) whose heartbeat step rate stays this fraction below its peers' "
           "median for 5 s, e.g. 0.2 (0: off).")
@_opt("--gasp-timeout", "--grace-period", type=click.FloatRange(min=0),
      help="When the job is stopped (SIGTERM, Ctrl-C, launcher prestop): seconds the ranks get to save a "
           "checkpoint and exit, before SIGKILL (default: --termination-grace-period minus 5 s or 10 %).")
@_opt("--termination-grace-period", type=click.FloatRange(min=1), default=30.0,
      help="Seconds Kubernetes gives the pod to stop (terminationGracePeriodSeconds); the save must fit.")
@_opt("--gasp-signal", type=SignalType(), default="SIGTERM",
      help="Signal asking a rank to save a checkpoint and exit (a catchable signal, by name or number).")
@_opt("--gasp-min-interval", type=click.FloatRange(min=0), default=0.0,
      help="Stopped again within this many seconds (a crash loop): stop the ranks without asking them "
           "to save. 0: always ask.")
@_opt("--log-dir", type=click.Path(file_okay=False),
      help="Per-rank log files: DIR/<session>/attempt_<n>/rank_<r>.log (default: <run-dir>/logs).")
@_opt("--console-ranks", default="all", help="Ranks whose output is shown here: all, none, or a list like 0,3,5-7.")
@_opt("--run-dir", type=click.Path(file_okay=False),
      help="The launcher's own state: pid, rank states, events.jsonl (default: <base>/<job name>, base "
           "$XDG_RUNTIME_DIR/launcher or /tmp/launcher-<uid>).")
@_opt("--job-name", help="Name of the job's run dir under the base (default: --run-id or $MINDX_TASK_ID "
                         "when given, else <date>-<time>-<pid>); `launcher prestop --job NAME` finds it.")
@_opt("--run-id", help="The job's id, the same on every machine (default $MINDX_TASK_ID, else a digest of "
                        "what every machine of the job shares: the rank table or master address, and the command).")
@_opt("--metrics-port", type=click.IntRange(0, 65535),
      help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port, see the "
           "metrics_listening event; default: off; needs the `metrics` extra).")
@_opt("--metrics-textfile", type=click.Path(dir_okay=False),
      help="Write Prometheus metrics to FILE after every attempt and at the end (node_exporter textfile "
           "collector; default: off).")
@_opt("--group-info-root", type=click.Path(file_okay=False),
      help="MindSpore hybrid-parallel restore: each rank writes DIR/device<rank>/group_info.pb (GROUP_INFO_FILE) "
           "and the restore plan reads them (default: no GROUP_INFO_FILE).")
@_opt("--graceful-exit", is_flag=True,
      help="MindSpore stop-on-request: ranks get MS_ENABLE_GRACEFUL_EXIT=1, which OnRequestExit needs "
           "(a value already set is kept).")
@_opt("--hccl-if-ip", callback=_ip_address,
      help="Network address HCCL uses on this machine (HCCL_IF_IP; default: XDL_IP with host networking, "
           "else unset; a value already set is kept).")
@_opt("--checkpoint-dir", type=click.Path(file_okay=False),
      help="Where the ranks save checkpoints, as DIR/rank_<r>/...: before every (re)start the launcher "
           "picks the newest complete one and tells each rank which file to load.")
@_opt("--checkpoint-pattern", help="Regex of checkpoint file names, with (?P<step>...) and optionally "
                                  "(?P<epoch>...).")
@_opt("--strategy-file", type=click.Path(dir_okay=False),
      help="MindSpore: this world's sharding-strategy file; a checkpoint step another world size wrote "
           "(DIR/manifests/) is converted to it before the ranks start.")
@_opt("--fault-npus", default=DEFAULT_FAULT_NPUS, help="The cluster's list of faulty devices.")
@_opt("--reset-json", default=DEFAULT_RESET_JSON, help="The cluster's reset.json (status of every rank), followed while the job runs.")
@_opt("--fault-ranks", help="Ranks whose checkpoints must not be loaded, e.g. 3,5.")
@_opt("--groups-file", type=click.Path(dir_okay=False), help="Ranks holding the same model copy (JSON/YAML list of rank lists).")
@_opt("--dp", type=click.IntRange(min=1), help="Data-parallel size: ranks holding the same model copy follow a dp x tp x pp layout.")
@_opt("--tp", type=click.IntRange(min=1), help="Tensor-parallel size (with --dp).")
@_opt("--pp", type=click.IntRange(min=1), help="Pipeline-parallel size (with --dp).")
@_opt("--recover-strategy",
      help="What to do when a rank fails, comma-separated: retry, recover, recover-in-place, dump, exit, "
           "elastic-training (default: "
           "from HIGH_AVAILABILITY / MS_ENABLE_TFT / PROCESS_RECOVER, else retry).")
@_opt("--coordinator", metavar="etcd://HOST:PORT[,HOST:PORT]",
      help="etcd that the launchers of the job restart together through, with leases: a machine whose "
           "launcher dies is seen as lost within --coordinator-ttl (needs the same --run-id everywhere).")
@_opt("--coordinator-ttl", type=click.IntRange(min=1), default=5,
      help="With --coordinator: seconds of silence after which a machine's launcher counts as lost.")
@_opt("--elastic-wait", type=click.FloatRange(min=0), default=30.0,
      help="With --nnodes MIN:MAX: seconds to wait for a replacement of a lost machine before going on "
           "without it, and at the start, once MIN machines joined, for the others (torchrun's "
           "last_call_timeout).")
@_opt("--sync-dir", type=click.Path(file_okay=False),
      help="Directory every machine of the job can write: their launchers restart together "
           "(needs the same --run-id everywhere).")
@_opt("--sync-timeout", type=click.FloatRange(min=0), default=300.0,
      help="With --sync-dir or --coordinator: seconds to wait for the other machines at a restart before "
           "exiting 1.")
@_opt("--taskd", type=click.Choice(["auto", "on", "off"]), default="auto",
      help="MindCluster TaskD (recovery of single processes): its manager runs next to rank 0 "
           "(auto: when the taskd package is installed and TASKD_PROCESS_ENABLE is not off).")
@_opt("--taskd-port", type=click.IntRange(1, 65535), default=TASKD_DEFAULT_PORT,
      help="The TaskD manager's port, checked free before it starts.")
@_opt("--debug-rank", type=click.IntRange(min=0),
      help="Give rank N this terminal (stdin, stdout, stderr, unprefixed) for breakpoint() / pdb; Ctrl-C "
           "goes to it first, and a stop after another rank fails leaves it alone until it exits.")
@_opt("--pdb", is_flag=True,
      help="Post-mortem: the first rank that raises runs pdb on this terminal before the job is stopped "
           "(Python commands only).")
@_opt("--preload", metavar="MODULES", callback=_check_preload,
      help="Warm standby ranks: per rank, a Python interpreter that already imported these modules "
           "(comma-separated, e.g. torch,numpy) becomes the rank on a restart, skipping start-up and imports. "
           "Python scripts and -m modules only; never modules that start threads or open devices "
           "(docs/warm-standby.md). Default: none.")
@_opt("--preload-max-rss", type=click.FloatRange(min=0), default=4096.0, metavar="MIB",
      help="Largest resident memory (MiB) a standby may use after its imports; above it the ranks start cold "
           "(0: no cap).")
@_opt("--dry-run", is_flag=True, help="Print every rank's command line and environment; start nothing.")
@click.option("--json", "json_output", is_flag=True, help="With --dry-run: one JSON object.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(**kwargs: Any) -> int:
    """Start one process per rank of this machine, watch them, and restart them all when one fails.

    A COMMAND ending in .py runs with the Python interpreter, as with torchrun; torchrun's option
    spellings work too (--nproc_per_node, --standalone, --rdzv-endpoint, ...).

    Examples:

      launcher run --nproc-per-node 4 train.py --lr 0.1

      launcher run --rank-table /user/serverid/devindex/config/hccl.json -- python train.py
    """
    from launcher.run.runner import execute

    return execute(run_options(click.get_current_context()))


def run_options(ctx: click.Context) -> RunOptions:
    """The ``RunOptions`` of a parsed ``run`` command line, torchrun's options translated.

    Raises:
        UsageError: torchrun options the launcher cannot honour, a missing ``.py`` script.
    """
    import os

    # Given by the user: on the command line, in the environment or in the --config file (default_map).
    explicit = [name for name in ctx.params
                if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)]
    params = dict(ctx.params)
    if isinstance(params["nnodes"], tuple):  # MIN:MAX: the table has MAX servers; MIN is elastic's floor
        params["min_nodes"], params["nnodes"] = params["nnodes"]
    kwargs = torchrun.translate(params, explicit)
    kwargs["command"] = torchrun.python_command(kwargs["command"], kwargs.pop("no_python"), kwargs.pop("module"),
                                                os.environ)
    if kwargs.get("framework"):
        kwargs["framework"] = kwargs["framework"].lower()
    return RunOptions(**kwargs)
