"""Benchmark 7, scale: the checkpoint index's own thread (``ckpt-index``) absorbing save rounds
while the event loop runs (see :mod:`bench.scale`'s docstring; split out of it for size).

Each round is written by another process (as ranks do), ``SAVERS`` ranks saving and reporting a new
periodic step and deleting (withdrawing the report first) the step of their previous round, as with
``keep_checkpoint_max``: the rank directories do not grow from round to round. Meanwhile the bench's
main thread stands in for the supervisor's event loop: it wakes every millisecond and records how
late it woke (the GIL held by the indexer thread is what can delay it, besides the machine's load;
before issue #19's thread the whole absorption ran in the loop). Measured per round:
the loop's longest delay, how long after the round's last save the index had absorbed it, and the
plan then (the indexer had the time a stop of the ranks takes). Separate rounds time the plan
called the moment the round ends (the plan waits for the step the indexer is in and reads the
rest itself).
"""

import os
import subprocess
import sys
import time
from typing import Callable, Dict, List

from bench.common import GATE, REPO, median, progress
from bench.scale import WORLD
from bench.scalefs import _slow_fs

_TICK = 0.001
ROUNDS = 3
#: The launcher's setting (``launcher/run/attempt.py``); BENCH_GC_FREEZE=0 measures without it (A/B).
FREEZE = os.environ.get("BENCH_GC_FREEZE", "1") != "0"


_ROUND = """
import os, sys
from bench.scale import SAVERS, WORLD, _save, _saves
root, step, previous = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for rank in range(0, WORLD, WORLD // SAVERS):
    _save(os.path.join(root, f"rank_{rank}", f"ckpt-1_{step}.pt"), b"y" * 64)
    old = os.path.join(root, f"rank_{rank}", f"ckpt-1_{previous}.pt")
    if os.path.exists(old):
        _saves().withdraw(old)
        os.remove(old)
"""


def _round(root: str, step: int) -> "subprocess.Popen[bytes]":
    """Start another process saving (and reporting) periodic step ``step`` on ``SAVERS`` ranks and
    deleting their step ``step - 1``."""
    env = {**os.environ, "PYTHONPATH": REPO}
    GATE.wait()  # each round starts on a machine the other jobs left mostly idle, as the timed rows do
    return subprocess.Popen([sys.executable, "-c", _ROUND, root, str(step), str(step - 1)], env=env)


def _loop_until(done: Callable[[], bool]) -> float:
    """Tick every ``_TICK`` seconds, as an idle event loop wakes, until ``done()``; the longest delay.
    Each tick allocates a container, as the loop's handlers do: a collection that the index's thread
    left due runs here, as it would in the launcher's loop."""
    worst, held = 0.0, []
    while not done():
        start = time.perf_counter()
        time.sleep(_TICK)
        held = [start]  # a tracked object; the previous one freed
        worst = max(worst, time.perf_counter() - start - _TICK)
    del held
    return worst


def _absorbed(index) -> Callable[[], bool]:
    """True once an update or poll that began after this call ended and the thread is idle."""
    steps = index.indexer.steps
    return lambda: index.indexer.steps >= steps + 2 and index.indexer.idle()


def _rounds(root: str, inputs, index, first_step: int, prefix: str) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {f"{prefix}_{key}": [] for key in ("loop_lag", "absorbed", "plan_after",
                                                                     "plan_at_once", "plan_after_cpu",
                                                                     "plan_at_once_cpu")}
    for run in range(ROUNDS):
        proc = _round(root, first_step + 2 * run)
        lag = _loop_until(lambda: proc.poll() is not None)
        ended = time.perf_counter()
        lag = max(lag, _loop_until(_absorbed(index)))
        out[f"{prefix}_absorbed"].append(time.perf_counter() - ended)
        out[f"{prefix}_loop_lag"].append(lag)
        _timed_plan(inputs, index, out, f"{prefix}_plan_after")
        proc = _round(root, first_step + 2 * run + 1)
        proc.wait()
        _timed_plan(inputs, index, out, f"{prefix}_plan_at_once")
        _loop_until(_absorbed(index))  # the next round starts from an absorbed index
    return out


def _timed_plan(inputs, index, out: Dict[str, List[float]], key: str) -> None:
    """One plan: its wall time under ``key``, the planning thread's CPU time under ``key_cpu`` (wall
    time on this shared machine is mostly other processes'; the CPU time includes none of the wait
    for the index thread's step)."""
    from launcher.restore import compute_plan

    start, cpu = time.perf_counter(), time.thread_time()
    compute_plan(inputs, index=index)
    out[f"{key}_cpu"].append(time.thread_time() - cpu)
    out[key].append(time.perf_counter() - start)


def _baseline(root: str, first_step: int) -> List[float]:
    """The event loop's longest delay during a round and the second after it without any index:
    what the machine's load (and the writer) alone cause."""
    lags = []
    for run in range(ROUNDS):
        proc = _round(root, first_step + run)
        lag = _loop_until(lambda: proc.poll() is not None)  # pylint: disable=cell-var-from-loop
        until = time.perf_counter() + 1.0
        lags.append(max(lag, _loop_until(lambda: time.perf_counter() >= until)))  # pylint: disable=cell-var-from-loop
    return lags


def background_rounds(root: str, inputs) -> Dict[str, List[float]]:
    """The rounds on the local disk (inotify) and on the simulated shared file system (polls),
    and the event loop's delays without an index."""
    from launcher.restore import CheckpointIndex, compute_plan

    out: Dict[str, List[float]] = {"bg_baseline_loop_lag": _baseline(root, 400 - ROUNDS)}
    for prefix, watch, first_step in (("bg_local", True, 400), ("bg_slow_fs", False, 400 + 2 * ROUNDS)):
        index = CheckpointIndex(root, watch=watch, background=True, gc_freeze=FREEZE)
        try:
            compute_plan(inputs, index=index)  # the launcher's first plan: a full listing
            if watch:
                out.update(_rounds(root, inputs, index, first_step, prefix))
            else:
                with _slow_fs():
                    out.update(_rounds(root, inputs, index, first_step, prefix))
        finally:
            index.close()
    progress("scale: indexer thread: event loop delayed at most "
             f"{median(out['bg_local_loop_lag']) * 1e3:.1f} / {median(out['bg_slow_fs_loop_lag']) * 1e3:.1f} ms "
             f"(local / shared FS; {median(out['bg_baseline_loop_lag']) * 1e3:.1f} ms without an index), rounds "
             f"absorbed {median(out['bg_local_absorbed']):.2f} / {median(out['bg_slow_fs_absorbed']):.2f} s after "
             f"their end, {WORLD} ranks; the plan's CPU at once / after "
             f"{median(out['bg_local_plan_at_once_cpu']) * 1e3:.0f} / {median(out['bg_local_plan_after_cpu']) * 1e3:.0f} "
             f"ms (local), {median(out['bg_slow_fs_plan_at_once_cpu']) * 1e3:.0f} / "
             f"{median(out['bg_slow_fs_plan_after_cpu']) * 1e3:.0f} ms (shared FS)")
    return out
