"""Rank that prints numbered lines as fast as it can, for the log-throughput benchmark.

Waits until ``$BENCH_READY`` holds ``$BENCH_NPROC`` lines (a file barrier, so all ranks write at
the same time), then writes ``<rank> <seq>`` lines (seq from 0, contiguous) to stdout with Python's
default buffering for ``$BENCH_SECONDS`` seconds. At the end it appends
``<rank> <lines> <start> <end>`` to ``$BENCH_STATS`` (not to stdout, so the output stays pure).
"""
import os
import sys
import time

_env = os.environ
RANK = _env.get("RANK", "-1")


def _append(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (text + "\n").encode())
    os.close(fd)


def _barrier(path, nproc):
    deadline = time.time() + 60
    while time.time() < deadline:
        with open(path) as fh:
            if sum(1 for _ in fh) >= nproc:
                return
        time.sleep(0.001)


def main():
    """Barrier, then print numbered lines for ``$BENCH_SECONDS`` and report the count."""
    _append(_env["BENCH_READY"], "%r %s 0 worker" % (time.time(), RANK))
    _barrier(_env["BENCH_READY"], int(_env["BENCH_NPROC"]))
    write, prefix, seq = sys.stdout.write, RANK + " ", 0
    start = time.time()
    end = start + float(_env["BENCH_SECONDS"])
    while True:
        for _ in range(512):
            write("%s%d\n" % (prefix, seq))
            seq += 1
        if time.time() >= end:
            break
    sys.stdout.flush()
    _append(_env["BENCH_STATS"], "%s %d %r %r" % (RANK, seq, start, time.time()))


main()
