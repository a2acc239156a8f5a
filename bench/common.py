"""Shared machinery of the benchmarks: jobs, alternation, medians, free ports, temp dirs, cleanup.

Every job is started in its own session (``start_new_session=True``) and the bench process makes
itself a child subreaper, so whatever a launcher leaves behind (ranks in their own sessions, msrun's
``tail -f``, the launcher's orphan guard) re-parents to the bench and is killed and reaped by
:func:`cleanup` after every run. Nothing outlives a run.
"""

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "bench", "scripts")
PYTHON = sys.executable
MSRUN = os.path.join(os.path.dirname(PYTHON), "msrun")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Settings:
    """How much to run: measured runs per variant, warm-up rounds, quick (smoke) mode, overhead runs."""

    runs: int = 5
    warmup: int = 1
    quick: bool = False
    overhead_runs: int = 1


@dataclass
class Row:
    """One line of the results table.

    Attributes:
        bench: Benchmark name (``launch``, ``restart`` ...).
        metric: What is measured, e.g. ``N=4: invoke -> all ranks running``.
        unit: ``ms``, ``MB``, ``%``, ``lines/s``.
        ours: Our median.
        anchors: Anchor name -> median.
        ratio: Human text, e.g. ``9.8x faster than torchrun``.
        target: The target as text.
        met: Whether the target is met (None: no target).
        runs: Measured runs behind the medians.
    """

    bench: str
    metric: str
    unit: str
    ours: Optional[float]
    anchors: Dict[str, Optional[float]] = field(default_factory=dict)
    ratio: str = ""
    target: str = ""
    met: Optional[bool] = None
    runs: int = 0

    def to_json(self) -> dict:
        """The row as a JSON-ready dict."""
        return asdict(self)


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    """Median of the values that are not None (None when there are none)."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def column(runs: Sequence[dict], key: str) -> List[Optional[float]]:
    """``[run[key] for run in runs]`` (None where a run lacks the key)."""
    return [run.get(key) for run in runs]


def speedup(ours: Optional[float], anchor: Optional[float]) -> Optional[float]:
    """``anchor / ours`` for lower-is-better metrics (None if either is missing or ours is 0)."""
    if ours is None or anchor is None or ours <= 0:
        return None
    return anchor / ours


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to the bench so :func:`cleanup` can find and reap them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


#: Pids :func:`cleanup` spares: servers a benchmark starts once for all its runs (etcd).
KEEP: Set[int] = set()


def cleanup(timeout: float = 5.0) -> int:
    """SIGKILL every descendant of the bench (and its process group) but ``KEEP``, then reap them all.

    Returns:
        How many processes were still running (not zombies) and had to be killed.
    """
    own_group = os.getpgrp()
    procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in KEEP]
    running = 0
    for proc in procs:
        try:
            running += proc.status() != psutil.STATUS_ZOMBIE
            pgid = os.getpgid(proc.pid)
            if pgid != own_group:
                os.killpg(pgid, signal.SIGKILL)
            proc.kill()
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    psutil.wait_procs(procs, timeout=timeout)
    _reap_zombies()
    return running


def _reap_zombies() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def free_port() -> int:
    """A TCP port nobody listens on right now (bound to 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TempDir:
    """``with TempDir("launch") as path:`` a fresh directory under /tmp, removed afterwards."""

    def __init__(self, tag: str):
        self.path = tempfile.mkdtemp(prefix=f"bench-{tag}-")

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def sub(self, name: str) -> str:
        """Path of ``name`` inside the directory."""
        return os.path.join(self.path, name)


class Job:
    """One launcher / torchrun / msrun invocation in its own session.

    ``t0`` is ``time.time()`` taken right before ``Popen``: end-to-end intervals start there.
    """

    def __init__(self, argv: Sequence[str], env: Dict[str, str], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, cwd: str = REPO):
        self.argv = list(argv)
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                                     stderr=stderr, start_new_session=True)

    @property
    def pid(self) -> int:
        """The launcher's pid."""
        return self.proc.pid

    def wait(self, timeout: float) -> Optional[int]:
        """Exit status, or None if still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def finish(self, grace: float) -> Optional[int]:
        """Give the job ``grace`` seconds to exit on its own, then kill it and all its descendants."""
        code = self.wait(grace)
        cleanup()
        if code is None:
            self.wait(5.0)
        return code


#: Variables never passed on: launcher / torchrun / msrun settings, and the Python flags that would
#: change what is measured (``PYTHONUNBUFFERED`` makes every printed line a system call;
#: ``PYTHONDONTWRITEBYTECODE`` would make every launcher start compile its sources again).
_DROPPED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RANK_TABLE_FILE",
            "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "OMP_NUM_THREADS")
#: Byte-code cache of every process the bench starts, outside the source tree (gitignored).
PYCACHE = os.path.join(REPO, "bench", "results", "pycache")


def job_env(**bench_vars: object) -> Dict[str, str]:
    """The environment of every job: the bench's own, cleaned (see ``_DROPPED``), with a byte-code
    cache under ``bench/results/pycache`` (as an installed package has), plus ``BENCH_<NAME>`` values."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAUNCHER_", "TORCHELASTIC_", "MS_")) and k not in _DROPPED}
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    env.update({f"BENCH_{k.upper()}": str(v) for k, v in bench_vars.items()})
    return env


def script(name: str) -> str:
    """Absolute path of a rank script in ``bench/scripts``."""
    return os.path.join(SCRIPTS, name)


def launcher_argv(nproc: int, run_dir: str, log_dir: str, command: Sequence[str],
                  options: Sequence[str] = ()) -> List[str]:
    """``python -m launcher run --nproc-per-node N --run-dir D --log-dir D2 [options] -- command``."""
    return [PYTHON, "-m", "launcher", "run", "--nproc-per-node", str(nproc), "--run-dir", run_dir,
            "--log-dir", log_dir, *options, "--", *command]


def torchrun_argv(nproc: int, command: Sequence[str], options: Sequence[str] = ()) -> List[str]:
    """``python -m torch.distributed.run --nproc-per-node N --standalone [options] script args``.

    torchrun runs ``python`` itself, so ``command`` starts at the script.
    """
    return [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
            *options, *command]


def msrun_argv(nproc: int, log_dir: str, command: Sequence[str]) -> List[str]:
    """``msrun --worker_num N --local_worker_num N --master_port P --log_dir D --join True script``."""
    return [MSRUN, "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_port",
            str(free_port()), "--log_dir", log_dir, "--join", "True", *command]


def read_lines(path: str) -> List[List[str]]:
    """The whitespace-split lines of a small text file ([] when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.split() for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def read_events(run_dir: str) -> List[dict]:
    """The launcher's ``events.jsonl`` records."""
    events = []
    try:
        with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                events.append(json.loads(line))
    except FileNotFoundError:
        pass
    return events


def first_event(events: Sequence[dict], name: str, **match: object) -> Optional[dict]:
    """The first event called ``name`` whose fields equal ``match``."""
    for event in events:
        if event.get("event") == name and all(event.get(k) == v for k, v in match.items()):
            return event
    return None


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.002) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def worker_ready(path: str, attempt: str = "0") -> List[float]:
    """Timestamps of the rank lines in a ready file for ``attempt`` (msrun's scheduler excluded)."""
    return [float(f[0]) for f in read_lines(path) if len(f) >= 4 and f[2] == attempt and f[3] != "MS_SCHED"]


class QuietGate:
    """Waits, before each run, until other processes leave the CPUs mostly idle (this machine is
    shared); gives up after ``per_run`` seconds, and for good once ``budget`` seconds were spent
    (then it only reads the CPU load since its previous call, without waiting).

    Attributes:
        waited: Seconds spent waiting so far.
    """

    def __init__(self, threshold: float = 0.25, per_run: float = 1.5, budget: float = 30.0,
                 window: float = 0.05):
        self.threshold, self.per_run, self.budget, self.window = threshold, per_run, budget, window
        self.waited = 0.0

    def wait(self) -> float:
        """Block until the CPUs are at most ``threshold`` busy; returns the last busy fraction seen."""
        if self.waited >= self.budget:
            return psutil.cpu_percent(interval=None) / 100.0
        start = time.monotonic()
        while True:
            busy = psutil.cpu_percent(interval=self.window) / 100.0
            spent = time.monotonic() - start
            if busy <= self.threshold or spent >= self.per_run or self.waited + spent >= self.budget:
                self.waited += spent
                return busy


GATE = QuietGate()


class LoadMeter:
    """CPU time other users of this machine consumed while a run was going on.

    System-wide busy CPU time (``/proc/stat``: user, nice, system, irq, softirq, steal) minus the
    bench's own and its reaped descendants' CPU time (``os.times``; :func:`cleanup` reaps every
    descendant, so all of the run's processes are counted). Call :meth:`share` after the cleanup.
    """

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.monotonic(), _busy_seconds(), _own_seconds()

    def share(self) -> float:
        """Foreign CPU time as a fraction of the machine's capacity over the run (0..1)."""
        wall = time.monotonic() - self.wall
        foreign = (_busy_seconds() - self.busy) - (_own_seconds() - self.own)
        return max(0.0, foreign) / max(wall * (os.cpu_count() or 1), 1e-9)


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class RetryBudget:
    """Seconds each benchmark may spend repeating runs that other processes disturbed.

    A run during which other processes used more than ``RETRY_SHARE`` of the machine is repeated once
    while its benchmark's budget lasts; the discarded runs are kept in ``DISCARDED``.
    """

    def __init__(self, per_benchmark: float = 12.0):
        self.per_benchmark = per_benchmark
        self.left = per_benchmark

    def reset(self) -> None:
        """A new benchmark starts with a full budget."""
        self.left = self.per_benchmark

    def take(self, seconds: float) -> bool:
        """Spend ``seconds`` on a repeat if the budget allows it."""
        if seconds > self.left:
            return False
        self.left -= seconds
        return True


RETRY_SHARE = 0.25
RETRIES = RetryBudget()
DISCARDED: List[dict] = []


def measured(run: Callable[[], dict], label: str) -> dict:
    """One run behind the quiet gate, cleaned up, with ``foreign_cpu_share`` added; repeated once when
    other processes took more than ``RETRY_SHARE`` of the machine during it (budget permitting)."""
    for attempt in range(2):
        busy = GATE.wait()
        meter, started = LoadMeter(), time.monotonic()
        try:
            metrics = run()
        finally:
            cleanup()
        metrics["cpu_busy_before"] = round(busy, 3)
        metrics["foreign_cpu_share"] = round(meter.share(), 3)
        if metrics["foreign_cpu_share"] <= RETRY_SHARE or attempt or not RETRIES.take(time.monotonic() - started):
            return metrics
        DISCARDED.append({"run": label, **metrics})
        progress(f"{label}: other processes used {metrics['foreign_cpu_share']:.0%} of the CPUs; repeating")
    return metrics


def alternate(variants: Dict[str, Callable[[], dict]], settings: Settings,
              label: str = "") -> Dict[str, List[dict]]:
    """Run the variants alternately (A B A B ...): ``warmup`` unrecorded rounds, then ``runs``.

    Each callable runs one complete job and returns its metrics (see :func:`measured`).
    Returns variant -> list of per-run metric dicts (measured rounds only).
    """
    results: Dict[str, List[dict]] = {name: [] for name in variants}
    for round_no in range(settings.warmup + settings.runs):
        warm = round_no < settings.warmup
        for name, run in variants.items():
            tag = f"{label} {name} {'warm-up' if warm else f'run {round_no - settings.warmup + 1}'}"
            metrics = run() if warm else measured(run, tag)
            cleanup()
            if not warm:
                results[name].append(metrics)
            progress(f"{tag}: {_brief(metrics)}")
    return results


def _brief(metrics: dict) -> str:
    shown = []
    for key, value in metrics.items():
        if isinstance(value, float) and key.endswith("_s") and not key.endswith("_per_s"):
            shown.append(f"{key}={value * 1000:.1f}ms")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            shown.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(shown[:3] + [s for s in shown if s.startswith("foreign")])


def progress(text: str) -> None:
    """One progress line on stderr (the results table goes to stdout)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def ms(seconds: Optional[float]) -> Optional[float]:
    """Seconds -> milliseconds (None stays None)."""
    return None if seconds is None else seconds * 1000.0


@dataclass
class Result:
    """What one benchmark hands to the report.

    Attributes:
        rows: Lines of the results table.
        raw: Per-run numbers and anything else worth keeping (goes to ``latest.json``).
        details: Markdown lines for the benchmark's section under the table (breakdowns, caveats).
    """

    rows: List[Row]
    raw: dict
    details: List[str] = field(default_factory=list)


def fmt(value: Optional[float], digits: Optional[int] = None) -> str:
    """A number for the table (``-`` for None): about three significant digits unless ``digits``."""
    if value is None:
        return "-"
    if isinstance(value, int) and digits is None:
        return f"{value:,}"
    if digits is None:
        size = abs(round(value, 1))
        digits = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 or size == 0 else 3
    if abs(value) >= 1000:
        return f"{value:,.{digits}f}"
    return f"{value:.{digits}f}"
