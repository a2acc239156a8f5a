"""A tiny rank for the debugging tests (``launcher run --debug-rank`` / ``--pdb``).

Every rank prints ``rank R says hello`` and writes ``R`` to ``--ready-file``. Then:
  --break-rank R    rank R calls breakpoint() with a local ``x`` (the test steps and prints it)
  --raise-rank R    rank R raises ValueError with a local ``x`` (post-mortem)
  --raise-when PATH ... only once PATH exists (the test's trigger)
  --hold FILE       the other ranks wait until FILE exists (written by the debugged rank once done)
"""

import argparse
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file")
    parser.add_argument("--break-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--raise-when")
    parser.add_argument("--hold")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    print(f"rank {rank} says hello", flush=True)
    if args.ready_file:
        with open(args.ready_file, "a") as fh:
            fh.write(f"{rank}\n")
    if rank == args.break_rank:
        x = 41
        breakpoint()
        x += 1
        print(f"rank {rank} x is {x}", flush=True)
    if rank == args.raise_rank:
        while args.raise_when and not os.path.exists(args.raise_when):
            time.sleep(0.02)
        x = 7
        raise ValueError(f"rank {rank} broke with x={x}")
    if args.hold:
        if rank in (args.break_rank, args.raise_rank):
            open(args.hold, "w").close()
        else:
            while not os.path.exists(args.hold):  # the test's own bound is the pytest timeout
                time.sleep(0.02)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
