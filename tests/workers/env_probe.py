"""Side-by-side probe: dump what this process was given to a JSON file, then end as asked.

Run under torchrun, msrun or ``launcher run``; the test compares the dumps. Imports nothing but
the standard library (torch is loaded only for ``--mode record-raise``), so it starts fast.

argv: ``--out DIR`` (one ``<rank>.json`` per process, ``sched.json`` for MindSpore's scheduler),
``--mode ok|exit3|kill|raise|raise-noisy|record-raise`` (what the failing rank does), ``--fail-rank R`` (which rank
fails; the others exit 0), ``--ranks N`` (the failing rank first waits until ranks 0..N-1 printed their
last line, so every tool shows the same output), then anything: extra arguments are recorded as they
arrived.
"""

import argparse
import atexit
import json
import os
import signal
import sys
import time

# The rank as the process knows it: torchrun's RANK, the legacy RANK_ID, MindSpore's MS_NODE_ID.
RANK_VARS = ("RANK", "RANK_ID", "MS_NODE_ID")


def own_rank() -> str:
    """The first rank variable set (the MindSpore scheduler has none and is ``sched``)."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return "sched"
    for name in RANK_VARS:
        if name in os.environ:
            return os.environ[name]
    return "none"


def dump(out_dir: str, argv) -> str:
    """Write this process's view of its start to ``out_dir`` and return the rank."""
    rank = own_rank()
    doc = {
        "env": dict(os.environ),
        "argv": list(argv),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "stdout_isatty": sys.stdout.isatty(),
        # Each print reaches the reader at once: a terminal (line buffering) or PYTHONUNBUFFERED.
        "stdout_flushes_lines": bool(sys.stdout.line_buffering or sys.stdout.write_through),
        "stdin_isatty": sys.stdin.isatty(),
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)
    return rank


def fail(mode: str, rank: str) -> None:
    """Print a marker line WITHOUT flushing, then fail the way ``mode`` says."""
    print(f"probe rank {rank} failing with {mode}")
    if mode == "exit3":
        sys.exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise-noisy":  # shutdown output after the traceback pushes it out of the log's last lines
        atexit.register(lambda: print("".join(f"shutting down worker {i}\n" for i in range(20)), end=""))
        mode = "raise"
    if mode == "raise":
        raise ValueError(f"probe failure on rank {rank}")
    if mode == "record-raise":
        from torch.distributed.elastic.multiprocessing.errors import record

        record(_raise)(rank)


def _raise(rank: str) -> None:
    raise ValueError(f"probe failure on rank {rank}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--fail-rank", default="1")
    parser.add_argument("--ranks", type=int, default=2)
    args, _rest = parser.parse_known_args()
    rank = dump(args.out, sys.argv)
    print(f"probe rank {rank} started")
    if args.mode != "ok" and rank == args.fail_rank:
        wait_for_others(args.out, rank, args.ranks)
        fail(args.mode, rank)
    print(f"probe rank {rank} done", flush=True)
    done = os.path.join(args.out, f"{rank}.done")
    open(done, "w").close()


def wait_for_others(out_dir: str, rank: str, ranks: int, timeout: float = 60.0) -> None:
    """Until every other rank printed its last line (its ``.done`` file), bounded by ``timeout``."""
    others = [os.path.join(out_dir, f"{r}.done") for r in range(ranks) if str(r) != rank]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in others):
        time.sleep(0.01)


if __name__ == "__main__":
    main()
