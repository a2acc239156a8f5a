"""Every option of ``launcher run`` in one table: its click option, help section, environment
variable, config-file key and JSON schema, and its torchrun and msrun spellings.

A row is one option. Rows with a help ``section`` are the launcher's own (a ``RunOptions`` field of
the same name, a ``LAUNCHER_<NAME>`` variable, a key of the ``--config`` file); rows without one are
torchrun's or msrun's spellings of what the launcher does differently, each with its ``handling``:

* ``MAPPED``: translated onto launcher options by ``torchrun.translate`` / ``msrun.translate``;
* ``INFO``: accepted with one info line saying why it has no meaning here (``note``);
* ``REFUSED``: exit 2 with ``note`` saying what to do instead;
* ``NOT_YET``: a launcher option whose consumer is not in this build: refused, never ignored.

Adding an option: one row here, a ``RunOptions`` field of the same name and default (checked by
tests/unit/commands/test_optiontable.py), its place in one of the specs ``launcher.jobspec.runspec.run_spec``
builds (parsed there, once), and its consumer, which reads the spec. Two files are generated from the rows:
``python -m launcher.commands.optiontable > schemas/launcher.schema.json`` and, for ``run``'s fast parser,
``python -m launcher.commands.indexgen > launcher/commands/optionindex.py`` (tests say when either is stale).
"""

import json
from typing import Any, Dict, List, Optional, Tuple

import click

from launcher.commands.optionrow import FLAG, INFO, MAPPED, NOT_YET, OWN, REFUSED, Row
from launcher.common import envnames
from launcher.commands.optiontypes import NnodesType, NprocType, RankFilterType, RankListType, SignalType
from launcher.jobspec.options import (DEFAULT_FAULT_NPUS, DEFAULT_RESET_JSON, FRAMEWORKS, TASKD_DEFAULT_PORT, load_config,
                                      parse_section_timeouts)

__all__ = ["FLAG", "INFO", "MAPPED", "NOT_YET", "OWN", "REFUSED", "Row", "ROWS", "SECTIONS", "click_options",
           "foreign_rows", "help_sections", "json_schema", "schema_text"]

RANKS = "Where the ranks come from"
LOCAL = "Local runs, torchrun style (no rank table)"
COMMAND = "How COMMAND runs"
SUPERVISION = "Supervision and restarts"
FAILURES = "Failures before the ranks run"
HANGS = "Hangs and stragglers"
LOGS = "Logs and state"
DEBUG = "Debugging a rank"
RESTORE = "Restore from checkpoints"
CLUSTER = "Cluster integration (MindCluster, several machines)"
OTHER = "Other options"
#: ``launcher run --help`` shows the sections in this order.
SECTIONS = (RANKS, LOCAL, COMMAND, SUPERVISION, FAILURES, HANGS, LOGS, DEBUG, RESTORE, CLUSTER, OTHER)


# --------------------------------------------------------------------------- callbacks (checked at parse time)

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


def _check_bind_cores(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from launcher.jobspec.binding import parse_bind_cores

    parse_bind_cores(value)  # UsageError: one line, exit 2 (--dry-run too)
    return value


def _section_timeouts(_ctx: click.Context, _param: click.Parameter, value: Any) -> Tuple[Tuple[str, float], ...]:
    try:
        return tuple(parse_section_timeouts(value).items())
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


# --------------------------------------------------------------------------- the table

def _own(name: str, type_: Any, default: Any, section: str, help_: str, **kwargs: Any) -> Row:
    return Row(name, type_, default, section, help_, **kwargs)


def _torchrun(name: str, spelling: str, handling: str, note: str = "", type_: Any = None, **kwargs: Any) -> Row:
    return Row("torchrun_" + name, type_, None, None, torchrun=spelling, handling=handling, note=note, env=False,
               config=False, **kwargs)


def _msrun(name: str, handling: str, note: str = "", type_: Any = None, **kwargs: Any) -> Row:
    return Row("msrun_" + name, type_, None, None, msrun="--" + name, handling=handling, note=note, env=False,
               config=False, **kwargs)


_NULLABLE_STRING = {"type": ["string", "null"]}
_FLOAT0 = click.FloatRange(min=0)
_INT0 = click.IntRange(min=0)

ROWS: Tuple[Row, ...] = (
    _own("config", click.Path(dir_okay=False), None, OTHER, "YAML file holding any run option (keys as option "
         "names).", env=False, config=False,
         kwargs=dict(is_eager=True, expose_value=False, callback=_load_config, envvar=envnames.LAUNCHER_CONFIG,
                    show_envvar=True)),
    _own("rank_table", click.Path(dir_okay=False), None, RANKS,
         "Rank table file (hccl.json) listing the job's servers and devices. Default: $RANK_TABLE_FILE, "
         "else /user/serverid/devindex/config/hccl.json when it exists."),
    _own("rank_table_timeout", _FLOAT0, 300.0, RANKS, "Seconds to wait for the cluster to finish writing the rank "
         "table."),
    _own("server_id", None, None, RANKS,
         "This machine's address in the rank table (default $XDL_IP, $POD_IP, its own addresses)."),
    _own("framework", click.Choice(FRAMEWORKS, case_sensitive=False), None, RANKS,
         "Which framework's environment variables the ranks get (default: $framework, else pytorch; "
         "msrun's options: mindspore).", schema={"enum": list(FRAMEWORKS)}),
    _own("nproc_per_node", NprocType(), None, LOCAL,
         "Start N ranks on this machine, no rank table needed; auto, cpu or npu count the devices.",
         torchrun="--nproc-per-node", schema={"type": "integer", "minimum": 1}),
    _own("nnodes", NnodesType(), 1, LOCAL,
         "Number of machines (with --nproc-per-node); MIN:MAX with --coordinator: elastic, the job goes on "
         "with at least MIN when a machine is lost.", torchrun="--nnodes",
         schema={"type": ["integer", "string"], "minimum": 1, "pattern": "^[0-9]+(:[0-9]+)?$"}),
    _own("node_rank", _INT0, 0, LOCAL, "This machine's index, from 0 (with --nproc-per-node).",
         torchrun="--node-rank", msrun="--node_rank"),
    _own("master_addr", None, None, LOCAL,
         "Address of the machine running rank 0 (default: from the rank table, else 127.0.0.1).",
         torchrun="--master-addr", msrun="--master_addr"),
    _own("master_port", click.IntRange(1, 65535), None, LOCAL,
         "Port rank 0 listens on (default: a free port for a one-machine job; across machines 29500, "
         "MindSpore 8118).", torchrun="--master-port", msrun="--master_port"),
    _own("no_python", FLAG, None, COMMAND, "Run a COMMAND ending in .py as it is, not with the Python interpreter.",
         torchrun="--no-python", env=False),
    _own("module", FLAG, None, COMMAND, "COMMAND is a Python module: run it as `python -m COMMAND`.",
         torchrun="--module", spellings=("-m", "--module"), env=False),
    _own("role", None, "default", COMMAND, "The ranks' ROLE_NAME (torchrun's --role).", torchrun="--role"),
    _own("preload", None, "auto", COMMAND,
         "Warm standby ranks: per rank, a Python interpreter that already imported these modules "
         "(comma-separated, e.g. torch,numpy) becomes the rank on a restart, skipping start-up and imports. "
         "Python scripts and -m modules only; never modules that start threads or open devices "
         "(docs/warm-standby.md). Default: auto (the installed packages the ranks import); none: no standbys.",
         schema=_NULLABLE_STRING,
         kwargs=dict(metavar="MODULES")),
    _own("preload_max_rss", _FLOAT0, 4096.0, COMMAND,
         "Largest resident memory (MiB) a standby may use after its imports; above it the ranks start cold "
         "(0: no cap).", kwargs=dict(metavar="MIB")),
    _own("max_restarts", _INT0, 0, SUPERVISION, "Restart the ranks of this machine up to N times after one fails.",
         torchrun="--max-restarts"),
    _own("no_progress_exit_code", click.IntRange(min=1, max=255), 93, FAILURES,
         "Exit status when the job cannot progress: the same start-up error twice in a row, "
         "--max-no-progress-restarts, or the restart budget spent without a higher step (for a Volcano "
         "policy exitCode -> AbortJob or a podFailurePolicy; docs/failures.md)."),
    _own("device_wait_timeout", _FLOAT0, 60.0, FAILURES,
         "Before a rank starts: wait up to this many seconds while another process holds its NPU "
         "(/dev/davinciN open, or listed by npu-smi); then start anyway (0: do not wait)."),
    _own("health_check", None, None, FAILURES,
         "Run CMD (a shell command) before each attempt, with LAUNCHER_DEVICES set to the node's "
         "devices; a non-zero exit ends the node's part with --node-fault-exit-code.", kwargs=dict(metavar="CMD")),
    _own("node_fault_exit_code", click.IntRange(min=1, max=255), 94, FAILURES,
         "Exit status when --health-check fails: the node is faulty, reschedule the pod elsewhere."),
    _own("restart_backoff", _FLOAT0, 0.5, SUPERVISION,
         "Crash-loop backoff: a restart is immediate, unless the attempt before it also failed "
         "within 60 s of its start; then the delay starts at this many seconds and doubles."),
    _own("restart_backoff_max", _FLOAT0, 30.0, SUPERVISION,
         "Cap of the crash-loop backoff delay (0: always restart at once)."),
    _own("stop_timeout", _FLOAT0, 10.0, SUPERVISION,
         "After a rank fails: seconds the others get to exit after SIGTERM, before SIGKILL."),
    _own("recover_strategy", None, None, SUPERVISION,
         "What to do when a rank fails, comma-separated: retry, recover, recover-in-place, dump, exit, "
         "elastic-training (default: from HIGH_AVAILABILITY / MS_ENABLE_TFT / PROCESS_RECOVER, else retry).",
         schema={"type": "string"}),
    _own("gasp_timeout", _FLOAT0, None, SUPERVISION,
         "When the job is stopped (SIGTERM, Ctrl-C, launcher prestop): seconds the ranks get to save a "
         "checkpoint and exit, before SIGKILL (default: --termination-grace-period minus 5 s or 10 %).",
         spellings=("--gasp-timeout", "--grace-period")),
    _own("termination_grace_period", click.FloatRange(min=1), 30.0, SUPERVISION,
         "Seconds Kubernetes gives the pod to stop (terminationGracePeriodSeconds); the save must fit."),
    _own("gasp_signal", SignalType(), "SIGTERM", SUPERVISION,
         "Signal asking a rank to save a checkpoint and exit (a catchable signal, by name or number).",
         schema={"type": ["string", "integer"]}),
    _own("gasp_min_interval", _FLOAT0, 0.0, SUPERVISION,
         "Stopped again within this many seconds (a crash loop): stop the ranks without asking them "
         "to save. 0: always ask."),
    _own("graceful_exit", FLAG, None, SUPERVISION,
         "MindSpore stop-on-request: ranks get MS_ENABLE_GRACEFUL_EXIT=1, which OnRequestExit needs "
         "(a value already set is kept)."),
    _own("heartbeat_timeout", _FLOAT0, 0.0, HANGS,
         "A rank with no heartbeat and no output for this many seconds is hung: its stacks and every "
         "local rank's are dumped, then it is failed and the job restarts within --max-restarts (0: off)."),
    _own("heartbeat_initial_timeout", _FLOAT0, None, HANGS,
         "Seconds a rank may take to its first heartbeat or output line (start-up, model load); "
         "default: --heartbeat-timeout."),
    _own("section_timeout", None, (), HANGS, "Longest stay in a named section (launcher_heartbeat.section(NAME)); "
         "repeatable.", schema={"type": "array", "items": {"type": "string", "pattern": "^[^=]+=[0-9.]+$"}},
         kwargs=dict(multiple=True, callback=_section_timeouts, metavar="NAME=SECONDS")),
    _own("max_no_progress_restarts", _INT0, 0, HANGS,
         "End the job after this many restarts in a row whose ranks reached no higher heartbeat step "
         "than before (a crash loop at one step; 0: off)."),
    _own("straggler_threshold", click.FloatRange(min=0, max=1, max_open=True), 0.0, HANGS,
         "Name a rank (event straggler) whose heartbeat step rate stays this fraction below its peers' "
         "median for 5 s, e.g. 0.2 (0: off)."),
    _own("console_ranks", RankFilterType(), "all", LOGS,
         "Ranks whose output is shown here: all, none, or a list like 0,3,5-7.",
         schema={"type": ["string", "integer"]}),
    _own("log_dir", click.Path(file_okay=False), None, LOGS,
         "Per-rank log files: DIR/<session>/attempt_<n>/rank_<r>.log (default: <run-dir>/logs).",
         torchrun="--log-dir", msrun="--log_dir"),
    _own("run_dir", click.Path(file_okay=False), None, LOGS,
         "The launcher's own state: pid, rank states, events.jsonl (default: <base>/<job name>, base "
         "$XDG_RUNTIME_DIR/launcher or /tmp/launcher-<uid>)."),
    _own("job_name", None, None, LOGS, "Name of the job's run dir under the base (default: --run-id or "
         "$MINDX_TASK_ID when given, else <date>-<time>-<pid>); `launcher prestop --job NAME` finds it."),
    _own("run_id", None, None, LOGS, "The job's id, the same on every machine (default $MINDX_TASK_ID, else a "
         "digest of what every machine of the job shares: the rank table or master address, and the command)."),
    _own("metrics_port", click.IntRange(0, 65535), None, LOGS,
         "Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port, see the "
         "metrics_listening event; default: off; needs the `metrics` extra)."),
    _own("metrics_textfile", click.Path(dir_okay=False), None, LOGS,
         "Write Prometheus metrics to FILE after every attempt and at the end (node_exporter textfile "
         "collector; default: off)."),
    _own("debug_rank", _INT0, None, DEBUG,
         "Give rank N this terminal (stdin, stdout, stderr, unprefixed) for breakpoint() / pdb; Ctrl-C "
         "goes to it first, and a stop after another rank fails leaves it alone until it exits."),
    _own("pdb", FLAG, None, DEBUG, "Post-mortem: the first rank that raises runs pdb on this terminal before the "
         "job is stopped (Python commands only)."),
    _own("checkpoint_dir", click.Path(file_okay=False), None, RESTORE,
         "Where the ranks save checkpoints, as DIR/rank_<r>/...: before every (re)start the launcher "
         "picks the newest complete one and tells each rank which file to load."),
    _own("checkpoint_pattern", None, None, RESTORE, "Regex of checkpoint file names, with (?P<step>...) and "
         "optionally (?P<epoch>...)."),
    _own("checkpoint_marker", None, None, RESTORE,
         "Completion-marker file name, e.g. '{name}.done' or '{name}.sha256': a checkpoint without it in its "
         "directory is never picked (fields: name and the pattern's groups).", kwargs=dict(metavar="TEMPLATE")),
    _own("strategy_file", click.Path(dir_okay=False), None, RESTORE,
         "MindSpore: this world's sharding-strategy file; a checkpoint step another world size wrote "
         "(DIR/manifests/) is converted to it before the ranks start."),
    _own("dp", click.IntRange(min=1), None, RESTORE,
         "Data-parallel size: ranks holding the same model copy follow a dp x tp x pp layout."),
    _own("tp", click.IntRange(min=1), None, RESTORE, "Tensor-parallel size (with --dp)."),
    _own("pp", click.IntRange(min=1), None, RESTORE, "Pipeline-parallel size (with --dp)."),
    _own("groups_file", click.Path(dir_okay=False), None, RESTORE,
         "Ranks holding the same model copy (JSON/YAML list of rank lists)."),
    _own("fault_ranks", RankListType(), None, RESTORE, "Ranks whose checkpoints must not be loaded, e.g. 3,5.",
         schema={"type": ["string", "integer"]}),
    _own("group_info_root", click.Path(file_okay=False), None, RESTORE,
         "MindSpore hybrid-parallel restore: each rank writes DIR/device<rank>/group_info.pb (GROUP_INFO_FILE) "
         "and the restore plan reads them (default: no GROUP_INFO_FILE)."),
    _own("reset_json", None, DEFAULT_RESET_JSON, CLUSTER,
         "The cluster's reset.json (status of every rank), followed while the job runs.", schema={"type": "string"}),
    _own("fault_npus", None, DEFAULT_FAULT_NPUS, CLUSTER, "The cluster's list of faulty devices.",
         schema={"type": "string"}),
    _own("hccl_if_ip", None, None, CLUSTER,
         "Network address HCCL uses on this machine (HCCL_IF_IP; default: XDL_IP with host networking, "
         "else unset; a value already set is kept).", kwargs=dict(callback=_ip_address)),
    _own("coordinator", None, None, CLUSTER,
         "etcd that the launchers of the job restart together through, with leases: a machine whose "
         "launcher dies is seen as lost within --coordinator-ttl (needs the same --run-id everywhere); "
         "etcds:// for TLS.", schema={"type": "string"}, kwargs=dict(metavar="etcd://HOST:PORT[,HOST:PORT]")),
    _own("coordinator_ttl", click.IntRange(min=1), 5, CLUSTER,
         "With --coordinator: seconds of silence after which a machine's launcher counts as lost."),
    _own("coordinator_cacert", None, None, CLUSTER, "With etcds://: the CAs that sign etcd's certificate (default: "
         "the system's).", schema={"type": "string"}, kwargs=dict(metavar="PEM")),
    _own("coordinator_cert", None, None, CLUSTER, "With etcds://: this client's certificate (for etcd's "
         "--client-cert-auth).", schema={"type": "string"}, kwargs=dict(metavar="PEM")),
    _own("coordinator_key", None, None, CLUSTER, "With --coordinator-cert: its private key.",
         schema={"type": "string"}, kwargs=dict(metavar="PEM")),
    _own("coordinator_user", None, None, CLUSTER, "etcd user (etcd's authentication); the password comes from "
         "--coordinator-password-file or $LAUNCHER_COORDINATOR_PASSWORD, never the command line.",
         schema={"type": "string"}),
    _own("coordinator_password_file", None, None, CLUSTER, "File whose first line is --coordinator-user's password "
         "(a mounted Kubernetes Secret).", schema={"type": "string"}, kwargs=dict(metavar="FILE")),
    _own("elastic_wait", _FLOAT0, 30.0, CLUSTER,
         "With --nnodes MIN:MAX: seconds to wait for a replacement of a lost machine before going on "
         "without it, and at the start, once MIN machines joined, for the others (torchrun's "
         "last_call_timeout)."),
    _own("sync_dir", click.Path(file_okay=False), None, CLUSTER,
         "Directory every machine of the job can write: their launchers restart together "
         "(needs the same --run-id everywhere)."),
    _own("sync_timeout", _FLOAT0, 300.0, CLUSTER,
         "With --sync-dir or --coordinator: seconds to wait for the other machines at a restart before exiting 1."),
    _own("taskd", click.Choice(["auto", "on", "off"]), "auto", CLUSTER,
         "MindCluster TaskD (recovery of single processes): its manager runs next to rank 0 "
         "(auto: when the taskd package is installed and TASKD_PROCESS_ENABLE is not off)."),
    _own("taskd_port", click.IntRange(1, 65535), TASKD_DEFAULT_PORT, CLUSTER,
         "The TaskD manager's port, checked free before it starts."),
    _own("dry_run", FLAG, None, OTHER, "Print every rank's command line and environment; start nothing."),
    _own("json_output", FLAG, None, OTHER, "With --dry-run: one JSON object.", spellings=("--json",), env=False,
         config=False),
    _own("bind_cores", None, "none", COMMAND,
         "CPU binding of the ranks (os.sched_getaffinity in each): auto splits the CPUs the launcher may use "
         "among the local ranks by the NUMA node of each rank's NPU, else evenly by NUMA node, else evenly; "
         "LIST gives each local rank its CPUs, e.g. '0-3;4-7' (docs/cpu-binding.md).",
         kwargs=dict(metavar="auto|none|LIST", callback=_check_bind_cores)),

    # torchrun's spellings of what the launcher does its own way (torchrun 2.13 --help).
    _torchrun("standalone", "--standalone", MAPPED, "one node, rank 0's store on a free local port", FLAG),
    _torchrun("rdzv_backend", "--rdzv-backend", MAPPED, "static and c10d: rank 0 hosts the store"),
    _torchrun("rdzv_endpoint", "--rdzv-endpoint", MAPPED, "--master-addr/--master-port; port 0: a free port"),
    _torchrun("rdzv_id", "--rdzv-id", MAPPED, "--run-id"),
    _torchrun("rdzv_conf", "--rdzv-conf", MAPPED, "with an etcd backend: its TLS files and timeouts "
              "(--coordinator-cacert, ...); else no rendezvous to configure: ignored, with an info line"),
    _torchrun("shutdown_timeout", "--shutdown-timeout", MAPPED, "--stop-timeout", _FLOAT0),
    _torchrun("redirects", "--redirects", MAPPED, "ranks whose output goes only to files leave the console",
              spellings=("-r", "--redirects")),
    _torchrun("tee", "--tee", MAPPED, "every rank's output is in its log file and on the console already",
              spellings=("-t", "--tee")),
    _torchrun("local_ranks_filter", "--local-ranks-filter", MAPPED, "--console-ranks"),
    _torchrun("run_path", "--run-path", MAPPED, "each rank runs the script with the Python interpreter", FLAG),
    _torchrun("signals_to_handle", "--signals-to-handle", MAPPED,
              "the launcher stops the job on SIGTERM, SIGINT and SIGHUP"),
    _torchrun("numa_binding", "--numa-binding", MAPPED, "--bind-cores"),
    _torchrun("monitor_interval", "--monitor-interval", INFO, "the launcher sees a rank exit at once, without "
              "polling; ignored"),
    _torchrun("start_method", "--start-method", INFO, "each rank is a fresh process, as with spawn; ignored"),
    _torchrun("event_log_handler", "--event-log-handler", INFO, "the launcher's events are in "
              "<run-dir>/events.jsonl; ignored"),
    _torchrun("duplicate_stdout_filters", "--duplicate-stdout-filters", REFUSED, "not supported: search the "
              "per-rank log files instead"),
    _torchrun("duplicate_stderr_filters", "--duplicate-stderr-filters", REFUSED, "not supported: search the "
              "per-rank log files instead"),
    _torchrun("logs_specs", "--logs-specs", REFUSED, "the launcher's log layout is fixed (see --log-dir): drop it"),
    _torchrun("local_addr", "--local-addr", REFUSED, "the launcher advertises no node address (the ranks "
              "reach rank 0 at --master-addr): pass the address to --master-addr on every node, or --server-id to "
              "say which server of a rank table this is"),
    _torchrun("virtual_local_rank", "--virtual-local-rank", REFUSED, "not supported: each rank sees its device "
              "as LOCAL_RANK / DEVICE_ID", FLAG),

    # msrun's spellings (MindSpore 2.10 msrun --help); --master_addr, --master_port, --node_rank and
    # --log_dir are the launcher's own options above. Any of these implies --framework mindspore.
    _msrun("worker_num", MAPPED, "--nnodes (worker_num / local_worker_num)", click.IntRange(min=1)),
    _msrun("local_worker_num", MAPPED, "--nproc-per-node", click.IntRange(min=1)),
    _msrun("join", MAPPED, "the launcher always waits for its ranks and reports how they ended (msrun "
           "--join True)", click.Choice(["True", "False"])),
    _msrun("cluster_time_out", MAPPED, "the ranks' MS_TOPO_TIMEOUT", click.INT),
    _msrun("bind_core", MAPPED, "--bind-cores"),
    _msrun("bind_numa", MAPPED, "--bind-cores"),
    _msrun("rank_table_file", MAPPED, "the ranks' RANK_TABLE_FILE, as msrun exports it", click.Path(dir_okay=False)),
    _msrun("worker_log_name", INFO, "each rank's log is <log-dir>/<session>/attempt_<n>/rank_<r>.log; ignored"),
    _msrun("tail_worker_log", MAPPED, "--console-ranks"),
    _msrun("sim_level", REFUSED, "a MindSpore dry run (simulation) starts no cluster: run the script with python, "
           "MS_SIMULATION_LEVEL=N and RANK_SIZE set, without a launcher", click.IntRange(0, 3)),
    _msrun("sim_rank_id", REFUSED, "a MindSpore dry run (simulation) starts no cluster: run the script with "
           "python, MS_SIMULATION_LEVEL=N and RANK_ID set, without a launcher", click.INT),
)

def foreign_rows(tool: str) -> List[Row]:
    """torchrun's (``tool="torchrun"``) or msrun's spellings the launcher handles its own way."""
    return [row for row in ROWS if row.foreign and row.name.startswith(tool + "_")]


def help_sections() -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """``launcher run --help`` in sections: title -> the long names it lists, ``--help`` last."""
    sections = []
    for title in SECTIONS:
        names = tuple(row.flag for row in ROWS if row.section == title)
        sections.append((title, names + (("--help",) if title == OTHER else ())))
    return tuple(sections)


def click_options() -> List[click.Option]:
    """Every row's click option, in table order."""
    return [row.option() for row in ROWS]


def json_schema() -> Dict[str, Any]:
    """The schema of the ``--config`` file: one property per config key."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://ascend-launcher/schemas/launcher.schema.json",
        "title": "launcher run configuration file",
        "description": "Any option of `launcher run`, keyed by its name with dashes or underscores. Command line "
                       "and LAUNCHER_* environment variables override these values. Generated from "
                       "launcher/commands/optiontable.py.",
        "type": "object",
        "additionalProperties": False,
        "properties": {row.name: row.json_schema() for row in ROWS if row.config and not row.foreign},
    }


def schema_text() -> str:
    """``schemas/launcher.schema.json`` as it must read: one property per line."""
    doc = json_schema()
    props = doc.pop("properties")
    head = json.dumps(doc, indent=2)[:-2]
    lines = [f"    {json.dumps(name)}: {json.dumps(value)}" for name, value in props.items()]
    return head + ',\n  "properties": {\n' + ",\n".join(lines) + "\n  }\n}\n"


def main() -> None:
    """Print the generated ``schemas/launcher.schema.json``."""
    print(schema_text(), end="")


if __name__ == "__main__":
    main()
