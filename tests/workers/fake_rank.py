"""A tiny rank for integration tests: does what its options say, and reports through files.

It appends ``<rank> <attempt> <pid> <time>`` to ``--ready-file`` once it runs user code, so tests wait
on that file instead of sleeping blindly. Behaviour options:
  --fail-rank R --exit-code N     rank R exits with N (on attempts listed by --fail-attempts, default 0)
  --fail-signal SIG               ... or kills itself with SIG instead
  --fail-when PATH                ... only once PATH exists (the test's trigger)
  --ignore-term                   ignore SIGTERM (to test escalation to SIGKILL)
  --term-delay S                  on SIGTERM, write a "term" record, sleep S, then exit 143
  --ckpt-dir D                    ... and during those S seconds write D/rank_<r>.ckpt atomically
  --poll-exit                     exit 0 when $LAUNCHER_GRACEFUL_EXIT_FILE holds {"GracefulExit": 1}
  --child                         spawn a grandchild (same session) that writes its pid and sleeps
  --orphan                        double-fork a short-lived grandchild (tests reaping by the launcher)
  --run S                         run S seconds (default: until signalled)
  --run-per-attempt S0,S1,...     ... S<attempt> seconds instead (the last value for later attempts)
  --env-file PATH                 append <rank> <attempt> <WORLD_SIZE> <GROUP_RANK> <GROUP_WORLD_SIZE> to PATH
  --print-lines N                 print N lines first
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def _append(path, text):
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _save(path, seconds):
    """Write a checkpoint slowly (``seconds``), atomically: temp file, fsync, rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        for _ in range(10):
            fh.write(b"x" * 100000)
            time.sleep(seconds / 10)
        fh.write(b"END")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _wait_for_peers(path, attempt, timeout=20.0):
    """Fail only once every local rank of this attempt is up (and wrote its --child line)."""
    peers = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("MS_LOCAL_WORKER", "1")))
    deadline = time.monotonic() + timeout
    while path and time.monotonic() < deadline:
        try:
            with open(path) as fh:
                up = [line.split() for line in fh]
        except OSError:
            up = []
        ready = {line[0] for line in up if len(line) > 1 and line[1] == str(attempt)}
        if len(ready) >= peers and (not os.path.exists(path + ".child") or _count(path + ".child") >= peers):
            return
        time.sleep(0.01)


def _count(path):
    with open(path) as fh:
        return sum(1 for _ in fh)


def _exit_requested():
    path = os.environ.get("LAUNCHER_GRACEFUL_EXIT_FILE")
    try:
        with open(path) as fh:
            return json.load(fh).get("GracefulExit") == 1
    except (OSError, ValueError, TypeError):
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ready-file")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempts", default="0")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--fail-signal")
    p.add_argument("--fail-when")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--term-delay", type=float)
    p.add_argument("--ckpt-dir")
    p.add_argument("--poll-exit", action="store_true")
    p.add_argument("--child", action="store_true")
    p.add_argument("--orphan", action="store_true")
    p.add_argument("--run", type=float)
    p.add_argument("--run-per-attempt")
    p.add_argument("--env-file")
    p.add_argument("--print-lines", type=int, default=0)
    a = p.parse_args()
    # The MindSpore scheduler gets RANK_ID=0 as under msrun, but it is not a rank: it reports as -1.
    scheduler = os.environ.get("MS_ROLE") == "MS_SCHED"
    rank = -1 if scheduler else int(os.environ.get("RANK", os.environ.get("RANK_ID", "-1")))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get("LAUNCHER_ATTEMPT", "0")))
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = []
    if a.term_delay is not None:
        def on_term(signum, frame):
            received = time.time()
            if a.ckpt_dir:
                _save(os.path.join(a.ckpt_dir, f"rank_{rank}.ckpt"), a.term_delay)
            else:
                time.sleep(a.term_delay)
            child_alive = all(c.poll() is None for c in children)
            _append(a.ready_file + ".term", f"{rank} {attempt} {os.getpid()} {received} {int(child_alive)}\n")
            os._exit(143)
        signal.signal(signal.SIGTERM, on_term)
    for i in range(a.print_lines):
        print(f"line {i} from rank {rank} attempt {attempt}")
    print(f"rank {rank} attempt {attempt} pid {os.getpid()} up", flush=True)
    if a.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        children.append(child)
        _append(a.ready_file + ".child" if a.ready_file else None, f"{rank} {child.pid}\n")
    if a.orphan and os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    _append(a.env_file, " ".join([str(rank), str(attempt)] + [os.environ.get(name, "-") for name in
                                                             ("WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")]) + "\n")
    allowed = os.environ.get("LAUNCHER_GASP_SAVE_ALLOWED", "-")
    _append(a.ready_file, f"{rank} {attempt} {os.getpid()} {time.time()} {allowed}\n")
    if rank == a.fail_rank and str(attempt) in a.fail_attempts.split(","):
        _wait_for_peers(a.ready_file, attempt)
        while a.fail_when and not os.path.exists(a.fail_when):
            time.sleep(0.01)
        print(f"rank {rank} failing now", flush=True)
        if a.fail_signal:
            os.kill(os.getpid(), getattr(signal, a.fail_signal))
        sys.exit(a.exit_code)
    if a.run_per_attempt:
        seconds = [float(s) for s in a.run_per_attempt.split(",")]
        a.run = seconds[min(attempt, len(seconds) - 1)]
    deadline = None if a.run is None else time.monotonic() + a.run
    while deadline is None or time.monotonic() < deadline:
        if a.poll_exit and _exit_requested():
            _append(a.ready_file + ".exit", f"{rank} {attempt} {time.time()}\n")
            sys.exit(0)
        time.sleep(0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    main()
