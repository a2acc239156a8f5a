"""Benchmark: the hang detector (``--heartbeat-timeout``), issue 12.

* Detection latency: 8 ranks beat every 10 ms (``scripts/hang.py``); rank 7 stops after its 50th
  beat and records ``time.time()`` of that last beat. Latency = ``hang_detected.ts`` - (last beat +
  the 1 s timeout). The detector looks at the slots every ``TICK`` (0.2 s).
* Stack dump of 8 ranks: ``stacks_dumped.seconds`` of the same runs (py-spy for every rank at once).
* One ``launcher_heartbeat.heartbeat(step=...)`` call, in this process, into a real mmap'd slot.
"""

import os
import sys
import timeit
from typing import List

from bench.common import (PYTHON, REPO, Job, Result, Row, Settings, TempDir, alternate, column, first_event,
                          fmt, job_env, launcher_argv, median, ms, read_events, read_lines, script, wait_until)

NAME = "hang"
NPROC = 8
TIMEOUT = 1.0
TARGETS = {"detect_s": 1.0, "dump_s": 2.0, "beat_us": 5.0}


def one_run() -> dict:
    """8 ranks, rank 7 hangs: its last beat -> hang_detected, and the stack dump's duration."""
    tmp = TempDir("hang")
    with tmp:
        hang = tmp.sub("hang")
        env = job_env(hang=hang, hang_rank=NPROC - 1)
        argv = launcher_argv(NPROC, tmp.sub("run"), tmp.sub("logs"), [PYTHON, script("hang.py")],
                             ["--heartbeat-timeout", str(TIMEOUT), "--console-ranks", "none"])
        job = Job(argv, env)
        wait_until(lambda: job.proc.poll() is not None, 60, 0.01)
        code = job.finish(grace=5.0)
        last = read_lines(hang)
        events = read_events(tmp.sub("run"))
    detected = first_event(events, "hang_detected")
    dumped = first_event(events, "stacks_dumped")
    if not last or detected is None:
        return {"error": f"no hang recorded (exit {code})", "exit": code}
    return {"detect_s": detected["ts"] - (float(last[0][0]) + TIMEOUT),
            "dump_s": dumped["seconds"] if dumped else None,
            "sources": sorted(set(dumped["sources"].values())) if dumped else [], "exit": code}


def beat_cost(number: int = 1_000_000) -> float:
    """Seconds per ``heartbeat(step=...)`` call, best of 5 rounds of ``number`` calls."""
    tmp = TempDir("beat")
    with tmp:
        os.environ["LAUNCHER_HEARTBEAT_FILE"] = tmp.sub("slot")
        sys.path.append(os.path.join(REPO, "launcher", "rankhooks"))
        try:
            import launcher_heartbeat

            best = min(timeit.repeat(lambda: launcher_heartbeat.heartbeat(step=7), number=number, repeat=5))
        finally:
            sys.path.pop()
            os.environ.pop("LAUNCHER_HEARTBEAT_FILE")
            sys.modules.pop("launcher_heartbeat", None)
    return best / number


def run(settings: Settings) -> Result:
    """Detection latency and dump time over the measured runs, then the heartbeat call's cost."""
    runs = alternate({"ours": one_run}, settings, NAME)["ours"]
    detect, dump = ms(median(column(runs, "detect_s"))), ms(median(column(runs, "dump_s")))
    beat = beat_cost(100_000 if settings.quick else 1_000_000) * 1e6
    rows = [Row(NAME, f"rank's last beat + {TIMEOUT:g} s timeout -> `hang_detected`", "ms", detect, {}, "-",
                "< 1000 ms", detect is not None and detect < TARGETS["detect_s"] * 1000, len(runs)),
            Row(NAME, f"stacks of {NPROC} ranks dumped (py-spy, in parallel)", "ms", dump, {}, "-", "< 2000 ms",
                dump is not None and dump < TARGETS["dump_s"] * 1000, len(runs)),
            Row(NAME, "one `launcher_heartbeat.heartbeat(step=...)` call", "us", beat, {}, "-", "< 5 us",
                beat < TARGETS["beat_us"], 1)]
    return Result(rows, {"ours": runs, "beat_us": beat}, _details(runs))


def _details(runs: List[dict]) -> List[str]:
    detect = ", ".join(fmt(ms(v), 3) for v in column(runs, "detect_s"))
    dump = ", ".join(fmt(ms(v), 3) for v in column(runs, "dump_s"))
    return [f"- {NPROC} ranks beating every 10 ms, rank {NPROC - 1} stops; detection per run (ms past the "
            f"timeout): {detect}; the detector reads the slots every 0.2 s, so up to 200 ms plus the "
            "loop's own work is expected.",
            f"- Stack dump of all {NPROC} ranks per run (ms): {dump}."]
