"""A rank that trains in steps and beats them, for the goodput's recomputed steps (issue #15).

It appends ``<rank> <attempt> <pid>`` to ``--ready-file`` once it runs, resumes from
``LAUNCHER_RESUME_STEP`` (0 without it) and beats that step, then makes steps up to ``--steps`` of
``--step-time`` seconds each, beating every one and saving ``<ckpt-dir>/rank_<r>/ckpt-0_<step>.pt``
every ``--ckpt-every`` steps. On attempt 0, at step ``--fail-at``, rank ``--fail-rank`` exits 1 once
every rank saved the checkpoint before that step, and the others stop there as if blocked in a
collective: the attempt's highest step is exactly ``--fail-at`` and the restart resumes from the newest
checkpoint before it. On a later attempt, after its last step a rank waits for ``--finish-when`` to
exist (so a test can look at the live job), then exits 0.
"""

import argparse
import os
import sys
import time

import launcher_heartbeat

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def checkpoint(ckpt_dir, rank, step):
    return os.path.join(ckpt_dir, f"rank_{rank}", f"ckpt-0_{step}.pt")


def save(ckpt_dir, step):
    path = checkpoint(ckpt_dir, RANK, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        fh.write(f"step {step}\n")
    os.rename(path + ".tmp", path)


def wait_for(paths):
    while not all(os.path.exists(p) for p in paths):
        time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser()
    for name in ("--ready-file", "--ckpt-dir", "--finish-when"):
        parser.add_argument(name, required=True)
    for name in ("--steps", "--ckpt-every", "--fail-at", "--fail-rank"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    args = parser.parse_args()
    with open(args.ready_file, "a") as fh:
        fh.write(f"{RANK} {ATTEMPT} {os.getpid()}\n")
    step = int(os.environ.get("LAUNCHER_RESUME_STEP") or 0)
    launcher_heartbeat.heartbeat(step=step)
    while step < args.steps:
        time.sleep(args.step_time)
        step += 1
        launcher_heartbeat.heartbeat(step=step)
        if step % args.ckpt_every == 0:
            save(args.ckpt_dir, step)
        if ATTEMPT == 0 and step == args.fail_at:
            if RANK != args.fail_rank:
                while True:
                    time.sleep(3600)
            before = step // args.ckpt_every * args.ckpt_every
            wait_for([checkpoint(args.ckpt_dir, r, before) for r in range(WORLD)])
            sys.exit(1)
    wait_for([args.finish_when])


if __name__ == "__main__":
    main()
