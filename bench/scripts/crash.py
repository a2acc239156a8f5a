"""Rank for the failure-detection and restart benchmarks.

Every rank appends ``<time.time()> <rank> <attempt> worker`` to ``$BENCH_READY`` first. On attempt 0
the rank ``$BENCH_CRASH_RANK`` waits (no barrier: it polls the ready file) until the ready file holds
``$BENCH_NPROC`` attempt-0 lines (and, when set, until the file ``$BENCH_CRASH_WHEN`` exists),
appends ``<time.time()> <rank>`` to ``$BENCH_CRASH`` and calls ``os._exit(1)``; the other ranks sleep
and exit at once on SIGTERM (appending ``<time.time()> <rank>`` to ``$BENCH_TERM`` first, when set).
On later attempts every rank exits 0 right away.
"""
import os
import signal
import time

T = time.time()
_env = os.environ
RANK = _env.get("RANK", "-1")
ATTEMPT = _env.get("TORCHELASTIC_RESTART_COUNT", "0")


def _append(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (text + "\n").encode())
    os.close(fd)


def _ready_count(path):
    with open(path) as fh:
        return sum(1 for line in fh if line.split()[2] == "0")


_append(_env["BENCH_READY"], "%r %s %s worker" % (T, RANK, ATTEMPT))
def _on_term(*_):
    if _env.get("BENCH_TERM"):
        _append(_env["BENCH_TERM"], "%r %s" % (time.time(), RANK))
    os._exit(0)


signal.signal(signal.SIGTERM, _on_term)
if ATTEMPT == "0":
    if RANK == _env["BENCH_CRASH_RANK"]:
        nproc = int(_env["BENCH_NPROC"])
        deadline = time.time() + 60
        while _ready_count(_env["BENCH_READY"]) < nproc and time.time() < deadline:
            time.sleep(0.001)
        while _env.get("BENCH_CRASH_WHEN") and not os.path.exists(_env["BENCH_CRASH_WHEN"]):
            time.sleep(0.001)  # --preload: the bench says when the standbys are ready
        time.sleep(float(_env.get("BENCH_CRASH_DELAY", "0.02")))  # peers reach their sleep (unmeasured)
        _append(_env["BENCH_CRASH"], "%r %s" % (time.time(), RANK))
        os._exit(1)
    time.sleep(120)
