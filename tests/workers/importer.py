"""A rank that imports modules, some at start and some later (lazily, as torch imports torch._dynamo
on an optimizer's first step), for ``--preload auto`` (tests/integration/test_standby.py).

``--now A,B`` are imported at start, ``--later C`` one second after. Then ``<out>/<attempt>-<rank>.json``
lists which of the named modules were already in ``sys.modules`` when the script began (a
standby-born rank has them) and the process's thread count after the imports, and on attempt 0 rank ``--fail-rank`` waits for ``--fail-when`` and
exits 3; every other rank waits for the same file and ends.
"""

import argparse
import importlib
import json
import os
import sys
import time

_AT_START = set(sys.modules)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--now", default="")
    parser.add_argument("--later", default="")
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-when", required=True)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("LAUNCHER_ATTEMPT", "0"))
    names = [name for name in (args.now + "," + args.later).split(",") if name]
    for name in args.now.split(","):
        if name:
            importlib.import_module(name)
    time.sleep(1.0)
    for name in args.later.split(","):
        if name:
            importlib.import_module(name)
    path = os.path.join(args.out, f"{attempt}-{rank}.json")
    with open(path, "w") as fh:
        json.dump({"preloaded": sorted(name for name in names if name in _AT_START),
                   "threads": len(os.listdir("/proc/self/task"))}, fh)
    while attempt == 0 and not os.path.exists(args.fail_when):
        time.sleep(0.01)
    return 3 if attempt == 0 and rank == args.fail_rank else 0


if __name__ == "__main__":
    sys.exit(main())
