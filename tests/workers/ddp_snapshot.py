#!/usr/bin/env python3
"""A torchrun training script in the style of PyTorch's DDP tutorial (``multigpu_torchrun.py``: a
Linear model, a DistributedSampler, a snapshot file every few epochs and a resume from it), on CPU with
gloo. It never imports ``launcher_heartbeat``: the launcher sees only its processes and its output.

For the goodput tests each rank records what it did, with ``time.time()``, as JSON lines in
``$TIMES_DIR/rank_<r>.jsonl`` (with the attempt, ``TORCHELASTIC_RESTART_COUNT``): ``python`` (the interpreter reached this script), ``print`` (every line
it printed, with the text), ``die`` / ``hang`` (just before the injected fault), ``end`` (training done). Faults happen once per
job (a marker file in ``$TIMES_DIR``): ``--die-rank R --die-at E`` SIGKILLs rank R at the start of
epoch E; ``--hang-rank R --hang-at E`` makes it sleep, silent, from the start of epoch E.
"""

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's name for it
TIMES = os.path.join(os.environ["TIMES_DIR"], f"rank_{RANK}.jsonl")


def record(what: str, **fields) -> None:
    with open(TIMES, "a") as fh:
        fh.write(json.dumps({"what": what, "t": time.time(), "attempt": ATTEMPT, **fields}) + "\n")


def say(text: str) -> None:
    """Print one line (flushed at once, as ``python -u`` would) and record when."""
    print(text, flush=True)
    record("print", text=text)


def once(name: str) -> bool:
    """True the first time in the job (a marker file): the fault does not repeat after the restart."""
    try:
        os.close(os.open(os.path.join(os.environ["TIMES_DIR"], name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


class Trainer:
    def __init__(self, model, data, optimizer, snapshot_path, args):
        self.model, self.data, self.optimizer, self.args = model, data, optimizer, args
        self.snapshot_path, self.epochs_run = snapshot_path, 0
        if os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path)
            model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            say(f"Resuming training from snapshot at Epoch {self.epochs_run}")
        self.model = DDP(model)

    def _fault(self, epoch: int) -> None:
        args = self.args
        if RANK == args.die_rank and epoch == args.die_at and once("died"):
            record("die", epoch=epoch)
            os.kill(os.getpid(), signal.SIGKILL)
        if RANK == args.hang_rank and epoch == args.hang_at and once("hung"):
            record("hang", epoch=epoch)
            time.sleep(3600)

    def _run_epoch(self, epoch: int) -> None:
        self._fault(epoch)
        self.data.sampler.set_epoch(epoch)
        say(f"[rank{RANK}] Epoch {epoch} | Batchsize: {self.args.batch_size} | Steps: {len(self.data)}")
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            time.sleep(self.args.compute)  # the device's share of a step

    def train(self, epochs: int) -> None:
        for epoch in range(self.epochs_run, epochs):
            self._run_epoch(epoch)
            if RANK == 0 and epoch % self.args.save_every == 0:
                torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1},
                           self.snapshot_path)
                say(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--snapshot", default="snapshot.pt")
    parser.add_argument("--compute", type=float, default=0.01, help="seconds slept per step")
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-at", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    args = parser.parse_args()
    record("python", t=STARTED)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(512, 20, generator=generator), torch.rand(512, 1, generator=generator))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(data))
    model = torch.nn.Linear(20, 1)
    Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=1e-3), args.snapshot, args).train(args.total_epochs)
    dist.destroy_process_group()
    record("end")


if __name__ == "__main__":
    main()
