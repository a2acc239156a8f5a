#!/usr/bin/env python3
"""A real PyTorch gloo rank, run the same way under torchrun and under ``launcher run``.

Joins the process group from torchrun's variables, all-reduces its rank, and prints one line
``rank R/W sum S argv [...] local_rank L`` so that a test can compare both launchers' ranks.
``--print-env A,B`` first prints ``env RANK <A> <B>`` (the launcher's variables, before joining).
``--raise-on R`` makes rank R raise an uncaught exception after the all-reduce (torch's excepthook
prefixes its traceback with ``[rankR]:``).
"""

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """One line in one write: torchrun's ranks share its stdout, and print() under ``python -u``
    writes the text and the newline separately, so two ranks' lines would interleave."""
    os.write(1, (line + "\n").encode())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--raise-on", type=int, default=-1)
    parser.add_argument("--print-env", default="")
    args, _unknown = parser.parse_known_args()
    if args.print_env:
        values = " ".join(os.environ.get(name, "-") for name in args.print_env.split(","))
        say(f"env {os.environ['RANK']} {values}")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank])
    dist.all_reduce(total)
    say(f"rank {rank}/{world} sum {int(total)} argv {sys.argv[1:]} local_rank {os.environ['LOCAL_RANK']}")
    if rank == args.raise_on:
        raise RuntimeError(f"injected failure on rank {rank}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
