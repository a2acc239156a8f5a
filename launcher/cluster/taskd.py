"""MindCluster TaskD support: what the vendor's ``train_start.sh`` + ``manager.py`` did, as functions.

The legacy set-up (``docs/ascend-reference.md`` section 6) was: export ``LD_PRELOAD`` with
``libtaskd.so`` and ``TASKD_PROCESS_ENABLE=on`` for every rank, and on the server hosting global
rank 0 run ``python manager.py &`` (``init_taskd_manager(config)`` then the blocking
``start_taskd_manager()``), unsupervised. The launcher replaces that with:

- :func:`taskd_enabled` - ``--taskd auto|on|off``;
- :func:`rank_env` - the two variables every rank needs (``libtaskd.so`` from :func:`libtaskd_path`);
- :func:`manager_config` - the ``init_taskd_manager`` dict;
- :func:`check_port_free` - fail early, naming the holder, when the manager's port is taken;
- :func:`sidecar_argv` - the command of ``launcher.cluster.taskd_sidecar``, which runs and restarts the manager.

What the public TaskD sources (``Ascend/mind-cluster``, ``component/taskd``) show, and why the
config holds only three keys: see ``docs/taskd.md``. Nothing heavy is imported at module level
(``psutil`` only when a port is busy); ``taskd`` itself is never imported in the launcher.
"""

import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional

from launcher.common import envnames
from launcher.common.errors import LauncherError, UsageError
from launcher.common import rundir as rundir_mod
from launcher.jobspec.options import TASKD_DEFAULT_PORT
from launcher.supervision.integration import Host, Integration

log = logging.getLogger(__name__)

#: The TaskD manager's port: ``MgrPort = ":9601"`` in TaskD, a constant (pods declare it ``taskd-port``).
DEFAULT_PORT = TASKD_DEFAULT_PORT
#: Values of ``--taskd``.
MODES = ("auto", "on", "off")
#: ``libtaskd.so`` relative to the ``taskd`` package directory.
LIB_RELPATH = os.path.join("python", "cython_api", "libs", "libtaskd.so")
#: ``init_taskd_manager`` keys the launcher passes (exactly those of the vendor's ``manager.py``).
CONFIG_KEYS = ("job_id", "node_nums", "proc_per_node")


def _machine(unknown: str) -> str:
    """This machine's architecture, for the messages of a missing TaskD; ``platform`` is imported here
    only (about 1.5 ms of every launch's start-up otherwise, for a line hardly any run prints)."""
    import platform

    return platform.machine() or unknown


def _install_hint() -> List[str]:
    arch = _machine("<arch>")
    return [f"install the TaskD wheel from the MindCluster release into {sys.executable}'s environment: "
            f"pip install taskd-<version>-py3-none-linux_{arch}.whl",
            "(the PyPI project named 'taskd' is unrelated: do not 'pip install taskd')",
            "or run with --taskd off (or auto: TaskD is then used only where it is installed)"]


def _package_dir() -> Optional[str]:
    """Directory of the importable ``taskd`` package, without importing it; None when absent."""
    try:
        spec = importlib.util.find_spec("taskd")
    except (ImportError, ValueError):  # ValueError: a half-initialised sys.modules["taskd"]
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return os.path.abspath(locations[0])
    if spec.origin:  # a plain module taskd.py: certainly not MindCluster's package
        return os.path.dirname(os.path.abspath(spec.origin))
    return None


def _is_mindcluster_taskd(pkg_dir: str) -> bool:
    """MindCluster's wheel has ``taskd/api`` (``init_taskd_manager``) and ``taskd/python``."""
    has_api = os.path.isdir(os.path.join(pkg_dir, "api")) or os.path.isfile(os.path.join(pkg_dir, "api.py"))
    return has_api and os.path.isdir(os.path.join(pkg_dir, "python"))


def taskd_enabled(mode: str, environ: Mapping[str, str]) -> bool:
    """Whether this run uses TaskD.

    Args:
        mode: ``auto`` (on when MindCluster's ``taskd`` package is importable and
            ``TASKD_PROCESS_ENABLE`` is not ``off``), ``on`` (required: error when missing) or ``off``.
        environ: The launcher's environment.

    Raises:
        UsageError: Unknown mode, or ``on`` without the package (the message says how to install it).
    """
    normalized = (mode or "").strip().lower()
    if normalized not in MODES:
        raise UsageError(f"--taskd must be one of {', '.join(MODES)}, not {mode!r}")
    if normalized == "off":
        return False
    pkg_dir = _package_dir()
    if normalized == "auto":
        if pkg_dir is None:
            return False
        if not _is_mindcluster_taskd(pkg_dir):
            log.warning("ignoring the 'taskd' package at %s: it is not MindCluster's TaskD (no taskd/api)",
                        pkg_dir)
            return False
        if environ.get(envnames.TASKD_PROCESS_ENABLE, "").strip().lower() == "off":
            log.info("TaskD is installed but %s=off: not using it", envnames.TASKD_PROCESS_ENABLE)
            return False
        return True
    if pkg_dir is None:
        raise UsageError("--taskd on: MindCluster's TaskD package is not installed "
                         f"('import taskd' fails for {sys.executable})", _install_hint())
    if not _is_mindcluster_taskd(pkg_dir):
        raise UsageError(f"--taskd on: the 'taskd' package at {pkg_dir} is not MindCluster's TaskD "
                         "(it has no taskd/api)", _install_hint())
    return True


def libtaskd_path() -> str:
    """``<taskd package dir>/python/cython_api/libs/libtaskd.so``, the library every rank preloads.

    Raises:
        UsageError: The package is missing, or the library is not where TaskD installs it.
    """
    pkg_dir = _package_dir()
    if pkg_dir is None:
        raise UsageError("cannot locate libtaskd.so: MindCluster's TaskD package is not installed",
                         _install_hint())
    path = os.path.join(pkg_dir, LIB_RELPATH)
    if not os.path.isfile(path):
        raise UsageError(f"TaskD is installed at {pkg_dir} but {path} does not exist",
                         ["reinstall the TaskD wheel that matches this machine's architecture "
                          f"({_machine('unknown')})", "or run with --taskd off"])
    return path


def _preload_entries(value: str) -> List[str]:
    # ld.so splits LD_PRELOAD on colons and spaces.
    return [entry for entry in value.replace(" ", ":").split(":") if entry]


def job_rank_env(mode: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """What every rank gets for ``--taskd MODE`` (empty when TaskD is off).

    Raises:
        UsageError: TaskD required (``on``) but its package or library is missing.
    """
    return rank_env(environ, libtaskd_path()) if taskd_enabled(mode, environ) else {}


def rank_env(environ: Mapping[str, str], lib_path: str) -> Dict[str, str]:
    """The variables a rank needs for TaskD: ``TASKD_PROCESS_ENABLE=on`` and ``LD_PRELOAD``.

    ``LD_PRELOAD`` keeps what ``environ`` already preloads (extended, never replaced). The library
    goes first, as in the vendor's ``export LD_PRELOAD=$TASKD_SO_PATH:$LD_PRELOAD``; when it is
    already listed (same path, or the same file through another path) the value is left as it is.

    Args:
        environ: The environment the rank would otherwise get (the launcher's).
        lib_path: From :func:`libtaskd_path`.
    """
    existing = environ.get(envnames.LD_PRELOAD, "")
    entries = _preload_entries(existing)
    target = os.path.realpath(lib_path)
    if any(entry == lib_path or os.path.realpath(entry) == target for entry in entries):
        preload = existing
    else:
        preload = ":".join([lib_path] + entries)
    return {envnames.TASKD_PROCESS_ENABLE: "on", envnames.LD_PRELOAD: preload}


def manager_config(job_id: str, node_nums: int, proc_per_node: int) -> dict:
    """The ``init_taskd_manager`` config: ``job_id``, ``node_nums``, ``proc_per_node``.

    These are the keys of the vendor's ``manager.py``. The other documented keys are deliberately
    left out: ``taskd_enable`` and ``fault_recover`` are filled in by ``init_taskd_manager`` itself
    from ``TASKD_PROCESS_ENABLE`` / ``PROCESS_RECOVER``; ``plugin_dir`` has no launcher-side value;
    and ``cluster_infos``, documented as a dict, is a *list* of ClusterD server entries in TaskD's
    backend (a dict makes ``init_taskd_manager`` return False) and does not move the manager's
    address or port (``$POD_IP:9601``, fixed). See ``docs/taskd.md``.

    Args:
        job_id: ``MINDX_TASK_ID`` under MindCluster, else the launcher's run id.
        node_nums: Servers in the job.
        proc_per_node: Training processes per server.

    Raises:
        UsageError: An empty job id or a non-positive count.
    """
    if not isinstance(job_id, str) or not job_id:
        raise UsageError(f"TaskD needs a job id (MINDX_TASK_ID or the run id), got {job_id!r}")
    for name, value in (("node_nums", node_nums), ("proc_per_node", proc_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"TaskD {name} must be a positive integer, got {value!r}")
    return {"job_id": job_id, "node_nums": node_nums, "proc_per_node": proc_per_node}


def _try_bind(port: int, host: str, reuse: bool) -> Optional[OSError]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1 if reuse else 0)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _port_holders(port: int) -> List[str]:
    """``pid N: cmdline`` of processes listening on ``port``, as far as psutil can tell."""
    try:
        import psutil

        conns = psutil.net_connections(kind="inet")
    except Exception:  # psutil missing or not permitted: the caller says so
        return []
    holders = []
    for pid in sorted({c.pid for c in conns if c.laddr and c.laddr.port == port
                       and c.status == psutil.CONN_LISTEN and c.pid}):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
        except psutil.Error:
            cmd = "?"
        holders.append(f"pid {pid}: {cmd[:200]}")
    return holders


def check_port_free(port: int, host: str = "0.0.0.0") -> None:
    """Fail early when the manager's port is taken (TaskD would only log it and run without network).

    The bind test runs without ``SO_REUSEADDR``, so any socket bound to the port counts. When
    that fails but a bind *with* ``SO_REUSEADDR`` succeeds, nothing listens there: only
    ``TIME_WAIT`` remnants of a previous manager's connections, which the manager's own listener
    (Go sets ``SO_REUSEADDR``) binds through, so the port is reported free.

    Raises:
        LauncherError: The port is in use; names the process holding it when psutil can tell.
    """
    error = _try_bind(port, host, reuse=False)
    if error is None:
        return
    if _try_bind(port, host, reuse=True) is None:
        log.debug("port %d: only TIME_WAIT connections left, treating it as free", port)
        return
    holders = _port_holders(port)
    problems = [f"held by {h}" for h in holders] or [
        "psutil cannot tell which process holds it (run 'ss -ltnp' as root to see it)"]
    problems += ["a TaskD manager from an earlier run (or the legacy 'python manager.py &') may still be "
                 "running: stop it, or run with --taskd off"]
    raise LauncherError(f"TaskD manager port {port} on {host} is not available: {error.strerror or error}",
                        problems)


def sidecar_argv(config: dict, events_path: str, run_id: str, pod_ip: Optional[str] = None,
                 parent_pid: Optional[int] = None) -> List[str]:
    """The command of the TaskD sidecar (``launcher.cluster.taskd_sidecar``), to start before the ranks.

    Args:
        config: From :func:`manager_config`.
        events_path: The run's ``events.jsonl``.
        run_id: Stamped on the sidecar's events.
        pod_ip: When known, the manager's ``POD_IP`` (the address TaskD listens on; without one it
            listens on 127.0.0.1 only, enough for a single server).
        parent_pid: The process that will start the sidecar, default this one: the sidecar exits
            at once if that process is already gone when it starts.
    """
    argv = [sys.executable, "-m", "launcher.cluster.taskd_sidecar", "--config", json.dumps(config, sort_keys=True),
            "--events", events_path, "--run-id", run_id,
            "--parent-pid", str(os.getpid() if parent_pid is None else parent_pid)]
    if pod_ip:
        argv += ["--pod-ip", pod_ip]
    return argv


class TaskdManager(Integration):
    """The TaskD manager sidecar: started before the ranks on the server hosting global rank 0 only,
    stopped after them (SIGTERM to its group, SIGKILL after 5 s). Its exit is reported, never fatal."""

    name = "TaskD manager sidecar"

    def __init__(self) -> None:
        self.sidecar: Optional[subprocess.Popen] = None
        self._host: Optional[Host] = None
        self._env: Dict[str, str] = {}

    def start(self, host: Host) -> None:
        """With TaskD on, every rank preloads libtaskd.so (:meth:`rank_env`); the sidecar starts on the
        server hosting rank 0 only.

        Raises:
            UsageError: ``--taskd on`` without the package or its library (nothing runs yet).
        """
        self._env = job_rank_env(host.spec.cluster.taskd, host.ctx.base_env)
        if not self._env or not host.ctx.topology.hosts_rank0:
            return
        self._host = host
        ctx = host.ctx
        check_port_free(host.spec.cluster.taskd_port)
        topo = ctx.topology
        config = manager_config(ctx.base_env.get(envnames.MINDX_TASK_ID) or ctx.run_id,
                                topo.table.server_count, len(topo.server.devices))
        argv = sidecar_argv(config, host.run_dir.file(rundir_mod.EVENTS), ctx.run_id,
                            pod_ip=ctx.base_env.get(envnames.POD_IP) or topo.table.master_addr)
        log_path = os.path.join(host.log_session, "taskd_manager.log")
        with open(log_path, "ab") as out:
            self.sidecar = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, close_fds=True)
        host.guard.watch(self.sidecar.pid)
        host.group.watch_pid(self.sidecar.pid, self._exited)
        host.emit("taskd_sidecar_started", pid=self.sidecar.pid, config=config, log=log_path)
        log.info("TaskD manager started (pid %d, log %s)", self.sidecar.pid, log_path)

    def starts_processes(self, host: Host) -> bool:
        """The sidecar starts with TaskD on, on the server hosting rank 0."""
        return bool(job_rank_env(host.spec.cluster.taskd, host.ctx.base_env)) and host.ctx.topology.hosts_rank0

    def rank_env(self) -> Dict[str, str]:
        """``TASKD_PROCESS_ENABLE`` and ``LD_PRELOAD`` with libtaskd.so for every rank (TaskD on)."""
        return dict(self._env)

    def _exited(self, info) -> None:
        self.sidecar.returncode = info.returncode
        self._host.emit("taskd_sidecar_exited", returncode=info.returncode)
        if info.returncode != 0:
            # Reported, never fatal: training goes on without process-level recovery.
            log.warning("the TaskD manager sidecar exited (%s); training continues without it", info.describe())

    def stop(self) -> None:
        """After the ranks: SIGTERM the sidecar's group, SIGKILL it after 5 s."""
        if self.sidecar is None or self.sidecar.returncode is not None:
            return
        group = self._host.group
        os.killpg(self.sidecar.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while self.sidecar.returncode is None and time.monotonic() < deadline:
            group.wait_event(0.05)
        if self.sidecar.returncode is None:
            os.killpg(self.sidecar.pid, signal.SIGKILL)
            group.wait_event(1.0)
        self._host.guard.forget(self.sidecar.pid)
