"""``launcher status`` against what a run dir may hold (issue #27), old code against new, side by side.

Not part of ``python -m bench``: it compares two checkouts. Usage::

    nice python bench/status_inputs.py OLD_TREE NEW_TREE     # e.g. /work/main .

Measured, for each tree (``PYTHONPATH=<tree>``, run from ``/tmp`` so the current directory does not
shadow it):

* the peak resident memory (``os.wait4``'s ``ru_maxrss`` of that process alone) of ``launcher status``
  on a run dir whose ``events.jsonl`` starts with one 200 MB line (written in 1 MiB pieces: this
  process stays small, and a forked child's ``ru_maxrss`` counts its parent's pages);
* the median end-to-end wall time and CPU time (user + system, ``os.wait4``) of ``launcher status`` on
  a run dir of 20,000 ``heartbeat`` events, 15 runs, the two trees interleaved so that the machine's
  load hits both alike (the CPU time is the steadier of the two on a shared machine).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.monitoring.test_status import EVENTS, write_run_dir  # noqa: E402  (after the path is set)

RUNS = 15


def run_status(tree: str, run_dir: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    return subprocess.Popen([sys.executable, "-m", "launcher", "status", "--run-dir", run_dir], env=env, cwd="/tmp",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def peak_mib(tree: str, run_dir: str) -> int:
    _, status, usage = os.wait4(run_status(tree, run_dir).pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss // 1024


def seconds(tree: str, run_dir: str) -> tuple:
    """Wall time and CPU time (user + system, of that process alone) of one ``launcher status``."""
    started = time.perf_counter()
    _, _, usage = os.wait4(run_status(tree, run_dir).pid, 0)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def main(trees) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        line_dir = write_run_dir(Path(tmp) / "line", 2, 2 ** 22 + 1, EVENTS)
        events = Path(line_dir) / "events.jsonl"
        good = events.read_bytes()
        with open(events, "wb") as fh:
            fh.write(b'{"event": "padding", "ts": 1, "pad": "')
            for _ in range(200):
                fh.write(b"x" * (1024 * 1024))
            fh.write(b'"}\n' + good)
        many = write_run_dir(Path(tmp) / "many", 2, 2 ** 22 + 1, EVENTS)
        lines = [dict(EVENTS[0], run_id="r")] + [{"run_id": "r", "ts": 1000.0 + i * 0.01, "event": "heartbeat",
                                                  "rank": i % 8, "step": i} for i in range(20000)]
        (Path(many) / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        for tree in trees:
            print(f"{tree}: 200 MB line: peak RSS {peak_mib(tree, line_dir)} MiB")
        times = {tree: [] for tree in trees}
        for _ in range(RUNS):
            for tree in trees:
                times[tree].append(seconds(tree, many))
        for tree in trees:
            wall = statistics.median(t[0] for t in times[tree])
            cpu = statistics.median(t[1] for t in times[tree])
            print(f"{tree}: 20,000 events: median wall {wall:.3f} s, CPU {cpu:.3f} s over {RUNS} runs")


if __name__ == "__main__":
    main(sys.argv[1:] or [str(REPO)])
