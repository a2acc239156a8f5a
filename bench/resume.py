"""Benchmark 10: the PyTorch example, from a SIGKILLed rank to every rank resumed at the checkpoint step.

Four gloo ranks of ``examples/pytorch/train.py`` (periodic checkpoints every 20 steps, 50 ms per
step); once every rank passed step ``STEP`` (and, with ``--preload torch``, every rank's warm
standby answered ready) the bench SIGKILLs rank 1 and notes ``time.time()``. Measured: that moment
-> the last rank of the restart printing ``resumed from ... at step N`` (the bench polls the logs
every 5 ms). Variants: the launcher cold, with ``--preload torch`` and with ``--preload
torch,torch._dynamo`` (docs/warm-standby.md), torchrun ``--max-restarts 3`` with the script's own
``--resume-latest``.
Under the launcher the survivors save a breakpoint on the SIGTERM that stops them; under torchrun
too, but the script resumes from the newest step every rank holds (the last periodic one).
"""

import glob
import os
import re
import signal
import time
from typing import Dict, List

import psutil

from bench.common import (PYTHON, REPO, Job, Result, Row, Settings, TempDir, alternate, column, fmt,
                          job_env, launcher_argv, median, read_events, speedup, torchrun_argv, wait_until)

NAME = "resume"
NPROC, VICTIM, STEP = 4, 1, 40
TARGET_S = 1.0
#: The launcher's variants: cold, the default, and --preload with torch._dynamo named (torch imports it
#: lazily on the optimizer's first call, ~2 s here: in the resume's path unless preloaded).
PRELOADS = {"ours": "none", "auto": "auto", "preload-dynamo": "torch,torch._dynamo"}
WARM = ("auto", "preload-dynamo")
KINDS = (*PRELOADS, "torchrun")
EXAMPLE = os.path.join(REPO, "examples", "pytorch", "train.py")
STEP_LINE = re.compile(rb"^step (\d+)/", re.M)
RESUMED = re.compile(rb"resumed from \S+ at step (\d+)")


def _train_args(ckpt: str, steps: int) -> List[str]:
    return [EXAMPLE, "--ckpt-dir", ckpt, "--steps", str(steps), "--ckpt-every", "20", "--log-every", "1",
            "--step-time", "0.05"]


def _argv(kind: str, tmp: TempDir, steps: int) -> List[str]:
    if kind == "torchrun":
        return torchrun_argv(NPROC, [*_train_args(tmp.sub("ckpt"), steps), "--resume-latest"], ["--max-restarts", "3"])
    options = ["--max-restarts", "1", "--checkpoint-dir", tmp.sub("ckpt"), "--dp", str(NPROC), "--console-ranks",
               "none", *(["--preload", PRELOADS[kind]] if kind != "auto" else [])]
    return launcher_argv(NPROC, tmp.sub("run"), tmp.sub("logs"), [PYTHON, *_train_args(tmp.sub("ckpt"), steps)],
                         options)


class _Logs:
    """Each rank's output of one attempt: the launcher's rank logs, or torchrun's combined stdout."""

    def __init__(self, kind: str, tmp: TempDir):
        self.kind, self.tmp = kind, tmp

    def texts(self, attempt: int) -> List[bytes]:
        if self.kind == "torchrun":
            data = _read(self.tmp.sub("torchrun.out"))
            marker = b"resumed from"
            return [data] if attempt == 0 else [data[data.find(marker):]] if marker in data else []
        paths = glob.glob(os.path.join(self.tmp.sub("logs"), "*", f"attempt_{attempt}", "rank_*.log"))
        return [_read(path) for path in paths]

    def steps(self) -> int:
        """The lowest step every rank of attempt 0 logged (torchrun: the lowest of the last lines)."""
        texts = self.texts(0)
        if self.kind == "torchrun":
            found = [int(s) for s in STEP_LINE.findall(texts[0])]
            return sorted(found)[-NPROC] if len(found) >= NPROC else -1
        if len(texts) < NPROC:
            return -1
        return min(max((int(s) for s in STEP_LINE.findall(text)), default=-1) for text in texts)

    def resumed(self) -> int:
        """How many ranks of the restart printed their ``resumed from`` line."""
        return sum(len(RESUMED.findall(text)) for text in self.texts(1))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _victim(kind: str, job: Job, tmp: TempDir) -> int:
    if kind != "torchrun":
        return next(e["pid"] for e in read_events(tmp.sub("run"))
                    if e.get("event") == "rank_spawned" and e.get("rank") == VICTIM and e.get("attempt") == 0)
    for child in psutil.Process(job.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(VICTIM):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError("torchrun's rank not found")


def one_run(kind: str) -> dict:
    """One job: kill rank 1 past step STEP; seconds until every rank of the restart resumed."""
    tmp = TempDir(f"resume-{kind}")
    with tmp:
        out = open(tmp.sub("torchrun.out"), "wb")
        job = Job(_argv(kind, tmp, 2000), job_env(), stdout=out, stderr=out)
        logs = _Logs(kind, tmp)
        standbys = lambda: len({e["rank"] for e in read_events(tmp.sub("run")) if e.get("event") == "standby_ready"
                                and "torch._dynamo" in e.get("modules", ())})
        ready = lambda: logs.steps() >= STEP and (kind not in WARM or standbys() >= NPROC)
        if not wait_until(lambda: ready() or job.proc.poll() is not None, 180, 0.01) or not ready():
            job.finish(0)
            return {"error": f"never reached step {STEP} (exit {job.proc.poll()})"}
        victim = _victim(kind, job, tmp)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        back = wait_until(lambda: logs.resumed() >= NPROC or job.proc.poll() is not None, 120, 0.005)
        resumed_at = time.time()
        step = RESUMED.findall(b"".join(logs.texts(1)))
        events = read_events(tmp.sub("run")) if kind != "torchrun" else []
        count = logs.resumed()
        job.finish(0)
        out.close()
        if not back or count < NPROC:
            tail = _read(tmp.sub("torchrun.out"))[-600:].decode(errors="replace")
            return {"error": f"{count} of {NPROC} ranks resumed (exit {job.proc.poll()}): {tail}"}
    metrics: Dict[str, object] = {"resume_s": resumed_at - killed_at, "resumed_step": int(step[0])}
    if kind in WARM:
        metrics["from_standbys"] = sum(len(e["ranks"]) for e in events if e.get("event") == "standby_start")
        metrics["standby_rss_mib"] = median([e["rss_bytes"] / (1 << 20) for e in events
                                             if e.get("event") == "standby_ready"])
    return metrics


def run(settings: Settings) -> Result:
    """The variants alternately."""
    runs = alternate({kind: (lambda k=kind: one_run(k)) for kind in KINDS}, settings, "resume")
    anchor = median(column(runs["torchrun"], "resume_s"))
    cold = median(column(runs["ours"], "resume_s"))
    rows, details = [], []
    for kind, modules in PRELOADS.items():
        value = median(column(runs[kind], "resume_s"))
        up = speedup(value, anchor)
        warm_up = speedup(value, cold) if kind in WARM else None
        ratio = f"{fmt(up)}x faster than torchrun" if up else (
            f"{fmt(warm_up)}x faster than cold (torchrun never resumed)" if warm_up else "-")
        rows.append(Row(NAME, f"PyTorch example, {NPROC} ranks: SIGKILL -> every rank resumed (--preload {modules}"
                              f"{', the default' if kind == 'auto' else ''})", "s", value,
                        {"torchrun": anchor, **({"cold": cold} if kind in WARM else {})}, ratio,
                        f"< {fmt(TARGET_S, 0)} s" if kind in WARM else "-",
                        (value is not None and value < TARGET_S) if kind in WARM else None, len(runs[kind])))
        step = fmt(median(column(runs[kind], "resumed_step")), 0)
        extra = (f"; ranks of the restart from standbys {fmt(median(column(runs[kind], 'from_standbys')), 0)} of "
                 f"{NPROC}, standby RSS {fmt(median(column(runs[kind], 'standby_rss_mib')), 0)} MiB each"
                 if kind in WARM else "")
        details.append(f"- {kind} (medians): resumed at step {step}{extra}")
    resumed = len(column(runs["torchrun"], "resume_s"))
    details.append(f"- torchrun (`--max-restarts 3`, the script's `--resume-latest`): resumed in {resumed} of "
                   f"{len(runs['torchrun'])} runs, at step {fmt(median(column(runs['torchrun'], 'resumed_step')), 0)} "
                   f"(the newest step every rank holds); in the others its restarted gloo ranks failed to connect "
                   f"(connectFullMesh) and it restarted again (docs/warm-standby.md)")
    return Result(rows, runs, details)
