"""Benchmark 5: supervisor overhead while 8 idle ranks sleep.

Our launcher and torchrun each supervise 8 ranks running ``scripts/sleeper.py``. The two jobs run at
the same time (both are idle, so they hardly compete; this halves the benchmark's 60 s cost). CPU
time (user + sys, from psutil, of the launcher / ``torch.distributed.run`` agent process only, not
its children) is sampled at t = 5 s and t = 65 s after the invocation (and at least 1 s after all
ranks run), so start-up is excluded. RSS is sampled every 0.5 s; the peak is the larger of the
largest sample and the kernel's ``VmHWM``. One run by default (``--overhead-runs``).
"""

import os
import signal
import time
from typing import Dict, List, Optional

import psutil

from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, cleanup, fmt, job_env, launcher_argv,
                          median, progress, script, torchrun_argv, wait_until, worker_ready)

NAME = "overhead"
NPROC = 8
KINDS = ("ours", "torchrun")


class _Watched:
    """One supervised job and its samples."""

    def __init__(self, kind: str, tmp: TempDir):
        self.kind, self.ready = kind, tmp.sub(f"ready-{kind}")
        command = [PYTHON, script("sleeper.py")]
        argv = (launcher_argv(NPROC, tmp.sub("run"), tmp.sub("logs"), command) if kind == "ours"
                else torchrun_argv(NPROC, command[1:]))
        self.job = Job(argv, job_env(ready=self.ready, sleep=600))
        self.proc = psutil.Process(self.job.pid)
        self.rss: List[int] = []
        self.cpu: Dict[str, float] = {}

    def sample_rss(self) -> None:
        """Record the process's current RSS."""
        try:
            self.rss.append(self.proc.memory_info().rss)
        except psutil.Error:
            pass

    def cpu_now(self) -> float:
        """The process's CPU time so far (user + sys), children excluded."""
        times = self.proc.cpu_times()
        return times.user + times.system

    def peak_rss(self) -> int:
        """The largest RSS seen: samples and the kernel's high-water mark."""
        return max(self.rss + [_vm_hwm(self.job.pid) or 0])


def _vm_hwm(pid: int) -> Optional[int]:
    """The kernel's peak resident set size of ``pid`` in bytes."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def one_run(settings: Settings) -> Dict[str, dict]:
    """Both jobs at once; returns per kind the CPU share of one core and the peak RSS."""
    start_at, window = (2.0, 5.0) if settings.quick else (5.0, 60.0)
    tmp = TempDir("overhead")
    with tmp:
        jobs = [_Watched(kind, tmp) for kind in KINDS]
        up = wait_until(lambda: all(len(worker_ready(j.ready)) >= NPROC for j in jobs), 120, 0.05)
        ready_at = time.time()
        for job in jobs:
            _sample_until(jobs, max(job.job.t0 + start_at, ready_at + 1.0))
            job.cpu["t1"], job.cpu["at1"] = job.cpu_now(), time.time()
        for job in jobs:
            _sample_until(jobs, job.cpu["at1"] + window)
            job.cpu["t2"], job.cpu["at2"] = job.cpu_now(), time.time()
        out = {job.kind: _summary(job, up) for job in jobs}
        for job in jobs:
            os.kill(job.job.pid, signal.SIGTERM)
        for job in jobs:
            job.job.wait(10.0)
        cleanup()
    return out


def _sample_until(jobs: List[_Watched], until: float) -> None:
    while time.time() < until:
        for job in jobs:
            job.sample_rss()
        time.sleep(min(0.5, max(0.0, until - time.time())))


def _summary(job: _Watched, up: bool) -> dict:
    span = job.cpu["at2"] - job.cpu["at1"]
    used = job.cpu["t2"] - job.cpu["t1"]
    return {"cpu_percent": 100.0 * used / span, "cpu_seconds": used, "window_s": span,
            "peak_rss_mb": job.peak_rss() / 2 ** 20, "ranks_up": up,
            "children": len(job.proc.children(recursive=True))}


def run(settings: Settings) -> Result:
    """CPU share and peak RSS of our launcher vs torchrun's agent."""
    runs: Dict[str, List[dict]] = {kind: [] for kind in KINDS}
    for number in range(settings.overhead_runs):
        result = one_run(settings)
        for kind in KINDS:
            runs[kind].append(result[kind])
        progress(f"overhead run {number + 1}: " + "; ".join(
            f"{k} cpu={result[k]['cpu_percent']:.3f}% rss={result[k]['peak_rss_mb']:.1f}MB" for k in KINDS))
    med = {k: {m: median([r[m] for r in runs[k]]) for m in ("cpu_percent", "peak_rss_mb")} for k in KINDS}
    window = runs["ours"][0]["window_s"]
    rows = [_row("CPU of the supervising process, steady state", "% of one core", med, "cpu_percent", 0.5,
                 "< 0.5 % of one core", len(runs["ours"]), window),
            _row("peak RSS of the supervising process", "MB", med, "peak_rss_mb", 40.0, "< 40 MB",
                 len(runs["ours"]), window)]
    details = [f"- {NPROC} sleeping ranks; CPU over a {window:.0f} s window starting 5 s after the invocation; "
               f"{settings.overhead_runs} run(s), ours and torchrun side by side in each (both idle).",
               "- CPU seconds in the window: " + "; ".join(
                   f"{k} {fmt(median([r['cpu_seconds'] for r in runs[k]]), 3)} s" for k in KINDS) + "."]
    return Result(rows, runs, details)


def _row(metric: str, unit: str, med: dict, key: str, limit: float, target: str, count: int,
         window: float) -> Row:
    ours, anchor = med["ours"][key], med["torchrun"][key]
    if ours and anchor:
        ratio = f"{anchor / ours:.1f}x less than torchrun's agent"
    elif ours == 0 and key == "cpu_percent":
        # psutil's CPU times tick every 10 ms: zero ticks means below one tick over the window.
        ratio = f"ours used no 10 ms CPU tick in {window:.0f} s (< {1.0 / window:.3f} %)"
    else:
        ratio = "-"
    return Row(NAME, f"{NPROC} idle ranks: {metric}", unit, ours, {"torchrun agent": anchor}, ratio, target,
               ours is not None and ours < limit, count)
