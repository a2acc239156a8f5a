"""Benchmark 3: restart latency, from a rank's crash to every rank of attempt 1 running user code.

``scripts/crash.py``: on attempt 0 the last rank waits (polling the ready file, no barrier) until all
N ranks run, records ``time.time()`` and calls ``os._exit(1)``; its peers exit at once on SIGTERM.
Every rank of attempt 1 (``TORCHELASTIC_RESTART_COUNT=1``) records its start and exits 0. Measured:
crash -> the last attempt-1 rank's own timestamp. Anchor: torchrun ``--max-restarts 1`` with its
default ``--monitor-interval`` (0.1 s). Our ``events.jsonl`` splits the interval into detection,
stopping the peers, respawning and the ranks' interpreter start-up. The ``preload`` variant runs
with ``--preload os`` (warm standby ranks, docs/warm-standby.md): the crashing rank also waits until
every standby answered ready (``standby_ready`` events; ``$BENCH_CRASH_WHEN``), so the restart is
made of standbys, and what it saves is the interpreter start-up of every rank.
"""

from typing import Dict, List, Optional

from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, alternate, column, first_event,
                          fmt, job_env, launcher_argv, median, ms, read_events, read_lines, script,
                          speedup, torchrun_argv, wait_until, worker_ready)

NAME = "restart"
TARGET = 2.0
PRELOAD_TARGET = 10.0
KINDS = ("ours", "preload", "torchrun")


def _argv(kind: str, nproc: int, tmp: TempDir) -> List[str]:
    if kind != "torchrun":
        return launcher_argv(nproc, tmp.sub("run"), tmp.sub("logs"), [PYTHON, script("crash.py")],
                             ["--max-restarts", "1", *(["--preload", "os"] if kind == "preload" else [])])
    return torchrun_argv(nproc, [script("crash.py")], ["--max-restarts", "1"])


def one_run(kind: str, nproc: int) -> dict:
    """One crash-and-restart job; seconds from the crash to all attempt-1 ranks running."""
    tmp = TempDir(f"restart-{kind}")
    with tmp:
        ready, crash = tmp.sub("ready"), tmp.sub("crash")
        env = job_env(ready=ready, crash=crash, crash_rank=nproc - 1, nproc=nproc)
        if kind == "preload":
            env["BENCH_CRASH_WHEN"] = tmp.sub("standbys-ready")
        job = Job(_argv(kind, nproc, tmp), env)
        if kind == "preload":
            wait_until(lambda: sum(e.get("event") == "standby_ready" for e in read_events(tmp.sub("run"))) >= nproc
                       or job.proc.poll() is not None, 120, 0.005)
            open(env["BENCH_CRASH_WHEN"], "w").close()
        wait_until(lambda: len(worker_ready(ready, "1")) >= nproc or job.proc.poll() is not None, 120, 0.005)
        code = job.finish(grace=1.0)
        crashes, again = read_lines(crash), worker_ready(ready, "1")
        events = read_events(tmp.sub("run")) if kind != "torchrun" else []
    if not crashes or len(again) < nproc:
        return {"error": f"crash recorded: {bool(crashes)}, attempt-1 ranks: {len(again)} (exit {code})"}
    crashed_at = float(crashes[0][0])
    metrics = {"restart_s": max(again) - crashed_at, "exit": code}
    if kind == "preload":
        metrics["from_standbys"] = sum(len(e["ranks"]) for e in events if e.get("event") == "standby_start")
        metrics["standby_rss_mib"] = median([e["rss_bytes"] / (1 << 20) for e in events
                                             if e.get("event") == "standby_ready"])
    metrics.update(_phases(events, crashed_at, int(crashes[0][1]), max(again)))
    return metrics


def _phases(events: List[dict], crashed_at: float, rank: int, last_rank: float) -> Dict[str, Optional[float]]:
    """Our interval split at the launcher's events (empty for torchrun)."""
    exited = first_event(events, "rank_exited", attempt=0, rank=rank)
    stop = first_event(events, "stop_group", attempt=0)
    begin = first_event(events, "attempt_start", attempt=1)
    spawned = [e["ts"] for e in events if e.get("event") == "rank_spawned" and e.get("attempt") == 1]
    peers = [e["exited_at"] for e in events if e.get("event") == "rank_exited" and e.get("attempt") == 0]
    if not (exited and stop and begin and spawned and peers):
        return {}
    return {"detect_s": exited["exited_at"] - crashed_at, "stop_peers_s": max(peers) - stop["ts"],
            "to_attempt_start_s": begin["ts"] - max(peers), "spawn_s": max(spawned) - begin["ts"],
            "rank_startup_s": last_rank - max(spawned)}


def run(settings: Settings) -> Result:
    """Restart latency for N = 4 and 8 (4 only with ``--quick``), cold and with warm standbys."""
    rows, raw, details = [], {}, []
    for nproc in ((4,) if settings.quick else (4, 8)):
        variants = {kind: (lambda k=kind, n=nproc: one_run(k, n)) for kind in KINDS}
        runs = alternate(variants, settings, f"restart N={nproc}")
        raw[f"N={nproc}"] = runs
        ours, warm, anchor = (ms(median(column(runs[k], "restart_s"))) for k in KINDS)
        for label, value, target in (("", ours, TARGET), (" (--preload)", warm, PRELOAD_TARGET)):
            up = speedup(value, anchor)
            rows.append(Row(NAME, f"N={nproc}: crash -> all attempt-1 ranks running{label}", "ms", value,
                            {"torchrun": anchor}, f"{fmt(up)}x faster than torchrun" if up else "-",
                            f">= {fmt(target, 0)}x faster than torchrun", up is not None and up >= target,
                            len(runs["ours"])))
        details.append(_breakdown(nproc, runs["ours"], "ours"))
        details.append(_breakdown(nproc, runs["preload"], "ours with --preload os"))
        details.append(f"- N={nproc}, --preload: ranks of attempt 1 from standbys (median) "
                       f"{fmt(median(column(runs['preload'], 'from_standbys')), 0)} of {nproc}; standby RSS "
                       f"{fmt(median(column(runs['preload'], 'standby_rss_mib')), 1)} MiB each")
    details.append("- torchrun ran with its default `--monitor-interval` of 0.1 s and `--standalone` "
                   "(c10d rendezvous on a free port); after a failure it stops the group, re-runs the "
                   "rendezvous and starts a new one.")
    return Result(rows, raw, details)


def _breakdown(nproc: int, runs: List[dict], name: str) -> str:
    parts = [(label, ms(median(column(runs, key)))) for label, key in (
        ("crash -> reaped", "detect_s"), ("`stop_group` -> last peer reaped", "stop_peers_s"),
        ("last peer reaped -> `attempt_start` 1", "to_attempt_start_s"),
        ("`attempt_start` -> last `rank_spawned`", "spawn_s"),
        ("last `rank_spawned` -> last rank running", "rank_startup_s"))]
    return f"- N={nproc}, {name} (medians): " + "; ".join(f"{label}: {fmt(value, 2)} ms" for label, value in parts)
