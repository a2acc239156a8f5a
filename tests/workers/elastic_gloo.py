#!/usr/bin/env python3
"""A rank of an elastic job that really rendezvouses once the job has regrouped.

Every attempt appends ``<rank> <attempt> <MASTER_ADDR> <MASTER_PORT> <WORLD_SIZE>`` to the ready
file. An attempt before ``--first-attempt`` (default 1) then waits to be stopped (the test kills a
node meanwhile); a later attempt joins a gloo process group at ``MASTER_ADDR:MASTER_PORT``,
all-reduces its rank and appends ``<rank> <world> <sum>`` to ``--result-file``, then exits 0.
"""

import argparse
import os
import signal
from datetime import timedelta


def append(path: str, line: str) -> None:
    """One write with O_APPEND: the ranks of all nodes share the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--result-file", required=True)
    parser.add_argument("--first-attempt", type=int, default=1)
    args = parser.parse_args()
    env = os.environ
    attempt = int(env["LAUNCHER_ATTEMPT"])
    append(args.ready_file, " ".join([env["RANK"], str(attempt), env["MASTER_ADDR"], env["MASTER_PORT"],
                                      env["WORLD_SIZE"]]))
    if attempt < args.first_attempt:
        signal.pause()  # stopped by the launcher when the job regroups
        return 1
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    total = torch.tensor([dist.get_rank()])
    dist.all_reduce(total)
    append(args.result_file, f"{dist.get_rank()} {dist.get_world_size()} {int(total)}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
