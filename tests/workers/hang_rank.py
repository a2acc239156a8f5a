"""A rank that hangs on purpose, for the hang detector's tests (``--heartbeat-timeout``).

It appends ``<rank> <attempt> <pid>`` to ``--ready-file`` once it runs, makes ``--steps`` steps (a
heartbeat or, with ``--no-client``, an output line each), then on the attempts in ``--hang-attempts``:
rank ``--hang-rank`` hangs the way ``--mode`` says while the others stay healthy (beating or printing)
until they are stopped. On other attempts every rank exits 0 after its steps.
  --mode sleep        time.sleep forever in hang_here()
  --mode gil          a C call that holds the GIL (ctypes.PyDLL's libc sleep): no Python code runs
  --mode no-stderr    close stdout and stderr, then sleep (no output, no heartbeat)
  --mode section      stay in section "checkpoint" forever (judged by --section-timeout)
  --mode slow         step 4 times slower than the others (a straggler), never hang
  --mode crash        exit 3 instead (a crash loop at one step, for --max-no-progress-restarts)
``--early-exit-rank R`` exits 0 at once, before any step or output; ``--step-pause S`` sleeps S seconds
after each of the first steps.
"""

import argparse
import ctypes
import os
import sys
import time

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def beat(args, step):
    if args.no_client:
        print(f"step {step}", flush=True)
    else:
        import launcher_heartbeat

        launcher_heartbeat.heartbeat(step=step)


def hang_here(mode):
    if mode == "crash":
        sys.exit(3)
    if mode == "gil":
        ctypes.PyDLL(None).sleep(100000)
    if mode == "no-stderr":
        os.close(1)
        os.close(2)
    if mode == "section":
        import launcher_heartbeat

        with launcher_heartbeat.section("checkpoint"):
            while True:
                time.sleep(3600)
    while True:
        time.sleep(3600)


def healthy_wait(args, step, pause=0.05):
    while True:
        step += 1
        beat(args, step)
        time.sleep(pause)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-attempts", default="0")
    parser.add_argument("--mode", default="sleep")
    parser.add_argument("--no-client", action="store_true")
    parser.add_argument("--early-exit-rank", type=int)
    parser.add_argument("--step-pause", type=float, default=0.0)
    args = parser.parse_args()
    with open(args.ready_file, "a") as f:
        f.write(f"{RANK} {ATTEMPT} {os.getpid()}\n")
    if RANK == args.early_exit_rank:
        return 0
    for step in range(args.steps):
        beat(args, step)
        time.sleep(args.step_pause)
    if str(ATTEMPT) not in args.hang_attempts.split(","):
        return 0
    if RANK == args.hang_rank and args.mode == "slow":
        healthy_wait(args, args.steps, pause=0.2)
    if RANK == args.hang_rank:
        hang_here(args.mode)
    if args.mode == "crash":  # the others make no progress either: they wait to be stopped
        hang_here("sleep")
    healthy_wait(args, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
