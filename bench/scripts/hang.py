"""Rank for the hang benchmark: beats every 10 ms; rank ``$BENCH_HANG_RANK`` stops after 50 beats.

That rank appends ``<time.time()> <rank>`` of its last beat to ``$BENCH_HANG`` and sleeps; the others
go on beating until they are stopped.
"""
import os
import time

import launcher_heartbeat

RANK = int(os.environ.get("RANK", "-1"))
HANG_RANK = int(os.environ["BENCH_HANG_RANK"])

step = 0
while True:
    launcher_heartbeat.heartbeat(step=step)
    if RANK == HANG_RANK and step == 50:
        fd = os.open(os.environ["BENCH_HANG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, ("%r %d\n" % (time.time(), RANK)).encode())
        os.close(fd)
        while True:
            time.sleep(3600)
    step += 1
    time.sleep(0.01)
