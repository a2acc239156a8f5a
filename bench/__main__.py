"""``python -m bench [BENCHMARK ...] [--runs N] [--quick]``: run the benchmarks, print and save results.

Without names every benchmark runs. A full run (all benchmarks, not ``--quick``) rewrites
``docs/benchmarks.md`` and ``bench/results/latest.json`` (raw per-run numbers); a subset or a quick
run writes ``bench/results/partial.md`` and ``partial.json`` instead unless ``--docs`` is given.
"""

import argparse
import importlib
import sys
import time
from typing import List, Optional

from bench import common, report

BENCHMARKS = {
    "launch": "bench.launch",
    "detect": "bench.detect",
    "restart": "bench.restart",
    "gasp": "bench.gasp",
    "overhead": "bench.overhead",
    "logs": "bench.logs",
    "scale": "bench.scale",
    "status": "bench.status",
    "hang": "bench.hang",
    "multinode": "bench.multinode",
    "resume": "bench.resume",
    "simnodes": "bench.simnodes",
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench",
                                     description="Benchmark the launcher against torchrun and msrun.")
    parser.add_argument("benchmarks", nargs="*", metavar="BENCHMARK",
                        help=f"subset to run, any of: {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per variant (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded warm-up rounds (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 run, no warm-up, fewer sizes, short durations")
    parser.add_argument("--overhead-runs", type=int, default=1,
                        help="runs of the 60 s overhead benchmark (default 1)")
    parser.add_argument("--docs", action="store_true",
                        help="write docs/benchmarks.md even for a subset or quick run")
    args = parser.parse_args(argv)
    unknown = [name for name in args.benchmarks if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Run the selected benchmarks and write the report; returns the exit status."""
    args = parse_args(argv)
    names = args.benchmarks or list(BENCHMARKS)
    settings = common.Settings(runs=1 if args.quick else args.runs, warmup=0 if args.quick else args.warmup,
                               quick=args.quick, overhead_runs=args.overhead_runs)
    command = "python -m bench" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    common.become_subreaper()
    started, results = time.time(), {}
    try:
        for name in names:
            common.progress(f"=== {name} ===")
            module = importlib.import_module(BENCHMARKS[name])
            common.RETRIES.reset()
            bench_start = time.time()
            results[name] = module.run(settings)
            results[name].raw["elapsed_s"] = round(time.time() - bench_start, 1)
    finally:
        leftovers = common.cleanup()
    full = len(names) == len(BENCHMARKS) and not args.quick
    doc = report.write(results, names, command, started, leftovers, to_docs=full or args.docs)
    print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
