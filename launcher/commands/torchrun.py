"""torchrun habits for ``launcher run``: its spellings, ``--standalone``, ``--rdzv-*``, ``train.py`` alone.

A torchrun command line works after changing the program name. torchrun's underscore spellings
(``--nproc_per_node``) are matched by the command's ``token_normalize_func``; the options torchrun has
and the launcher does not are hidden options here, translated by :func:`translate` into ``run``'s own
options, or refused with one line each saying what to do instead (exit 2).
"""

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import click

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.jobspec import hostfacts

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

#: torchrun options the launcher has no use for: option -> (takes a value, what to do instead).
REFUSED: Dict[str, Tuple[bool, str]] = {
    "--monitor-interval": (True, "the launcher sees a rank exit at once, without polling: drop it"),
    "--start-method": (True, "each rank is a fresh process: drop it"),
    "--role": (True, "ranks are named by --framework (worker, MindSpore scheduler): drop it"),
    "--run-path": (False, "each rank runs in its own process: drop it"),
    "--log-line-prefix-template": (True, "console lines start with [rank N]: drop it"),
    "--redirects": (True, "every rank's output goes to <log-dir>/<session>/attempt_<n>/rank_<r>.log: drop it"),
    "--tee": (True, "every rank's output goes to its log file, and to the console per --console-ranks: "
                    "drop it"),
    "--local-ranks-filter": (True, "use --console-ranks with global ranks"),
    "--duplicate-stdout-filters": (True, "not supported: search the per-rank log files instead"),
    "--duplicate-stderr-filters": (True, "not supported: search the per-rank log files instead"),
    "--event-log-handler": (True, "the launcher's events are in <run-dir>/events.jsonl: drop it"),
    "--logs-specs": (True, "the launcher's log layout is fixed (see --log-dir): drop it"),
    "--local-addr": (True, "use --server-id to say which server of the rank table this is"),
    "--numa-binding": (True, "use --bind-cores auto (each rank on its NPU's NUMA node; docs/cpu-binding.md)"),
    "--signals-to-handle": (True, "the launcher handles SIGTERM, SIGINT and SIGHUP: drop it"),
    "--virtual-local-rank": (False, "not supported: each rank sees its device as LOCAL_RANK / DEVICE_ID"),
}
_SHORT = {"--redirects": "-r", "--tee": "-t"}


def normalize_token(token: str) -> str:
    """torchrun spells every option both ways: ``--nproc_per_node`` is ``--nproc-per-node``."""
    return token.replace("_", "-")


def hidden_options() -> List[click.Option]:
    """torchrun's options that ``run`` does not show in its help."""
    options = [
        click.Option(["--standalone"], is_flag=True, hidden=True),
        click.Option(["--rdzv-backend"], hidden=True),
        click.Option(["--rdzv-endpoint"], hidden=True),
        click.Option(["--rdzv-id"], hidden=True),
        click.Option(["--rdzv-conf"], hidden=True),
        click.Option(["--shutdown-timeout"], type=click.FloatRange(min=0), hidden=True),
    ]
    for name, (takes_value, _hint) in REFUSED.items():
        decls = [name] + ([_SHORT[name]] if name in _SHORT else [])
        options.append(click.Option(decls + [_param_name(name)], is_flag=not takes_value, hidden=True))
    return options


def _param_name(option: str) -> str:
    return "torchrun_" + option[2:].replace("-", "_")


def command_options() -> List[click.Option]:
    """How the command is run: torchrun's ``--no-python`` and ``-m`` (shown in the help)."""
    return [
        click.Option(["--no-python"], is_flag=True,
                     help="Run a COMMAND ending in .py as it is, not with the Python interpreter."),
        click.Option(["-m", "--module"], is_flag=True,
                     help="COMMAND is a Python module: run it as `python -m COMMAND`."),
    ]


class NprocType(click.ParamType):
    """``--nproc-per-node``: a count, or torchrun's ``cpu`` / ``auto``, or ``npu`` (Ascend devices)."""

    name = "N"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int):
            count = value
        elif str(value).strip().isdigit():
            count = int(value)
        else:
            word = str(value).strip().lower()
            if word not in ("auto", "cpu", "npu"):
                self.fail(f"{value!r}: expected a number of processes, auto, cpu or npu "
                          "(the launcher does not count GPUs: pass their number)", param, ctx)
            npus = npu_count()
            if word == "npu" and not npus:
                self.fail("npu: no Ascend devices (/dev/davinci<N>) on this machine", param, ctx)
            count = npus if word == "npu" or (word == "auto" and npus) else cpu_count()
        if count < 1:
            self.fail(f"{value!r} is not at least 1", param, ctx)
        return count


class NnodesType(click.ParamType):
    """``--nnodes``: ``N``, or torchrun's ``MIN:MAX``: an int when both are the same (a fixed
    membership), else the pair ``(MIN, MAX)`` (elastic membership, with ``--coordinator``)."""

    name = "N|MIN:MAX"

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Union[int, Tuple[int, int]]:
        if isinstance(value, (int, tuple)):
            parts = list(value) if isinstance(value, tuple) else [value]
        else:
            try:
                parts = [int(part) for part in str(value).split(":")]
            except ValueError:
                self.fail(f"{value!r} is not a number of nodes", param, ctx)
        if len(parts) > 2 or min(parts) < 1:
            self.fail(f"{value!r}: expected N or MIN:MAX, each at least 1", param, ctx)
        if parts[0] > parts[-1]:
            self.fail(f"{value!r}: MIN is above MAX", param, ctx)
        return parts[0] if len(set(parts)) == 1 else (parts[0], parts[1])


def cpu_count() -> int:
    """CPUs this process may run on (what torchrun's ``cpu`` counts)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def npu_count(dev: str = "/dev") -> int:
    """Ascend NPUs visible here: the container sees only the ``davinci<N>`` devices it was given."""
    return len(hostfacts.davinci_devices(dev))


def translate(kwargs: Dict[str, Any], explicit: Sequence[str]) -> Dict[str, Any]:
    """Turn the torchrun options in ``kwargs`` into ``run``'s own; refuse the ones it has no use for.

    Args:
        kwargs: Every parsed option of ``run``; the torchrun-only keys are removed.
        explicit: Names of the options the user gave (command line, environment, --config file).

    Raises:
        UsageError: one line per refused or contradictory option.
    """
    problems = []
    for option, (_takes_value, hint) in REFUSED.items():
        if kwargs.pop(_param_name(option)):
            problems.append(f"{option} is torchrun's: {hint}")
    standalone = kwargs.pop("standalone")
    backend, endpoint, rdzv_id = kwargs.pop("rdzv_backend"), kwargs.pop("rdzv_endpoint"), kwargs.pop("rdzv_id")
    conf, etcd = kwargs.pop("rdzv_conf"), (backend or "").lower() in ETCD_BACKENDS
    shutdown_timeout = kwargs.pop("shutdown_timeout")
    if shutdown_timeout is not None:
        kwargs["stop_timeout"] = shutdown_timeout
    if backend is not None and backend.lower() not in RDZV_BACKENDS + ETCD_BACKENDS:
        problems.append(f"--rdzv-backend {backend}: not supported; rank 0 hosts the store as with torchrun's "
                        "static or c10d backends, etcd coordinates restarts (pass one of those, or drop it)")
    if conf and not etcd:
        problems.append("--rdzv-conf is torchrun's: the launcher has no rendezvous to configure (rank 0 hosts "
                        "the store): drop it")
    if standalone:
        problems.extend(_standalone(kwargs, explicit))
    elif etcd:
        problems.extend(_etcd(kwargs, endpoint, conf or ""))
    elif endpoint:
        problems.extend(_endpoint(kwargs, endpoint))
    if rdzv_id and not standalone:
        if kwargs.get("run_id") and kwargs["run_id"] != rdzv_id:
            problems.append(f"--rdzv-id {rdzv_id} and --run-id {kwargs['run_id']} differ: pass one of them")
        kwargs["run_id"] = rdzv_id
    if (backend or "").lower() in ("c10d",) + ETCD_BACKENDS and not standalone and kwargs.get("nnodes", 1) != 1 \
            and "node_rank" not in explicit:
        problems.append(f"--rdzv-backend {backend} with several nodes: the launcher does not hand out node ranks "
                        "at rendezvous; pass --node-rank on each node (0 on the master's host)")
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} torchrun options cannot be used here", problems)
    return kwargs


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
    if not host or (port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536)):
        return [f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT"]
    port = int(port_text) if port_text else RDZV_DEFAULT_PORT
    problems = []
    for key, value in (("master_addr", host), ("master_port", port)):
        if kwargs.get(key) not in (None, value):
            problems.append(f"--rdzv-endpoint {endpoint} and --{key.replace('_', '-')} {kwargs[key]} differ: "
                            "pass one of them")
        kwargs[key] = value
    return problems


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
            option = ETCD_CONF[key]
            if option.startswith("coordinator_"):
                kwargs[option] = value
            elif _is_number(value):
                kwargs[option] = float(value)
            else:
                problems.append(f"--rdzv-conf {key}={value}: expected seconds")
        else:
            problems.append(f"--rdzv-conf {item!r}: not one of protocol=http|https, "
                            f"{', '.join(sorted(ETCD_CONF))} (KEY=VALUE)")
    url = f"{'etcds' if protocol == 'https' else 'etcd'}://{endpoint}"
    if kwargs.get("coordinator") not in (None, url):
        problems.append(f"--rdzv-endpoint {endpoint} and --coordinator {kwargs['coordinator']} differ: pass one of them")
    kwargs["coordinator"] = url
    return problems


def _is_number(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


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
