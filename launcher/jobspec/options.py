"""``RunOptions``: everything ``launcher run`` was asked to do, and the YAML config file loader.

Precedence (each source tested): command line > ``LAUNCHER_<OPTION>`` environment > ``--config``
file > defaults. Click implements exactly this order when the config file is loaded into the
context's ``default_map`` by an eager option, which is what ``load_config_into_context`` does.
"""

import signal
from dataclasses import field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.inputfiles import LIMIT_CONFIG, InputFileError, brief
from launcher.common.inputyaml import read_yaml
from launcher.common.records import record

FRAMEWORKS = ("pytorch", "mindspore", "tensorflow")
DEFAULT_MASTER_PORT = {"pytorch": 29500, "mindspore": 8118, "tensorflow": 29500}
DEFAULT_RANK_TABLE = "/user/serverid/devindex/config/hccl.json"
TASKD_DEFAULT_PORT = 9601  # TaskD hard-codes the manager port; pods declare it as taskd-port
DEFAULT_FAULT_NPUS = "/user/restore/fault/config/fault-npus"
DEFAULT_RESET_JSON = "/user/restore/reset/config/reset.json"


@record(frozen=True)
class RunOptions:
    """The resolved options of one ``launcher run``: one field per launcher option of
    ``launcher.commands.optiontable`` (same name and default, tests/unit/commands/test_optiontable.py), plus
    what torchrun's and msrun's options map onto (``min_nodes``, ``rank_env``).

    Values the option types (``launcher.commands.optiontypes``) parse are parsed at the command line: ``console_ranks`` is None for
    all ranks, else the ranks shown; ``section_timeout`` (name, seconds) pairs; ``fault_ranks`` a tuple.
    The rest is text until ``launcher.jobspec.runspec.run_spec`` parses it, once, into the specs every
    consumer reads: nothing past the runner's edge reads ``RunOptions``.
    """

    command: Tuple[str, ...]
    rank_table: Optional[str] = None
    rank_table_timeout: float = 300.0
    nproc_per_node: Optional[int] = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    server_id: Optional[str] = None
    framework: Optional[str] = None
    max_restarts: int = 0
    restart_backoff: float = 0.5
    restart_backoff_max: float = 30.0
    stop_timeout: float = 10.0
    heartbeat_timeout: float = 0.0
    heartbeat_initial_timeout: Optional[float] = None
    section_timeout: Tuple[Tuple[str, float], ...] = ()
    max_no_progress_restarts: int = 0
    no_progress_exit_code: int = 93
    device_wait_timeout: float = 60.0
    health_check: Optional[str] = None
    node_fault_exit_code: int = 94
    straggler_threshold: float = 0.0
    gasp_timeout: Optional[float] = None
    termination_grace_period: float = 30.0
    gasp_signal: str = "SIGTERM"
    gasp_min_interval: float = 0.0
    log_dir: Optional[str] = None
    console_ranks: Optional[Tuple[int, ...]] = None
    run_dir: Optional[str] = None
    run_id: Optional[str] = None
    job_name: Optional[str] = None
    group_info_root: Optional[str] = None
    graceful_exit: bool = False
    hccl_if_ip: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_pattern: Optional[str] = None
    checkpoint_marker: Optional[str] = None
    strategy_file: Optional[str] = None
    fault_npus: Optional[str] = DEFAULT_FAULT_NPUS
    reset_json: Optional[str] = DEFAULT_RESET_JSON
    fault_ranks: Tuple[int, ...] = ()
    groups_file: Optional[str] = None
    dp: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    recover_strategy: Optional[str] = None
    sync_dir: Optional[str] = None
    sync_timeout: float = 300.0
    coordinator: Optional[str] = None
    coordinator_ttl: int = 5
    coordinator_cacert: Optional[str] = None
    coordinator_cert: Optional[str] = None
    coordinator_key: Optional[str] = None
    coordinator_user: Optional[str] = None
    coordinator_password_file: Optional[str] = None
    min_nodes: Optional[int] = None
    elastic_wait: float = 30.0
    taskd: str = "auto"
    taskd_port: int = TASKD_DEFAULT_PORT
    debug_rank: Optional[int] = None
    pdb: bool = False
    metrics_port: Optional[int] = None
    metrics_textfile: Optional[str] = None
    role: str = "default"
    preload: Optional[str] = "auto"
    preload_max_rss: float = 4096.0
    bind_cores: str = "none"
    dry_run: bool = False
    json_output: bool = False
    #: Variables every rank gets on top, from msrun's options (MS_TOPO_TIMEOUT, RANK_TABLE_FILE).
    rank_env: Tuple[Tuple[str, str], ...] = ()
    extra: Dict[str, Any] = field(default_factory=dict, compare=False)

    def resolved_framework(self, environ: Dict[str, str]) -> str:
        """``--framework``, else MindX's ``framework`` variable, else pytorch."""
        name = (self.framework or environ.get(envnames.MINDX_FRAMEWORK) or "pytorch").lower()
        if name not in FRAMEWORKS:
            raise UsageError(f"unknown framework {name!r}", [f"expected one of {', '.join(FRAMEWORKS)}"])
        return name

    def resolved_gasp_timeout(self) -> float:
        """``--gasp-timeout``, else what fits inside ``--termination-grace-period`` with a margin."""
        if self.gasp_timeout is not None:
            return self.gasp_timeout
        return default_gasp_timeout(self.termination_grace_period)


#: Signals a process cannot catch: a "save" signal must be one the rank can handle.
UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


#: Seconds kept free inside terminationGracePeriodSeconds for SIGKILL, reaping and prestop's return
#: (the gasp timeout is an option default, so it lives with the options, below the control layer).
MIN_MARGIN = 5.0


def default_gasp_timeout(termination_grace_period: float) -> float:
    """Gasp timeout that fits the pod's grace period with a safety margin (5 s or 10 %, the larger)."""
    margin = max(MIN_MARGIN, 0.1 * termination_grace_period)
    return max(1.0, termination_grace_period - margin)


def parse_signal(text: Any, option: str = "--gasp-signal") -> int:
    """A catchable signal's number from its name (``SIGUSR1``, ``usr1``) or number (``10``).

    Raises:
        UsageError: not a signal of this system (0, 99, ``FOO``), or SIGKILL / SIGSTOP.
    """
    name = str(text).strip().upper()
    try:
        if name.isdigit():
            signum = signal.Signals(int(name))
        else:
            signum = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise UsageError(f"{option} {text!r} is not a signal name or number of this system",
                         ["e.g. SIGTERM, USR1 or 10"]) from None
    if signum in UNCATCHABLE:
        raise UsageError(f"{option} {signum.name}: a rank cannot catch it, so it can never save",
                         ["use a catchable signal such as SIGTERM or SIGUSR1"])
    return int(signum)


def parse_section_timeouts(items: Sequence[str]) -> Dict[str, float]:
    """``--section-timeout NAME=SECONDS`` values -> {name: seconds}.

    Raises:
        ValueError: one message naming every malformed item.
    """
    sections: Dict[str, float] = {}
    bad = []
    for item in items:
        name, sep, seconds = str(item).partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or not name.strip() or not value > 0 or value == float("inf"):
            bad.append(repr(item))
            continue
        sections[name.strip()] = value
    if bad:
        raise ValueError(f"{', '.join(bad)}: expected NAME=SECONDS with SECONDS > 0")
    return sections


def parse_rank_list(text: Optional[str], option: str = "--fault-ranks") -> Tuple[int, ...]:
    """``"3,5"`` -> ``(3, 5)`` (sorted, once each; blanks are ignored); empty or None -> ``()``.

    Raises:
        UsageError: an item that is not a non-negative integer.
    """
    ranks = set()
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        if not item.isdigit():
            raise UsageError(f"{option}: {item!r} is not a rank id (expected e.g. 3,5)")
        ranks.add(int(item))
    return tuple(sorted(ranks))


def check_sync_options(run_id: str, chosen: bool, server_count: int, option: str = "--sync-dir") -> None:
    """``--sync-dir`` / ``--coordinator`` are scoped by the run id, so every node must use the same one.

    Args:
        run_id: The job's run id.
        chosen: Whether it came from ``--run-id`` or ``MINDX_TASK_ID`` (rather than derived).
        server_count: Servers in the rank table.
        option: The coordination option, for messages.

    Raises:
        UsageError: a derived run id with several servers, or a run id that is not a file name.
    """
    # The derived id is the same on every node, but also for every rerun of the same command on the
    # same table: a rerun would meet the previous run's barriers under DIR/<run-id>/.
    if not chosen and server_count > 1:
        raise UsageError(f"{option} with several servers needs the same run id on every node, unique to this run",
                         ["pass --run-id ID (or set MINDX_TASK_ID) identically to every launcher of the job"])
    if "/" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id {run_id!r} cannot name a directory under {option}", ["use a run id without '/'"])


#: ``--coordinator`` schemes: whether each speaks TLS.
COORDINATOR_SCHEMES = {"etcd": False, "http": False, "etcds": True, "https": True}


def parse_coordinator(url: str) -> List[Tuple[str, int]]:
    """``--coordinator etcd://host:2379[,host2:2379]`` -> ``[(host, port), ...]`` (port 2379 when left out).

    ``etcds://`` and ``https://`` (TLS, :func:`coordinator_tls`) and ``http://`` are read the same way.

    Raises:
        UsageError: not one of those URLs, a user or password in it, or a bad host or port.
    """
    scheme, sep, rest = url.partition("://")
    expected = "expected etcd://HOST:PORT[,HOST:PORT] (etcds:// for TLS)"
    if not sep or scheme.lower() not in COORDINATOR_SCHEMES:
        raise UsageError(f"--coordinator {_redacted(url)!r}: {expected}")
    if "@" in rest:  # the message must not repeat what may be a password
        raise UsageError(f"--coordinator {_redacted(url)!r}: no user or password in the URL (`ps` shows it)",
                         ["use --coordinator-user, and the password in --coordinator-password-file or "
                          f"${envnames.LAUNCHER_COORDINATOR_PASSWORD}"])
    endpoints = []
    for part in rest.rstrip("/").split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "2379")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--coordinator {url!r}: bad endpoint {part!r}, expected HOST:PORT")
        endpoints.append((host, int(port)))
    return endpoints


def coordinator_tls(url: str) -> bool:
    """Whether ``--coordinator URL`` speaks TLS (``etcds://``, ``https://``)."""
    return COORDINATOR_SCHEMES.get(url.partition("://")[0].lower(), False)


def _redacted(url: str) -> str:
    """``url`` without what comes before an ``@`` (a user and maybe a password)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url


def env_var_for(option_name: str) -> str:
    """The environment variable that sets a run option: ``max_restarts`` -> ``LAUNCHER_MAX_RESTARTS``."""
    return envnames.ENV_PREFIX + option_name.upper()


def load_config(path: str) -> Dict[str, Any]:
    """Read and validate a YAML config file of ``run`` options.

    Keys may be spelled with dashes or underscores (``max-restarts`` or ``max_restarts``).

    Raises:
        UsageError: unreadable file (not a regular file, too big, not UTF-8), malformed or too deep
            YAML (one line), or schema violations (one line each, with path).
    """
    try:
        data = read_yaml(path, "config file", LIMIT_CONFIG)
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except InputFileError as exc:
        raise UsageError(str(exc)) from None
    if data is None:
        return {}
    if isinstance(data, dict):
        data = {str(k).replace("-", "_"): v for k, v in data.items()}
    problems = _schema_problems(data)
    if problems:
        raise UsageError(f"config file {path} is invalid", problems)
    return data


def _schema_problems(data: Any) -> list:
    import jsonschema

    from launcher.common.resources import load_schema

    validator = jsonschema.Draft7Validator(load_schema("launcher.schema.json"))
    problems = []
    known = validator.schema["properties"]
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            problems.extend(f"{path}.{brief(key, 80)}: unknown option"
                            for key in sorted(error.instance) if key not in known)
        else:
            problems.append(f"{path}: {brief(error.message)}")
    return problems


def parse_rank_filter(text: str) -> Optional[List[int]]:
    """``all`` -> None (every rank), ``none`` -> [], ``0,3,5-7`` -> [0, 3, 5, 6, 7].

    Raises:
        UsageError: malformed list.
    """
    text = text.strip().lower()
    if text == "all":
        return None
    if text == "none":
        return []
    ranks: List[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, dash, high = part.partition("-")
            first, last = int(low), int(high if dash else low)
            if first < 0 or last < first:
                raise ValueError(part)
            ranks.extend(range(first, last + 1))
    except ValueError:
        raise UsageError(f"--console-ranks {text!r}: expected all, none, or a list like 0,3,5-7") from None
    return ranks
