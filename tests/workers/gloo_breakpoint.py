"""Real gloo ranks stopping at ``torch.distributed.breakpoint(rank=N)``: N debugs, the others wait.

N is ``$LAUNCHER_DEBUG_RANK`` (``launcher run --debug-rank N``), else ``--rank``. After the
breakpoint every rank all-reduces its rank, so the job ends only if the group survived the pause.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    me = dist.get_rank()
    target = int(os.environ.get("LAUNCHER_DEBUG_RANK", args.rank))
    secret = 1000 + me
    print(f"rank {me} at the barrier", flush=True)
    dist.breakpoint(rank=target)
    total = torch.tensor([me])
    dist.all_reduce(total)
    sys.stdout.write(f"rank {me} after the breakpoint: sum {int(total)} secret {secret}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
