"""Benchmark: ``launcher status`` on a 64-rank job (issue #15: answer in under 100 ms).

A synthetic run dir as a live 64-rank job leaves it: ``launcher.json``, ``state.json`` with 64 ranks
whose pids are real (sleeping) processes, the run dir's lock held (the job is "running"), and an
``events.jsonl`` of three failed attempts and a fourth running one, with 20 ``heartbeat`` events per
rank (about 2,000 lines, what a heartbeat source could add). Measured: ``launcher status --json`` and
``launcher status`` (the text view) end to end (``time.perf_counter`` around the subprocess:
interpreter start, imports, reads, output), a bare ``python -c pass`` right after them (the
interpreter's share, which no command can avoid), and ``job_status`` alone in this process (the reads
and the goodput sweep).

A second measurement (issue #31 item 3): ``launcher report`` on the events of a 16,384-rank job with 10
restarts (every rank spawned, printing and exiting in each of 11 attempts, about 540,000 events; per
attempt one failed rank and two that printed late): the time to write the timeline end to end, the
file's size and its number of lanes (ranks with the same history share one).
"""

import fcntl
import json
import os
import resource
import subprocess
import time

from bench.common import PYTHON, REPO, Result, Row, Settings, TempDir, alternate, column, fmt, job_env, median, ms

NAME = "status"
RANKS = 64
ATTEMPTS = 4
TARGET_MS = 100.0
REPORT_RANKS, REPORT_RESTARTS = 16384, 10


def synthetic_run_dir(path: str, pids: list) -> None:
    """Write the run dir of a live ``RANKS``-rank job in its last attempt."""
    os.makedirs(path, mode=0o700)
    open(os.path.join(path, "lock"), "w").close()
    with open(os.path.join(path, "launcher.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "started": time.time() - 3600}, fh)
    with open(os.path.join(path, "state.json"), "w") as fh:
        json.dump({"attempt": ATTEMPTS - 1, "ranks": [{"rank": r, "pid": pid, "pgid": pid, "create_time": None}
                                                      for r, pid in enumerate(pids)]}, fh)
    t = time.time() - 3600
    lines = [{"event": "start", "max_restarts": 5}]
    for attempt in range(ATTEMPTS):
        lines.append({"event": "attempt_start", "attempt": attempt, "ranks": list(range(RANKS))})
        lines += [{"event": "rank_spawned", "attempt": attempt, "rank": r, "pid": pids[r]} for r in range(RANKS)]
        lines.append({"event": "restore_plan", "attempt": attempt, "kind": "periodic", "step": 100 * attempt})
        lines += [{"event": "heartbeat", "rank": r, "step": 100 * attempt + k} for k in range(5) for r in range(RANKS)]
        if attempt < ATTEMPTS - 1:
            lines.append({"event": "rank_exited", "attempt": attempt, "rank": 3, "state": "failed", "exit_code": 1})
            lines += [{"event": "rank_exited", "attempt": attempt, "rank": r, "state": "stopped"}
                      for r in range(RANKS) if r != 3]
            lines += [{"event": "attempt_end", "attempt": attempt, "failed": True},
                      {"event": "restart", "attempt": attempt + 1, "scope": "group", "restarts_left": 4 - attempt}]
    with open(os.path.join(path, "events.jsonl"), "w") as fh:
        for i, line in enumerate(lines):
            fh.write(json.dumps({"ts": t + i * 0.5, "run_id": "bench", "launcher_pid": os.getpid(), **line}) + "\n")


def one_run() -> dict:
    """Both measurements on one fresh synthetic run dir."""
    from launcher.monitoring.status import job_status

    tmp = TempDir("status")
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(RANKS)]
    try:
        with tmp:
            run_dir = tmp.sub("run")
            synthetic_run_dir(run_dir, [p.pid for p in sleepers])
            lock = os.open(os.path.join(run_dir, "lock"), os.O_RDONLY)
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                started = time.perf_counter()
                done = subprocess.run([PYTHON, "-m", "launcher", "status", "--run-dir", run_dir, "--json"],
                                      env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
                cli_s = time.perf_counter() - started
                started = time.perf_counter()
                text = subprocess.run([PYTHON, "-m", "launcher", "status", "--run-dir", run_dir],
                                      env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
                text_s = time.perf_counter() - started
                started = time.perf_counter()
                subprocess.run([PYTHON, "-c", "pass"], env=job_env(), cwd=REPO, timeout=60)
                bare_s = time.perf_counter() - started
                started = time.perf_counter()
                doc = job_status(run_dir)
                inproc_s = time.perf_counter() - started
            finally:
                os.close(lock)
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
    shown = json.loads(done.stdout) if done.returncode == 0 else {}
    ok = len(shown.get("ranks", ())) == RANKS and shown.get("status") == "running" and len(doc["ranks"]) == RANKS
    text_ok = text.returncode == 0 and text.stdout.count("\n") > RANKS
    return {"cli_s": cli_s if ok else None, "text_s": text_s if text_ok else None, "bare_python_s": bare_s,
            "own_s": cli_s - bare_s if ok else None, "inproc_s": inproc_s, "ok": ok and text_ok,
            "exit": done.returncode}


def scale_events(path: str, ranks: int = REPORT_RANKS, restarts: int = REPORT_RESTARTS) -> int:
    """Write the events.jsonl of a ``ranks``-rank job with ``restarts`` failures; returns the line count.
    Attempt ``a``: spawned over 0.2 s, output at +20 s (ranks ``a+100`` and ``a+200``: at +60 s), rank
    ``1000a+3`` fails at +200 s and the rest stop; the last attempt succeeds at +300 s."""
    t, count = time.time() - 4000, 0
    with open(os.path.join(path, "events.jsonl"), "w") as fh:
        def put(ts, **line):
            nonlocal count
            fh.write(json.dumps({"ts": round(ts, 3), "run_id": "bench", **line}) + "\n")
            count += 1
        put(t, event="start", argv=["python", "train.py"], server="node0", world_size=ranks)
        for attempt in range(restarts + 1):
            t0, late, failing = t + 1 + 310 * attempt, {attempt + 100, attempt + 200}, 1000 * attempt + 3
            last = attempt == restarts
            put(t0, event="attempt_start", attempt=attempt, ranks=list(range(ranks)))
            for r in range(ranks):
                put(t0 + 0.2 * r / ranks, event="rank_spawned", attempt=attempt, rank=r, pid=1000 + r)
            for r in range(ranks):
                at = t0 + (60 if r in late else 20)
                put(at, event="rank_output", attempt=attempt, rank=r, at=at)
            if not last:
                put(t0 + 200, event="rank_exited", attempt=attempt, rank=failing, state="failed", exit_code=1,
                    exited_at=t0 + 200)
            for r in range(ranks):
                if r != failing or last:
                    state, code = ("succeeded", 0) if last else ("stopped", 143)
                    put(t0 + (300 if last else 201), event="rank_exited", attempt=attempt, rank=r, state=state,
                        exit_code=code, exited_at=t0 + (300 if last else 201))
            put(t0 + (300 if last else 202), event="attempt_end", attempt=attempt, failed=not last)
            if not last:
                put(t0 + 203, event="restart", attempt=attempt + 1, scope="group")
        put(t + 1 + 310 * restarts + 301, event="job_end", reason="succeeded")
    return count


def report_run(run_dir: str) -> dict:
    """``launcher report`` on the scale run dir: time end to end, the page's size and lanes."""
    out = os.path.join(os.path.dirname(run_dir), "timeline.html")
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([PYTHON, "-m", "launcher", "report", run_dir, "-o", out], env=job_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    ok = done.returncode == 0 and os.path.exists(out)
    size = os.path.getsize(out) if ok else None
    lanes = open(out, encoding="utf-8").read().count('data-kind="lane"') if ok else None
    return {"report_s": seconds if ok else None, "report_cpu_s": cpu if ok else None, "bytes": size, "lanes": lanes,
            "ok": ok}


def run(settings: Settings) -> Result:
    """``launcher status --json`` on a 64-rank run dir, end to end and in process."""
    runs = alternate({"ours": one_run}, settings, "status")["ours"]
    cli, inproc = ms(median(column(runs, "cli_s"))), ms(median(column(runs, "inproc_s")))
    text = ms(median(column(runs, "text_s")))
    bare, own = ms(median(column(runs, "bare_python_s"))), ms(median(column(runs, "own_s")))
    rows = [Row(NAME, f"`launcher status --json`, {RANKS} ranks, end to end", "ms", cli, {"python -c pass": bare},
                "-", "< 100 ms", cli is not None and cli < TARGET_MS, len(runs)),
            Row(NAME, f"`launcher status` (text view), {RANKS} ranks, end to end", "ms", text, {"python -c pass": bare},
                "-", "< 100 ms", text is not None and text < TARGET_MS, len(runs)),
            Row(NAME, "`launcher status --json` minus a bare interpreter start (same run)", "ms", own, {}, "-",
                "< 100 ms", own is not None and own < TARGET_MS, len(runs)),
            Row(NAME, f"`job_status` in process, {RANKS} ranks", "ms", inproc, {}, "-", "-", None, len(runs))]
    values = ", ".join(fmt(ms(v), 1) for v in column(runs, "cli_s"))
    notes = [f"- {RANKS} live ranks (sleeping processes), {ATTEMPTS} attempts, heartbeat events; end to end "
             f"per run (ms): {values}."]
    with TempDir("report") as tmp:
        run_dir = os.path.join(tmp, "run")
        os.makedirs(run_dir)
        lines = scale_events(run_dir, 2048 if settings.quick else REPORT_RANKS)
        reports = alternate({"report": lambda: report_run(run_dir)},
                            Settings(runs=1 if settings.quick else min(settings.runs, 3), warmup=0))["report"]
    seconds, size = median(column(reports, "report_s")), median(column(reports, "bytes"))
    ranks = 2048 if settings.quick else REPORT_RANKS
    rows += [Row(NAME, f"`launcher report`, {ranks:,} ranks, {REPORT_RESTARTS} restarts ({lines:,} events), "
                       "end to end", "s", seconds, {}, "-", "-", None, len(reports)),
             Row(NAME, "the same, CPU time of the command (user + sys: what a busy machine does not inflate)", "s",
                 median(column(reports, "report_cpu_s")), {}, "-", "-", None, len(reports)),
             Row(NAME, f"its timeline.html ({reports[0]['lanes']} lanes)", "KiB",
                 None if size is None else size / 1024, {}, "-", "-", None, len(reports))]
    notes.append(f"- report: {lines:,} events; per run (s): "
                 f"{', '.join(fmt(v, 2) for v in column(reports, 'report_s'))}.")
    return Result(rows, {"ours": runs, "report": reports}, notes)
