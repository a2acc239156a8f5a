"""Trivial rank: record when user code starts running, then exit 0.

Appends ``<time.time()> <rank> <attempt> <role>`` to ``$BENCH_READY`` as its first statement after
the imports, with one O_APPEND write so lines from concurrent ranks never mix. ``role`` is msrun's
``MS_ROLE`` (its scheduler runs this script too and is not a rank) or ``worker``.
"""
import os
import time

T = time.time()
_env = os.environ
_line = "%r %s %s %s\n" % (T, _env.get("RANK") or _env.get("MS_NODE_ID") or "-1",
                          _env.get("TORCHELASTIC_RESTART_COUNT", "0"), _env.get("MS_ROLE", "worker"))
_fd = os.open(_env["BENCH_READY"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(_fd, _line.encode())
os.close(_fd)
