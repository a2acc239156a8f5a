"""Benchmark: ``launcher status`` on a 64-rank job (issue #15: answer in under 100 ms).

A synthetic run dir as a live 64-rank job leaves it: ``launcher.json``, ``state.json`` with 64 ranks
whose pids are real (sleeping) processes, the run dir's lock held (the job is "running"), and an
``events.jsonl`` of three failed attempts and a fourth running one, with 20 ``heartbeat`` events per
rank (about 2,000 lines, what a heartbeat source could add). Measured: ``launcher status --json`` and
``launcher status`` (the text view) end to end (``time.perf_counter`` around the subprocess:
interpreter start, imports, reads, output), a bare ``python -c pass`` right after them (the
interpreter's share, which no command can avoid), and ``job_status`` alone in this process (the reads
and the goodput sweep).
"""

import fcntl
import json
import os
import subprocess
import time

from bench.common import PYTHON, REPO, Result, Row, Settings, TempDir, alternate, column, fmt, job_env, median, ms

NAME = "status"
RANKS = 64
ATTEMPTS = 4
TARGET_MS = 100.0


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
    return Result(rows, {"ours": runs}, [f"- {RANKS} live ranks (sleeping processes), {ATTEMPTS} attempts, "
                                         f"heartbeat events; end to end per run (ms): {values}."])
