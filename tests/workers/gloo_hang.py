"""A real PyTorch gloo job where one rank stops calling all_reduce: the others block in it.

Every rank appends ``<rank> <attempt> <pid>`` to ``--ready-file``, joins gloo, then per step
all-reduces and beats (``launcher_heartbeat``). On attempt 0, rank ``--stuck-rank`` stops after
``--steps`` steps and waits in ``wait_for_data()`` (a stand-in for a deadlocked data loader) while the
others sit in gloo's all_reduce until gloo's own 600 s timeout. Later attempts run ``--steps`` steps
and exit 0.
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import launcher_heartbeat
import torch
import torch.distributed as dist

ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def wait_for_data():
    while True:
        time.sleep(3600)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stuck-rank", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    with open(args.ready_file, "a") as f:
        f.write(f"{rank} {ATTEMPT} {os.getpid()}\n")
    for step in range(args.steps * 2 if ATTEMPT == 0 else args.steps):
        if ATTEMPT == 0 and rank == args.stuck_rank and step == args.steps:
            wait_for_data()
        value = torch.tensor([step])
        dist.all_reduce(value)
        launcher_heartbeat.heartbeat(step=step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
