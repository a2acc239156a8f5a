"""Benchmark 7, scale: the restore plan before a restart as a live launcher meets it (issue #29).

``bench.scale`` times the planner in process, after a first plan: its index rows are the *second*
plan. This runs the launcher itself, ``launcher run --nnodes 1024 --node-rank 0 --nproc-per-node 16
--dp 8 --tp 8 --pp 256 --checkpoint-dir TREE`` (16,384 ranks, this node's 16 of them), over
``bench.scale``'s synthetic tree (16,384 rank directories, 32,764 checkpoints, every save reported in
``.saves/``), and reads the time from each ``restart`` event to the ``restore_plan`` event of the same
attempt in ``events.jsonl``: everything a restart does before the ranks get their plan (the node's
pre-attempt checks, the plan, its record). The ranks are ``sh`` processes that cost nothing; local
rank 0 fails ``FAIL_AFTER`` seconds into each attempt, ``RESTARTS`` times per run.

Two kinds of run:

* ``quiet``: nothing saved while the job runs; the first restart is the plan's first use of the
  index the start's full listing built, the later ones come after a plan like them.
* ``saved``: in attempt 0, local rank 0 runs a save round first (another process: ``SAVERS`` ranks
  save and report the next periodic step, as ``bench.scalebg`` writes them) and fails the moment it
  ends, the worst case for the index's thread, which has the ranks' stop to absorb it.

``python -m bench.scalelive --runs 5`` runs it alone (printing the medians); ``bench scale`` runs it
after its in-process rows. Each run waits for a quiet machine first (``GATE``).
"""

import argparse
import itertools
import json
import os
import shutil
import stat
import sys
import time
from typing import Dict, List, Optional

from bench.common import GATE, PYTHON, REPO, Job, LoadMeter, TempDir, job_env, median, progress, read_events

NNODES, NPROC = 1024, 16
FAIL_AFTER = 3.0
RESTARTS = 2
#: Seconds a run may take (the first plan's full listing is ~3 s on an idle machine).
RUN_TIMEOUT = 300.0
_STEPS = itertools.count(500)  # the save rounds' steps, one more each round

_WORKER = """#!/bin/sh
# Local rank 0 fails each attempt; the others sleep until the launcher stops them.
if [ "$LOCAL_RANK" != 0 ]; then exec sleep 1000; fi
sleep "$BENCH_FAIL_AFTER"
if [ -n "$BENCH_SAVE_STEP" ] && [ "$LAUNCHER_ATTEMPT" = 0 ]; then
    "$BENCH_PYTHON" -c "$BENCH_ROUND" "$BENCH_TREE" "$BENCH_SAVE_STEP" "$(($BENCH_SAVE_STEP - 1))"
fi
exit 1
"""


def _worker(directory: str) -> str:
    path = os.path.join(directory, "worker.sh")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_WORKER)
    os.chmod(path, stat.S_IRWXU)
    return path


def _gaps(events: List[dict], clock: str = "ts") -> List[float]:
    """Seconds from each ``restart`` event to the ``restore_plan`` event of its attempt (``clock``:
    the events' ``ts``, or the probe's ``cpu``)."""
    restarts = {e["attempt"]: e[clock] for e in events if e.get("event") == "restart"}
    return [e[clock] - restarts[e["attempt"]] for e in events
            if e.get("event") == "restore_plan" and e.get("attempt") in restarts]


def _records(path: str) -> List[dict]:
    """The probe's records (none when the file is missing)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def live_run(tree: str, scratch: str, save_step: Optional[int], repo: str = REPO) -> Dict[str, object]:
    """One launcher run (the one in the source tree ``repo``) over ``tree``; its restart ->
    restore_plan gaps (first restart first) and the share of the machine other processes took meanwhile."""
    from bench.scalebg import _ROUND  # pylint: disable=import-outside-toplevel  # it imports bench.scale

    run_dir, log_dir = os.path.join(scratch, "run"), os.path.join(scratch, "logs")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, mode=0o700)
    cpu_file = os.path.join(scratch, "cpu.jsonl")
    if os.path.exists(cpu_file):
        os.remove(cpu_file)
    # The launcher's CLI under bench/scaleprobe.py, which records its main thread's CPU time at the
    # two events (run as a file: the launcher imported is repo's, whatever bench that tree has).
    argv = [PYTHON, os.path.join(REPO, "bench", "scaleprobe.py"), cpu_file, "run", "--nnodes", str(NNODES),
            "--node-rank", "0", "--nproc-per-node", str(NPROC), "--dp", "8", "--tp", "8", "--pp", "256",
            "--checkpoint-dir", tree,
            "--max-restarts", str(RESTARTS), "--restart-backoff", "0", "--stop-timeout", "2", "--preload", "none",
            "--run-dir", run_dir, "--log-dir", log_dir, "--no-python", _worker(scratch)]
    env = job_env(fail_after=FAIL_AFTER, python=PYTHON, tree=tree, round=_ROUND,
                  save_step="" if save_step is None else save_step)
    env["PYTHONPATH"] = f"{repo}:{REPO}"  # the launcher from repo; the save round from this bench
    GATE.wait()
    meter = LoadMeter()
    with open(os.path.join(scratch, "launcher.out"), "wb") as out:
        job = Job(argv, env, stdout=out, stderr=out, cwd=repo)
        job.finish(RUN_TIMEOUT)
    gaps, cpu = _gaps(read_events(run_dir)), _gaps(_records(cpu_file), "cpu")
    if len(gaps) != RESTARTS or len(cpu) != RESTARTS:
        raise RuntimeError(f"scalelive: {len(gaps)} restart(s) measured, not {RESTARTS}; see "
                           f"{os.path.join(scratch, 'launcher.out')}")
    return {"gaps": gaps, "cpu": cpu, "load": meter.share()}


def live_plans(tree: str, runs: int, repo: str = REPO) -> Dict[str, List[float]]:
    """``runs`` runs of each kind, alternating; per row key, the seconds of each run (``_cpu``: the
    launcher's main thread's CPU seconds in the same spans)."""
    out: Dict[str, List[float]] = {f"{key}{clock}": [] for key in ("live_first", "live_later", "live_saved_first")
                                   for clock in ("", "_cpu")}
    out["live_load"] = []
    with TempDir("scalelive") as scratch:
        for run in range(runs):
            quiet = live_run(tree, scratch, None, repo)
            # A new step each run (the round deletes the one before).
            saved = live_run(tree, scratch, next(_STEPS), repo)
            for clock, key in (("", "gaps"), ("_cpu", "cpu")):
                out[f"live_first{clock}"].append(quiet[key][0])
                out[f"live_later{clock}"].extend(quiet[key][1:])
                out[f"live_saved_first{clock}"].append(saved[key][0])
            out["live_load"].extend([quiet["load"], saved["load"]])
            progress(f"scale: live run {run + 1}/{runs}: first restart {_ms(quiet, 0)}, later {_ms(quiet, 1)}; "
                     f"first restart after a save round {_ms(saved, 0)} (others' CPU share {quiet['load']:.0%} / "
                     f"{saved['load']:.0%})")
    return out


def _ms(result: Dict[str, List[float]], index: int) -> str:
    return f"{result['gaps'][index] * 1e3:.0f} ms (CPU {result['cpu'][index] * 1e3:.0f} ms)"


def main(argv: Optional[List[str]] = None) -> int:
    """Build the tree, run ``--runs`` runs of each kind (alternating the ``--repo`` trees run by run),
    print the medians."""
    from bench.scale import LIVE_ROWS, _make_checkpoints  # pylint: disable=import-outside-toplevel

    parser = argparse.ArgumentParser(prog="python -m bench.scalelive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--repo", action="append", help="a launcher source tree to run; repeat it for an A/B "
                        "(the trees alternate run by run; default: this one)")
    args = parser.parse_args(argv)
    repos = [os.path.abspath(repo) for repo in args.repo or [REPO]]
    times: Dict[str, Dict[str, List[float]]] = {repo: {} for repo in repos}
    with TempDir("ckpt") as tree:
        start = time.perf_counter()
        _make_checkpoints(tree)
        progress(f"scale: synthetic checkpoint dir made in {time.perf_counter() - start:.1f} s")
        for _ in range(args.runs):
            for repo in repos:
                for key, values in live_plans(tree, 1, repo).items():
                    times[repo].setdefault(key, []).extend(values)
    for repo in repos:
        print(f"{repo}:")
        for key, label in LIVE_ROWS:
            for clock in ("", "_cpu"):
                values = times[repo][key + clock]
                print(f"  {label}{' (CPU of the main thread)' if clock else ''}: median {median(values) * 1e3:.1f} "
                      f"ms, runs {', '.join(f'{v * 1e3:.0f}' for v in values)} ms")
        print(f"  other processes' share of the CPUs during the runs: median {median(times[repo]['live_load']):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
