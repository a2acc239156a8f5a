"""Idle rank for the dying-gasp and overhead benchmarks.

Appends ``<time.time()> <rank> <attempt> worker`` to ``$BENCH_READY``, then sleeps. When
``$BENCH_TERM`` is set, a SIGTERM handler appends ``term <time.time()> <rank>`` the moment the
signal arrives and ``exit <time.time()> <rank>`` right before ``os._exit(0)``.
"""
import os
import signal
import time

T = time.time()
_env = os.environ
RANK = _env.get("RANK", "-1")


def _append(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (text + "\n").encode())
    os.close(fd)


def _on_term(_signum, _frame):
    received = time.time()
    _append(_env["BENCH_TERM"], "term %r %s" % (received, RANK))
    _append(_env["BENCH_TERM"], "exit %r %s" % (time.time(), RANK))
    os._exit(0)


_append(_env["BENCH_READY"], "%r %s %s worker" % (T, RANK, _env.get("TORCHELASTIC_RESTART_COUNT", "0")))
if _env.get("BENCH_TERM"):
    signal.signal(signal.SIGTERM, _on_term)
deadline = time.time() + float(_env.get("BENCH_SLEEP", "600"))
while time.time() < deadline:
    time.sleep(min(60.0, max(0.0, deadline - time.time())))
