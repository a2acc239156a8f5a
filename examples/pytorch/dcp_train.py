"""Sharded training saved with torch.distributed.checkpoint (DCP): resume on any number of ranks.

A small MLP is sharded over every rank with FSDP2 (``fully_shard``: each rank holds a slice of every
parameter and of the AdamW state), on CPU with gloo. Every ``--save-every`` steps all ranks save
one global DCP checkpoint, ``<ckpt-dir>/dcp/step-<step>/``; rank 0 then writes the launcher manifest
(``launcher-manifest.json``: the world size and layout that wrote it) and renames the directory
into place, so a directory with its final name is complete.

Resume: under ``launcher run --checkpoint-dir`` every rank gets ``LAUNCHER_RESUME_DCP_DIR`` (and
``LAUNCHER_RESUME_STEP``) whatever world size wrote that step, and DCP reshards on load. Without the
launcher (torchrun) the newest ``step-*`` directory with a ``.metadata`` is used.

The global batch of a step is a pure function of ``(seed, step)`` and is split evenly over the ranks
(``--global-batch`` must be divisible by the world size), so the loss curve does not depend on the
world size beyond floating-point summation order: 4 ranks, then 2, then 3 continue one curve.

``--dump-loaded FILE``: after a resume, rank 0 writes the full (unsharded) model state it loaded, to
compare with a reference resharded offline (``tests/integration/test_dcp_reshard.py``).
"""

import argparse
import json
import os
import re
import shutil
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from train import atomic_write  # examples/pytorch/train.py, beside this file

ENV_DCP_DIR = "LAUNCHER_RESUME_DCP_DIR"
ENV_STEP = "LAUNCHER_RESUME_STEP"
MANIFEST = "launcher-manifest.json"
STEP_DIR = re.compile(r"step-(\d+)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", required=True, help="holds dcp/step-<step>/")
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--dump-loaded", metavar="FILE", help="rank 0 saves the full state it resumed from")
    parser.add_argument("--timeout", type=float, default=120, help="process-group timeout, seconds")
    return parser.parse_args(argv)


def log(message):
    print(f"[dcp_train rank {dist.get_rank()}/{dist.get_world_size()}] {message}", flush=True)


def build(args, world):
    """The sharded model and its optimizer (same initial values on every world size)."""
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr)


def batch(args, step, rank, world):
    """This rank's slice of the global batch of ``step``: a pure function of (seed, step)."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.global_batch, 16, generator=gen)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * x[:, 4:5]
    per_rank = args.global_batch // world
    return x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]


def train_step(args, model, opt, step, rank, world):
    """One step; returns the global mean loss (FSDP averages the gradients over the ranks)."""
    x, y = batch(args, step, rank, world)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world


def newest_step_dir(ckpt_dir):
    """The newest complete step directory (torchrun: no launcher to plan it), or None."""
    root = os.path.join(ckpt_dir, "dcp")
    steps = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        match = STEP_DIR.fullmatch(name)
        if match and os.path.exists(os.path.join(root, name, ".metadata")):
            steps.append((int(match.group(1)), os.path.join(root, name)))
    return max(steps)[1] if steps else None


def resume(args, model, opt, rank):
    """Load the planned step (any world size wrote it); returns the step to continue after."""
    path = os.environ.get(ENV_DCP_DIR) or newest_step_dir(args.ckpt_dir)
    if not path:
        return 0
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = int(state["step"])
    if os.environ.get(ENV_STEP) and int(os.environ[ENV_STEP]) != step:
        raise SystemExit(f"{path} holds step {step}, the plan said {os.environ[ENV_STEP]}")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if args.dump_loaded and rank == 0:
        torch.save(full, args.dump_loaded)
    saved_by = os.environ.get("LAUNCHER_RESUME_SAVED_WORLD_SIZE", "?")
    log(f"resumed from {path} at step {step} (saved by {saved_by} ranks)")
    return step


def save(args, model, opt, step, rank, world):
    """One global checkpoint: shards by every rank, manifest and rename by rank 0."""
    root = os.path.join(args.ckpt_dir, "dcp")
    final = os.path.join(root, f"step-{step}")
    partial = final + ".partial"  # not a step-<n> name: never planned, even with a .metadata
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=partial)
    if rank == 0:
        manifest = {"launcher_manifest": 1, "format": "dcp", "world_size": world, "epoch": None,
                    "step": step, "layout": {"dp": world, "tp": 1, "pp": 1}}
        atomic_write(json.dumps(manifest).encode(), os.path.join(partial, MANIFEST))
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again after a restart
        # Not fsynced: a rename lost to a power cut leaves step-<n>.partial, never planned, and the
        # previous step is resumed instead.
        os.rename(partial, final)
    dist.barrier()


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by {world} ranks")
    model, opt = build(args, world)
    step = resume(args, model, opt, rank)
    while step < args.steps:
        step += 1
        loss = train_step(args, model, opt, step, rank, world)
        if rank == 0:
            log(f"step {step} loss {loss:.9f}")
        if step % args.save_every == 0 or step == args.steps:
            save(args, model, opt, step, rank, world)
    dist.destroy_process_group()
    # Skip interpreter finalization, as train.py does: a gloo worker thread can still be releasing
    # its last work and would abort the process (SIGABRT) while Python shuts down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
