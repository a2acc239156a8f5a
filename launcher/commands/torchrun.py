"""torchrun habits for ``launcher run``: its spellings, ``--standalone``, ``--rdzv-*``, ``train.py`` alone.

A torchrun command line works after changing the program name. torchrun's underscore spellings
(``--nproc_per_node``) are matched by the command's ``token_normalize_func``; what each option torchrun
2.13 lists becomes is a row of ``launcher.commands.optiontable``: the launcher's own option, mapped
here by :func:`translate`, accepted with one info line, or refused with what to do instead (exit 2).
"""

import logging
import os
import signal
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.signals import STOP_SIGNALS
from launcher.jobspec import hostfacts

log = logging.getLogger(__name__)

#: The rendezvous backends whose torchrun meaning the launcher keeps: rank 0 hosts the store.
RDZV_BACKENDS = ("static", "c10d")
#: torchrun's port for an ``--rdzv-endpoint`` without one.
RDZV_DEFAULT_PORT = 29400
#: torchrun's etcd backends: the launcher coordinates through that etcd (``--coordinator``).
ETCD_BACKENDS = ("etcd", "etcd-v2")
#: ``--rdzv-conf`` keys of torchrun's etcd backends (both spellings) -> the launcher option they set.
ETCD_CONF = {"cacert": "coordinator_cacert", "ca_cert": "coordinator_cacert", "cert": "coordinator_cert",
             "ssl_cert": "coordinator_cert", "key": "coordinator_key", "ssl_cert_key": "coordinator_key",
             "last_call_timeout": "elastic_wait", "timeout": "sync_timeout", "join_timeout": "sync_timeout"}

#: The signals ``--signals-to-handle`` may list: the launcher stops the job on them and forwards no
#: other (the ranks' ``TORCHELASTIC_SIGNALS_TO_HANDLE``, launcher.jobspec.rankenv).
HANDLED_SIGNALS = tuple(signal.Signals(signum).name for signum in STOP_SIGNALS)


def normalize_token(token: str) -> str:
    """torchrun spells every option both ways: ``--nproc_per_node`` is ``--nproc-per-node``."""
    return token.replace("_", "-")


def cpu_count() -> int:
    """CPUs this process may run on (what torchrun's ``cpu`` counts)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def npu_count(dev: str = "/dev") -> int:
    """Ascend NPUs visible here: the container sees only the ``davinci<N>`` devices it was given."""
    return len(hostfacts.davinci_devices(dev))


def translate(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any]) -> List[str]:
    """Turn torchrun's mapped options (``optiontable`` rows ``torchrun_*``) into ``run``'s own.

    Args:
        kwargs: The launcher's options, changed in place.
        explicit: Names of the options the user gave (command line, environment, --config file).
        given: The torchrun rows the user gave: row name -> value.

    Returns:
        One line per contradictory or unusable value (empty: all mapped).
    """
    problems = _rendezvous(kwargs, explicit, given)
    if given.get("torchrun_shutdown_timeout") is not None:
        kwargs["stop_timeout"] = given["torchrun_shutdown_timeout"]
    if given.get("torchrun_run_path"):
        kwargs["no_python"] = False  # torchrun: --run-path takes precedence over --no-python
        log.info("--run-path: each rank runs the script with the Python interpreter, in a process of its own")
    problems.extend(_console(kwargs, explicit, given))
    if given.get("torchrun_signals_to_handle"):
        problems.extend(_signals(given["torchrun_signals_to_handle"]))
    if given.get("torchrun_numa_binding"):  # node, socket, exclusive, core-complex: near the device
        problems.extend(map_binding(kwargs, explicit, "auto", f"--numa-binding {given['torchrun_numa_binding']}"))
    return problems


def map_binding(kwargs: Dict[str, Any], explicit: Sequence[str], value: str, origin: str) -> List[str]:
    """torchrun's or msrun's CPU binding onto ``--bind-cores VALUE``.

    Returns:
        The problems: a different ``--bind-cores`` given too.
    """
    if "bind_cores" in explicit and kwargs.get("bind_cores") != value:
        return [f"{origin} and --bind-cores {kwargs['bind_cores']} differ: pass one of them"]
    kwargs["bind_cores"] = value
    return []


def _rendezvous(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any]) -> List[str]:
    """``--standalone`` and ``--rdzv-*``: where rank 0's store listens (with etcd: the coordinator), and
    the run id."""
    backend, endpoint = given.get("torchrun_rdzv_backend"), given.get("torchrun_rdzv_endpoint")
    conf = given.get("torchrun_rdzv_conf")
    etcd = (backend or "").lower() in ETCD_BACKENDS
    problems = _backend(backend, conf)
    if given.get("torchrun_standalone"):
        return problems + _standalone(kwargs, explicit)
    if etcd:
        problems.extend(_etcd(kwargs, endpoint, conf or ""))
    elif endpoint:
        problems.extend(_endpoint(kwargs, endpoint))
    rdzv_id = given.get("torchrun_rdzv_id")
    if rdzv_id:
        if kwargs.get("run_id") and kwargs["run_id"] != rdzv_id:
            problems.append(f"--rdzv-id {rdzv_id} and --run-id {kwargs['run_id']} differ: pass one of them")
        kwargs["run_id"] = rdzv_id
    if (backend or "").lower() in ("c10d",) + ETCD_BACKENDS and _nodes(kwargs) > 1 and "node_rank" not in explicit:
        problems.append(f"--rdzv-backend {backend} with several nodes: the launcher does not hand out node ranks "
                        "at rendezvous; pass --node-rank on each node (0 on the master's host)")
    return problems


def _backend(backend: Optional[str], conf: Optional[str]) -> List[str]:
    """The backends whose meaning the launcher keeps; ``--rdzv-conf`` means something only to etcd's."""
    etcd = (backend or "").lower() in ETCD_BACKENDS
    if conf and not etcd:
        log.info("--rdzv-conf is torchrun's: the launcher has no rendezvous to configure (rank 0 hosts the store); "
                 "ignored")
    if backend is not None and backend.lower() not in RDZV_BACKENDS + ETCD_BACKENDS:
        return [f"--rdzv-backend {backend}: not supported; rank 0 hosts the store as with torchrun's static or "
                "c10d backends, etcd coordinates restarts (pass one of those, or drop it)"]
    return []


def _nodes(kwargs: Mapping[str, Any]) -> int:
    nnodes = kwargs.get("nnodes", 1)
    return nnodes if isinstance(nnodes, int) else nnodes[-1]


def _standalone(kwargs: Dict[str, Any], explicit: Sequence[str]) -> List[str]:
    """torchrun's ``--standalone``: one node, a free port on this machine, ranks from --nproc-per-node."""
    if kwargs.get("nnodes", 1) > 1:
        return [f"--standalone is a single node: drop --nnodes {kwargs['nnodes']}"]
    if kwargs.get("rank_table"):
        return ["--standalone builds the ranks here: drop --rank-table"]
    if "nproc_per_node" not in explicit:
        kwargs["nproc_per_node"] = 1  # torchrun's default
    kwargs["master_addr"] = kwargs.get("master_addr") or "127.0.0.1"
    # No --master-port: topology.resolve picks a free port, as for every one-node job.
    return []


def _endpoint(kwargs: Dict[str, Any], endpoint: str) -> List[str]:
    """``--rdzv-endpoint HOST[:PORT]``: the store of rank 0 listens there (torchrun's static setup)."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = endpoint, ""
    host = host.strip("[]")
    if not host or (port_text and not (port_text.isdigit() and 0 <= int(port_text) < 65536)):
        return [f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT"]
    port = int(port_text) if port_text else RDZV_DEFAULT_PORT
    if port == 0:  # torchrun's one-node idiom (localhost:0): a free port, which topology.resolve picks
        if _nodes(kwargs) > 1:
            return [f"--rdzv-endpoint {endpoint}: port 0 (a free port) works on one node only; pass the port "
                    "every node can reach"]
        port = None
    problems = []
    for key, value in (("master_addr", host), ("master_port", port)):
        if kwargs.get(key) not in (None, value):
            problems.append(f"--rdzv-endpoint {endpoint} and --{key.replace('_', '-')} {kwargs[key]} differ: "
                            "pass one of them")
        kwargs[key] = value
    return problems


STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3  # torchrun's Std: which of a rank's streams
#: A parsed ``--redirects`` / ``--tee``: one Std for every local rank, or local rank -> Std.
Std = Union[int, Dict[int, int]]


def parse_std(text: str, option: str) -> Std:
    """torchrun's ``--redirects`` / ``--tee`` value: ``3`` (every local rank) or ``0:3,1:1`` (per local rank).

    Raises:
        UsageError: not a Std value 0-3 or a LOCAL_RANK:STD list.
    """
    text = str(text).strip()
    try:
        if ":" not in text:
            value = int(text)
            if 0 <= value <= 3:
                return value
        else:
            pairs = [part.split(":") for part in text.split(",")]
            mapping = {int(rank): int(std) for rank, std in pairs}
            if all(0 <= std <= 3 and rank >= 0 for rank, std in mapping.items()):
                return mapping
    except ValueError:
        pass
    raise UsageError(f"{option} {text!r}: expected 0-3 (none, stdout, stderr, both) or LOCAL_RANK:STD pairs "
                     "like 0:3,1:1")


def _std_of(value: Optional[Std], local_rank: int) -> int:
    if value is None:
        return STD_NONE
    return value if isinstance(value, int) else value.get(local_rank, STD_NONE)


def _console(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any]) -> List[str]:
    """``--redirects``, ``--tee`` and ``--local-ranks-filter`` onto ``--console-ranks``.

    torchrun writes a redirected stream only to a file, a teed one to a file and the console, and shows
    only the filtered local ranks. The launcher writes each rank's output (stdout and stderr together)
    to its log file always, and shows the ranks of ``--console-ranks``: a rank whose stdout torchrun
    would not show leaves the console.
    """
    redirects = parse_std(given["torchrun_redirects"], "--redirects") if "torchrun_redirects" in given else None
    tee = parse_std(given["torchrun_tee"], "--tee") if "torchrun_tee" in given else None
    wanted = given.get("torchrun_local_ranks_filter")
    if redirects is None and wanted is None:
        if tee is not None:
            log.info("--tee: every rank's output is in its log file (see --log-dir) and on the console already")
        return []
    problems, shown = _shown_local_ranks(kwargs, explicit, redirects, tee, wanted)
    if problems:
        return problems
    first = kwargs.get("node_rank", 0) * kwargs["nproc_per_node"]
    kwargs["console_ranks"] = tuple(first + local for local in shown)
    log.info("console: local rank(s) %s shown (stdout and stderr together); every rank's output is in its log "
             "file", ",".join(map(str, shown)) or "none")
    return []


def _shown_local_ranks(kwargs: Mapping[str, Any], explicit: Sequence[str], redirects: Optional[Std], tee: Optional[Std],
                       wanted: Optional[str]) -> Tuple[List[str], List[int]]:
    """The local ranks whose stdout torchrun would show: in the filter, and not redirected or else teed."""
    try:
        shown_local = None if wanted is None else {int(p) for p in str(wanted).split(",") if p.strip()}
    except ValueError:
        return [f"--local-ranks-filter {wanted!r}: expected local ranks like 0,1,2"], []
    nproc = kwargs.get("nproc_per_node")
    if nproc is None:
        return ["--redirects / --local-ranks-filter name local ranks: with a rank table, name the global ranks "
                "to show with --console-ranks"], []
    if "console_ranks" in explicit:
        return ["--redirects / --local-ranks-filter and --console-ranks both choose the console's ranks: pass "
                "one of them"], []
    return [], [local for local in range(nproc)
                if (shown_local is None or local in shown_local)
                and (not _std_of(redirects, local) & STD_OUT or _std_of(tee, local) & STD_OUT)]


def _signals(text: str) -> List[str]:
    """``--signals-to-handle``: fine when the launcher handles them all (it forwards no other signal)."""
    names = [name.strip().upper() for name in str(text).split(",") if name.strip()]
    others = [name for name in names if name not in HANDLED_SIGNALS]
    if others:
        return [f"--signals-to-handle {text}: the launcher stops the job on {', '.join(HANDLED_SIGNALS)} and "
                f"forwards no other signal ({', '.join(others)}): drop them"]
    return []


def _etcd(kwargs: Dict[str, Any], endpoint: Optional[str], conf: str) -> List[str]:
    """torchrun's etcd rendezvous: ``--rdzv-endpoint`` is the etcd the launchers coordinate through
    (``--coordinator``), and ``--rdzv-conf`` its TLS files (``protocol=https,cacert=,cert=,key=``)
    and timeouts, in the spellings of both of torchrun's etcd backends (:data:`ETCD_CONF`)."""
    if not endpoint:
        return ["--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT (the etcd server)"]
    problems, protocol = [], "http"
    for item in filter(None, (part.strip() for part in conf.split(","))):
        key, sep, value = (text.strip() for text in item.partition("="))
        if key == "protocol" and value.lower() in ("http", "https"):
            protocol = value.lower()
        elif key in ETCD_CONF and sep and value:
            problems.extend(_etcd_conf(kwargs, ETCD_CONF[key], key, value))
        else:
            problems.append(f"--rdzv-conf {item!r}: not one of protocol=http|https, "
                            f"{', '.join(sorted(ETCD_CONF))} (KEY=VALUE)")
    url = f"{'etcds' if protocol == 'https' else 'etcd'}://{endpoint}"
    if kwargs.get("coordinator") not in (None, url):
        problems.append(f"--rdzv-endpoint {endpoint} and --coordinator {kwargs['coordinator']} differ: pass one of them")
    kwargs["coordinator"] = url
    return problems


def _etcd_conf(kwargs: Dict[str, Any], option: str, key: str, value: str) -> List[str]:
    """One ``--rdzv-conf KEY=VALUE`` of an etcd backend onto the launcher option it sets."""
    if option.startswith("coordinator_"):
        kwargs[option] = value
        return []
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        return [f"--rdzv-conf {key}={value}: expected seconds"]
    kwargs[option] = seconds
    return []


def python_command(command: Sequence[str], no_python: bool, module: bool,
                   environ: Mapping[str, str]) -> Tuple[str, ...]:
    """The command as torchrun would run it: ``train.py`` and ``-m pkg`` with the Python interpreter.

    The interpreter is ``$PYTHON_EXEC``, else the one running the launcher (torchrun's rule), with
    ``-u`` so that the ranks' output reaches the console as it is printed. Other commands run as given.

    Raises:
        UsageError: ``--no-python`` with ``--module``, or a ``.py`` script that does not exist.
    """
    if no_python and module:
        raise UsageError("--no-python and --module contradict each other: pass one of them")
    python = environ.get(envnames.PYTHON_EXEC) or sys.executable
    if module:
        return (python, "-u", "-m", *command)
    if no_python or not command[0].endswith(".py"):
        return tuple(command)
    if not os.path.isfile(command[0]):
        raise UsageError(f"script not found: {command[0]}",
                         [f"(run with {python}; looked in {os.getcwd()})"] if not os.path.isabs(command[0]) else [])
    return (python, "-u", *command)
