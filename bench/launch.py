"""Benchmark 1: launch latency, from invoking the launcher to all N ranks running user code.

The clock starts with ``time.time()`` right before ``Popen`` and stops at the last rank's own
timestamp (``scripts/ready.py`` appends ``time.time()`` as its first statement after its imports).
Anchors: torchrun (``--standalone``) and msrun, alternated with the launcher run by run. Our
launcher's ``events.jsonl`` splits its time into start-up (interpreter, imports, option parsing,
run-dir set-up: invocation -> ``start`` event), spawning (``start`` -> last ``rank_spawned``) and
the ranks' own start-up (last ``rank_spawned`` -> last rank running).
"""

import os
import re
import subprocess
import time
from typing import Dict, List, Optional

import psutil

from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, alternate, cleanup, column, first_event,
                          fmt, job_env, launcher_argv, median, ms, msrun_argv, read_events, script,
                          speedup, torchrun_argv, wait_until, worker_ready)

NAME = "launch"
TARGET = 10.0
ANCHORS = ("torchrun", "msrun")


def _argv(kind: str, nproc: int, tmp: TempDir) -> List[str]:
    if kind == "ours":
        return launcher_argv(nproc, tmp.sub("run"), tmp.sub("logs"), [PYTHON, script("ready.py")])
    if kind == "torchrun":
        return torchrun_argv(nproc, [script("ready.py")])
    return msrun_argv(nproc, tmp.sub("msrun-logs"), [script("ready.py")])


def one_run(kind: str, nproc: int) -> dict:
    """Start ``kind`` with ``nproc`` trivial ranks; seconds from invocation to each rank running."""
    tmp = TempDir(f"launch-{kind}")
    with tmp:
        ready = tmp.sub("ready")
        job = Job(_argv(kind, nproc, tmp), job_env(ready=ready))
        wait_until(lambda: len(worker_ready(ready)) >= nproc or job.proc.poll() is not None, 120, 0.005)
        cpu = _own_cpu(job.pid) if kind == "ours" else None
        code = job.finish(grace=0.5)
        stamps = worker_ready(ready)
        if len(stamps) < nproc:
            return {"error": f"only {len(stamps)} of {nproc} ranks ran (exit {code})", "exit": code}
        metrics = {"latency_s": max(stamps) - job.t0, "first_rank_s": min(stamps) - job.t0, "exit": code}
        if kind == "ours":
            metrics.update(_phases(read_events(tmp.sub("run")), job.t0, max(stamps)))
            metrics["launcher_cpu_s"] = cpu
    return metrics


def _own_cpu(pid: int) -> Optional[float]:
    """CPU seconds the launcher process itself used so far (not its ranks): its cost to get the ranks
    running, which other processes on a shared machine inflate less than its wall time."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _phases(events: List[dict], t0: float, last_rank: float) -> Dict[str, Optional[float]]:
    start = first_event(events, "start")
    spawned = [e["ts"] for e in events if e.get("event") == "rank_spawned"]
    if start is None or not spawned:
        return {}
    return {"startup_s": start["ts"] - t0, "spawn_s": max(spawned) - start["ts"],
            "rank_startup_s": last_rank - max(spawned)}


def run(settings: Settings) -> Result:
    """Launch latency for N = 1, 4, 8 (1 and 4 with ``--quick``), plus start-up diagnostics."""
    rows, raw, details = [], {}, []
    for nproc in ((1, 4) if settings.quick else (1, 4, 8)):
        variants = {kind: (lambda k=kind, n=nproc: one_run(k, n)) for kind in ("ours",) + ANCHORS}
        runs = alternate(variants, settings, f"launch N={nproc}")
        raw[f"N={nproc}"] = runs
        rows.append(_row(nproc, runs))
        details.append(_breakdown(nproc, runs["ours"]))
    diag = startup_diagnostics(settings)
    raw["startup_diagnostics"] = diag
    details.extend(_diag_lines(diag))
    return Result(rows, raw, details)


def _row(nproc: int, runs: Dict[str, List[dict]]) -> Row:
    ours = ms(median(column(runs["ours"], "latency_s")))
    anchors = {a: ms(median(column(runs[a], "latency_s"))) for a in ANCHORS}
    ups = {a: speedup(ours, anchors[a]) for a in ANCHORS}
    ratio = ", ".join(f"{fmt(ups[a])}x faster than {a}" for a in ANCHORS if ups[a] is not None)
    met = all(u is not None and u >= TARGET for u in ups.values())
    return Row(NAME, f"N={nproc}: invocation -> all ranks running", "ms", ours, anchors, ratio,
               f">= {TARGET:g}x faster than torchrun and msrun", met, len(runs["ours"]))


def _breakdown(nproc: int, runs: List[dict]) -> str:
    parts = [(label, ms(median(column(runs, key)))) for label, key in (
        ("launcher start-up (interpreter, imports, options, run dir) -> `start` event", "startup_s"),
        ("`start` -> last `rank_spawned`", "spawn_s"),
        ("last `rank_spawned` -> last rank running (rank interpreter start-up)", "rank_startup_s"),
        ("CPU of the launcher process itself up to then", "launcher_cpu_s"))]
    return f"- N={nproc}, ours (medians): " + "; ".join(f"{label}: {fmt(value)} ms" for label, value in parts)


def _timed(argv: List[str], runs: int, env: Optional[Dict[str, str]] = None) -> Optional[float]:
    """Median wall time of ``argv`` (seconds) over ``runs`` runs after one warm-up."""
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(argv, env=env or job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        if i:
            times.append(time.perf_counter() - start)
    return median(times)


def startup_diagnostics(settings: Settings) -> dict:
    """Interpreter start-up, ``launcher --help`` / ``run --help`` wall time, and the top imports of a
    real ``launcher run`` (``python -X importtime``)."""
    runs = 3 if settings.quick else 5
    diag = {"python_c_pass_s": _timed([PYTHON, "-c", "pass"], runs),
            "python_S_c_pass_s": _timed([PYTHON, "-S", "-c", "pass"], runs),
            "launcher_run_help_s": _timed([PYTHON, "-m", "launcher", "run", "--help"], runs),
            "launcher_prestop_help_s": _timed([PYTHON, "-m", "launcher", "prestop", "--help"], runs),
            "launcher_run_help_no_pyc_s": _timed([PYTHON, "-m", "launcher", "run", "--help"], runs,
                                                 dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))}
    with TempDir("importtime") as tmp:
        argv = [PYTHON, "-X", "importtime", "-m", "launcher", "run", "--nproc-per-node", "1", "--run-dir",
                f"{tmp}/run", "--log-dir", f"{tmp}/logs", "--", PYTHON, "-c", "pass"]
        _timed(argv, 0)  # warm the byte-code cache of everything the run path imports
        proc = subprocess.run(argv, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              check=False)
        cleanup()
    diag.update(spawn_cost(40))
    diag["importtime_top"] = top_imports(proc.stderr)
    diag["importtime_total_s"] = sum(t for _, t in top_level_imports(proc.stderr)) / 1e6
    return diag


def spawn_cost(rounds: int) -> dict:
    """Seconds ``Popen`` of ``true`` takes in this process (median of ``rounds``, alternated), started
    as the launcher starts ranks: fork + ``preexec_fn`` (the parent-death signal set in the child) and,
    where setpriv can set it, vfork + ``setpriv --pdeathsig KILL``; with this process's resident size."""
    from launcher.supervision.spawn import Spawner

    variants = {"spawn_preexec_s": Spawner(None), "spawn_setpriv_s": Spawner()}
    if not variants["spawn_setpriv_s"].usable():
        del variants["spawn_setpriv_s"]
    times: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, spawner in variants.items():
            start = time.perf_counter()
            proc = spawner.popen(["true"], dict(os.environ), {"stdin": subprocess.DEVNULL}, None)
            times[name].append(time.perf_counter() - start)
            proc.wait()
    result = {name: median(values) for name, values in times.items()}
    result["spawn_parent_rss_mib"] = psutil.Process().memory_info().rss / (1 << 20)
    return result


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def top_level_imports(stderr: str) -> List[tuple]:
    """``(module, cumulative microseconds)`` of each top-level import in ``-X importtime`` output."""
    found = []
    for match in _IMPORT_LINE.finditer(stderr):
        if not match.group(3):
            found.append((match.group(4), int(match.group(2))))
    return found


def top_imports(stderr: str, count: int = 10) -> List[dict]:
    """The ``count`` most expensive top-level imports (cumulative time), biggest first."""
    ranked = sorted(top_level_imports(stderr), key=lambda item: -item[1])[:count]
    return [{"module": name, "cumulative_ms": round(us / 1000.0, 2)} for name, us in ranked]


def _diag_lines(diag: dict) -> List[str]:
    lines = [f"- Start-up anchors (median wall time): `python -c pass` {fmt(ms(diag['python_c_pass_s']))} ms, "
             f"`python -S -c pass` {fmt(ms(diag['python_S_c_pass_s']))} ms, "
             f"`python -m launcher run --help` {fmt(ms(diag['launcher_run_help_s']))} ms, "
             f"`python -m launcher prestop --help` {fmt(ms(diag['launcher_prestop_help_s']))} ms; "
             f"`launcher run --help` in this machine's own environment, where `PYTHONDONTWRITEBYTECODE=1` "
             f"leaves the editable-installed launcher without byte-code and every start compiles it: "
             f"{fmt(ms(diag['launcher_run_help_no_pyc_s']))} ms (the bench gives every job a byte-code "
             f"cache, as an installed package has).",
             f"- Starting one process (`Popen` of `true`, median of 40, in the bench process of "
             f"{fmt(diag['spawn_parent_rss_mib'])} MiB): fork + `preexec_fn` {fmt(ms(diag['spawn_preexec_s']))} ms; "
             f"vfork + `setpriv --pdeathsig KILL` (how ranks start where setpriv can set that signal) "
             f"{fmt(ms(diag.get('spawn_setpriv_s')))} ms.",
             f"- `python -X importtime -m launcher run --nproc-per-node 1 ... -- python -c pass`: "
             f"{fmt(ms(diag['importtime_total_s']))} ms of imports in total; top-level imports by "
             "cumulative time: " + ", ".join(f"`{i['module']}` {fmt(i['cumulative_ms'])} ms"
                                              for i in diag["importtime_top"]) + "."]
    return lines
