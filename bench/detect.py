"""Benchmark 2: failure detection, from a rank's crash to the launcher reaping it.

A rank (``scripts/crash.py``) writes ``time.time()`` immediately before ``os._exit(1)``; the
launcher's ``rank_exited`` event carries ``exited_at``, the wall-clock time at which it reaped the
rank. The difference is the detection latency (the launcher waits on SIGCHLD through its signal
wakeup pipe; nothing polls). Also reported: crash -> ``stop_group`` (the peers are being stopped).

torchrun is not measured here: it polls its workers every ``--monitor-interval`` (0.1 s by default),
and its log lines carry no sub-second time stamp of the detection; see the restart benchmark.
"""

from typing import List

from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, alternate, column, first_event,
                          fmt, job_env, launcher_argv, median, ms, read_events, read_lines, script,
                          wait_until)

NAME = "detect"
NPROC = 2
TARGET_MS = 5.0


def one_run() -> dict:
    """Two ranks; rank 1 crashes once both run; returns crash -> reap and crash -> stop_group."""
    tmp = TempDir("detect")
    with tmp:
        crash, ready = tmp.sub("crash"), tmp.sub("ready")
        env = job_env(ready=ready, crash=crash, crash_rank=NPROC - 1, nproc=NPROC)
        argv = launcher_argv(NPROC, tmp.sub("run"), tmp.sub("logs"), [PYTHON, script("crash.py")])
        job = Job(argv, env)
        wait_until(lambda: job.proc.poll() is not None, 60, 0.01)
        code = job.finish(grace=5.0)
        crashes = read_lines(crash)
        events = read_events(tmp.sub("run"))
    if not crashes:
        return {"error": f"no crash recorded (exit {code})", "exit": code}
    crashed_at, rank = float(crashes[0][0]), int(crashes[0][1])
    exited = first_event(events, "rank_exited", attempt=0, rank=rank)
    stop = first_event(events, "stop_group", attempt=0)
    return {"detect_s": exited["exited_at"] - crashed_at if exited else None,
            "stop_group_s": stop["ts"] - crashed_at if stop else None, "exit": code}


def run(settings: Settings) -> Result:
    """Crash -> ``rank_exited.exited_at`` over the measured runs."""
    runs = alternate({"ours": one_run}, settings, "detect")["ours"]
    detect = ms(median(column(runs, "detect_s")))
    stop = ms(median(column(runs, "stop_group_s")))
    rows = [Row(NAME, "rank os._exit(1) -> launcher reaped it (`rank_exited.exited_at`)", "ms", detect,
                {}, "-", "< 5 ms", detect is not None and detect < TARGET_MS, len(runs)),
            Row(NAME, "rank os._exit(1) -> `stop_group` (peers being stopped)", "ms", stop, {}, "-", "-",
                None, len(runs))]
    return Result(rows, {"ours": runs}, _details(runs))


def _details(runs: List[dict]) -> List[str]:
    values = ", ".join(fmt(ms(v), 2) for v in column(runs, "detect_s"))
    return [f"- {NPROC} ranks, rank {NPROC - 1} crashes once both run. Per run (ms): {values}.",
            "- torchrun for context: it polls its workers every `--monitor-interval` (default 0.1 s), "
            "so its detection takes up to 100 ms (about 50 ms on average) plus the poll's own work; "
            "its logs carry no precise detection time stamp, so it is not measured here."]
