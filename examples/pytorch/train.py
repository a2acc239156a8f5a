#!/usr/bin/env python3
"""Deterministic data-parallel training that survives faults with nothing lost.

A small MLP learns a synthetic regression task. Every rank holds a full replica; gradients are
averaged across ranks every step, so all replicas stay bit-identical and any rank's checkpoint can
restore any other rank. The script runs unchanged under ``torchrun`` and under ``launcher run``
(both export RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT).

Resilience features, all driven by plain environment variables so that this file stays user code
(it deliberately does not import the ``launcher`` package):

* periodic checkpoints ``<ckpt-dir>/rank_<RANK>/ckpt-<epoch>_<step>.pt``, written atomically and
  reported to the launcher's checkpoint index (``<ckpt-dir>/.saves/``) when its ``launcher_saves``
  helper is importable;
* resume from ``LAUNCHER_RESUME_CHECKPOINT`` at ``LAUNCHER_RESUME_STEP`` (or ``--resume-latest``);
* a dying-gasp breakpoint ``ckpt-<epoch>_<step>_breakpoint.pt`` on SIGTERM/SIGINT, with all ranks
  agreeing on the step through an all-reduce;
* graceful exit on request through the JSON file named by ``LAUNCHER_GRACEFUL_EXIT_FILE``;
* heartbeats with the step (``launcher_heartbeat``, when the launcher provides it) for its hang
  detector and its count of recomputed steps;
* fault injection (``--fail-at-step``) for tests and demos.

Exit codes: 0 finished or graceful exit on request; 128+signal after a signal (143 for SIGTERM);
1 a peer failed or the injected ``exit`` fault; 2 an unusable resume checkpoint.
"""

import argparse
import hashlib
import io
import json
import os
import pickle
import re
import signal
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

try:  # the launcher's stdlib helper to report saves (launcher/rankhooks, on the ranks' PYTHONPATH)
    import launcher_saves
except ImportError:  # under torchrun, or a copy of this script elsewhere: the launcher scans instead
    launcher_saves = None
try:  # heartbeats with the step (launcher run --heartbeat-timeout): hang detection and recomputed steps
    import launcher_heartbeat
except ImportError:
    launcher_heartbeat = None

# Variable names of the launcher contract, spelled out because user code must not import it.
ENV_RESUME_CHECKPOINT = "LAUNCHER_RESUME_CHECKPOINT"
ENV_RESUME_STEP = "LAUNCHER_RESUME_STEP"
ENV_GRACEFUL_EXIT_FILE = "LAUNCHER_GRACEFUL_EXIT_FILE"
ENV_GASP_SAVE_ALLOWED = "LAUNCHER_GASP_SAVE_ALLOWED"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

EXIT_PEER_FAILED = 1
EXIT_BAD_RESUME = 2

# The model and data sizes: about 5.5k parameters, cheap enough for 4 ranks on 2 CPU cores.
IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4

CKPT_NAME = re.compile(r"^ckpt-(\d+)_(\d+)(_breakpoint)?\.pt$")
DIGEST_SUFFIX = ".sha256"
CKPT_KEYS = frozenset(("model", "optimizer", "step", "epoch", "seed"))


def parse_args(argv=None):
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1234, help="seed of model, data and teacher")
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--steps-per-epoch", type=int, default=50, help="epoch = step // this")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--ckpt-every", type=int, default=20, help="periodic checkpoint interval (0: never)")
    p.add_argument("--ckpt-dir", default="./checkpoints", help="checkpoint root directory")
    p.add_argument("--output", default=None, help="final model file (default <ckpt-dir>/final.pt)")
    p.add_argument("--resume-latest", action="store_true",
                   help="without LAUNCHER_RESUME_CHECKPOINT: resume from the newest checkpoint "
                        "step that every rank has in its own rank directory")
    p.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    p.add_argument("--log-every", type=int, default=10, help="print progress every N steps")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="process-group timeout in seconds (init and collectives)")
    p.add_argument("--peer-failure-grace", type=float, default=2.0,
                   help="after a peer failure, seconds to wait for the supervisor's SIGTERM so "
                        "that the breakpoint is saved; without one, exit 1")
    p.add_argument("--ready-file", default=None,
                   help="append '<rank> <time>' to this file once the process group is up")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="inject a fault when this many steps are completed")
    p.add_argument("--fail-rank", type=int, default=0, help="rank that injects the fault")
    p.add_argument("--fail-mode", choices=("exit", "kill", "segv", "hang"), default="exit",
                   help="exit: exit code 1; kill: SIGKILL itself; segv: SIGSEGV itself; "
                        "hang: ignore SIGTERM and sleep forever")
    p.add_argument("--fail-every-attempt", action="store_true",
                   help="inject the fault on restarts too (default: first attempt only)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.steps_per_epoch < 1 or args.batch_size < 1:
        p.error("--steps must be >= 0, --steps-per-epoch and --batch-size >= 1")
    return args


class StopRequests:
    """Local reasons to stop: a caught signal or a graceful-exit request in a JSON file."""

    def __init__(self, exit_file):
        self.signum = 0
        self.installed = False
        self.exit_file = exit_file or None
        self._file_key = None
        self._file_says_exit = False

    def install(self):
        """Catch SIGTERM and SIGINT; the handler only records the signal (it runs between
        bytecodes, possibly inside a collective's caller, so doing real work there is unsafe)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        self.installed = True

    def _on_signal(self, signum, _frame):
        self.signum = signum

    def signal_within(self, seconds):
        """Wait up to `seconds` for a signal; True if one arrived. A peer's death reaches us
        through the collective a moment before the supervisor's SIGTERM does: waiting briefly
        lets every survivor save its breakpoint instead of racing the signal."""
        # Before install() a signal kills us by default, so there is nothing to wait for.
        deadline = time.monotonic() + (seconds if self.installed else 0)
        while not self.signum and time.monotonic() < deadline:
            time.sleep(0.01)
        return bool(self.signum)

    def exit_requested(self):
        """True when the graceful-exit file holds {"GracefulExit": 1}; stat first so an unchanged
        file is not re-read at every step."""
        if not self.exit_file:
            return False
        try:
            st = os.stat(self.exit_file)
        except FileNotFoundError:
            self._file_key = None
            return False
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._file_key:
            try:
                with open(self.exit_file, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                # The writer may truncate and rewrite in place: a torn read is retried next step.
                return False
            self._file_key = key
            self._file_says_exit = isinstance(data, dict) and data.get("GracefulExit") in (1, "1")
        return self._file_says_exit


class PeerFailure(Exception):
    """A collective failed: a peer died or timed out."""


def collective(op, *args):
    """Run a torch.distributed collective, turning its backend error into PeerFailure."""
    try:
        return op(*args)
    except RuntimeError as exc:  # DistBackendError and gloo's errors are RuntimeErrors
        raise PeerFailure(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def pick_backend(local_rank):
    """hccl on Ascend NPUs, nccl on CUDA GPUs, gloo on CPU; returns (backend, device)."""
    try:
        import torch_npu  # noqa: F401  (registers the "npu" device and the hccl backend)
    except ImportError:
        pass
    else:
        torch.npu.set_device(local_rank)
        return "hccl", torch.device("npu", local_rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def single_process_defaults():
    """Started as plain `python train.py` (no RANK): run as a world of one on a free port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(name, value)


def init_distributed(args):
    """Join the process group from the torchrun-style environment; returns (rank, world, device)."""
    single_process_defaults()
    backend, device = pick_backend(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.ready_file:
        # One O_APPEND write per rank, so lines from concurrent ranks never interleave.
        fd = os.open(args.ready_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{rank} {time.time()}\n".encode())
        finally:
            os.close(fd)
    log(f"rank {rank}/{world} backend {backend} device {device}")
    return rank, world, device


def derived_generator(*key):
    """A CPU generator seeded from a tuple, so each (seed, step, rank) gets its own stream."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2 ** 63 - 1))


class Job:
    """Everything one rank trains: model, optimizer, data and the number of completed steps."""

    def __init__(self, args, rank, world, device):
        self.args, self.rank, self.world, self.device = args, rank, world, device
        torch.manual_seed(args.seed)  # identical initial replicas on every rank
        self.model = torch.nn.Sequential(
            torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.Tanh(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
            torch.nn.Linear(HIDDEN, OUT_FEATURES)).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr,
                                         momentum=args.momentum)
        g = derived_generator(args.seed, "teacher")
        self.teacher_in = torch.randn(IN_FEATURES, HIDDEN, generator=g) / IN_FEATURES ** 0.5
        self.teacher_out = torch.randn(HIDDEN, OUT_FEATURES, generator=g) / HIDDEN ** 0.5
        self.step = 0

    def batch(self, step):
        """The batch of `step` on this rank: a pure function of (seed, step, rank), so a resumed
        run sees exactly the batches an uninterrupted run would have seen."""
        g = derived_generator(self.args.seed, step, self.rank)
        x = torch.randn(self.args.batch_size, IN_FEATURES, generator=g)
        y = torch.sin(x @ self.teacher_in) @ self.teacher_out
        return x.to(self.device), y.to(self.device)

    def train_step(self):
        """One optimizer step; returns the local loss. Raises PeerFailure before the parameters
        change if the gradient exchange fails, so the state stays that of the last completed step."""
        x, y = self.batch(self.step)
        self.optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.average_gradients()
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def average_gradients(self):
        """Average gradients over ranks. all_gather plus a sum in rank order (rather than
        all_reduce or DDP) makes the result bit-identical whatever algorithm the backend picks."""
        params = list(self.model.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        parts = [torch.empty_like(flat) for _ in range(self.world)]
        collective(dist.all_gather, parts, flat)
        total = parts[0].clone()
        for part in parts[1:]:
            total.add_(part)
        total.div_(self.world)
        offset = 0
        for p in params:
            p.grad.copy_(total[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def params_sha256(self):
        """SHA-256 of the concatenated raw bytes of all parameters, in state_dict order."""
        h = hashlib.sha256()
        for tensor in self.model.state_dict().values():
            h.update(bytes(tensor.detach().cpu().contiguous().view(torch.uint8).reshape(-1).tolist()))
        return h.hexdigest()


def rank_dir(args, rank):
    """The checkpoint directory of one rank."""
    return os.path.join(args.ckpt_dir, f"rank_{rank}")


def atomic_write(data, path):
    """Write bytes to <path>.tmp, fsync, rename over <path>, fsync the directory: a reader sees the
    old file or the complete new one, never a torn one, even across a power loss."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_save(obj, path):
    """torch.save `obj` to `path` atomically, after its digest `<path>.sha256` (sha256sum format):
    whoever finds the checkpoint finds its digest, and a file damaged later (a bit flip, a bad copy)
    no longer matches it. torch.load checks neither the zip CRC-32 nor anything else."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    atomic_write(f"{hashlib.sha256(data).hexdigest()}  {os.path.basename(path)}\n".encode(), path + DIGEST_SUFFIX)
    atomic_write(data, path)


def verify_digest(path):
    """Exit 2 unless `path` matches its `<path>.sha256` (a checkpoint without one is accepted)."""
    try:
        with open(path + DIGEST_SUFFIX, encoding="ascii") as f:
            expected = f.read().split()[0]
    except FileNotFoundError:
        return
    except (OSError, ValueError, IndexError) as exc:
        fail(EXIT_BAD_RESUME, f"cannot read the digest of {path}: {exc}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        fail(EXIT_BAD_RESUME, f"resume checkpoint {path} does not match its digest {path}{DIGEST_SUFFIX}")


def save_checkpoint(job, breakpoint):
    """Save this rank's checkpoint of the last completed step; returns its path."""
    epoch = job.step // job.args.steps_per_epoch
    suffix = "_breakpoint" if breakpoint else ""
    path = os.path.join(rank_dir(job.args, job.rank), f"ckpt-{epoch}_{job.step}{suffix}.pt")
    if launcher_saves is not None and os.path.exists(path):
        launcher_saves.withdraw(path)  # saved again after a restart: the old report goes first
    atomic_save({"model": job.model.state_dict(), "optimizer": job.optimizer.state_dict(),
                 "step": job.step, "epoch": epoch, "seed": job.args.seed,
                 "world_size": job.world}, path)
    if launcher_saves is not None:
        launcher_saves.report_saved(path)  # the launcher's index then needs no look at rank_<r>/
    return path


def load_checkpoint(job, path, expected_step):
    """Restore model, optimizer and step from `path`; exit 2 if it does not belong to this run."""
    verify_digest(path)
    try:
        state = torch.load(path, map_location=job.device, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        fail(EXIT_BAD_RESUME, f"cannot load resume checkpoint {path}: {exc}")
    if not isinstance(state, dict) or not CKPT_KEYS <= state.keys():
        fail(EXIT_BAD_RESUME, f"{path} is not a checkpoint of this script "
                              f"(expected keys {sorted(CKPT_KEYS)})")
    if expected_step is not None and state["step"] != expected_step:
        fail(EXIT_BAD_RESUME, f"resume checkpoint {path} holds step {state['step']}, "
                              f"but {ENV_RESUME_STEP}={expected_step}")
    if state["seed"] != job.args.seed:
        fail(EXIT_BAD_RESUME, f"resume checkpoint {path} was trained with seed {state['seed']}, "
                              f"this run uses --seed {job.args.seed}")
    job.model.load_state_dict(state["model"])
    job.optimizer.load_state_dict(state["optimizer"])
    job.step = state["step"]


def local_checkpoints(directory):
    """{step: path} of the complete checkpoints in `directory` (.tmp files never match);
    at equal steps a breakpoint wins over a periodic file (they hold the same state)."""
    found = {}
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return found
    for name in names:
        m = CKPT_NAME.match(name)
        if m and (int(m.group(2)) not in found or m.group(3)):
            found[int(m.group(2))] = os.path.join(directory, name)
    return found


def latest_common_checkpoint(job):
    """For --resume-latest: the newest step that every rank has a checkpoint of, and this rank's
    file for it. Ranks can differ (one died before its breakpoint), so they agree on the step:
    each round every rank proposes its newest step below the last rejected one, the minimum is
    accepted if all ranks hold it. Tensor collectives only (all_gather_object needs numpy)."""
    mine = local_checkpoints(rank_dir(job.args, job.rank))
    proposal = max(mine, default=-1)
    while True:
        candidate = all_reduce_ints(job, [proposal], dist.ReduceOp.MIN)[0]
        if candidate < 0:
            return None, None
        if all_reduce_ints(job, [int(candidate in mine)], dist.ReduceOp.MIN)[0]:
            return mine[candidate], candidate
        proposal = max((s for s in mine if s < candidate), default=-1)


def all_reduce_ints(job, values, op):
    """All-reduce a short list of integers with `op`; returns the reduced list."""
    tensor = torch.tensor(values, dtype=torch.int64, device=job.device)
    collective(dist.all_reduce, tensor, op)
    return tensor.tolist()


def resume(job):
    """Restore state as the launcher (or --resume-latest) says and print where training starts."""
    path = os.environ.get(ENV_RESUME_CHECKPOINT) or None
    step_text = os.environ.get(ENV_RESUME_STEP) or None
    step = None
    if path:
        try:
            step = int(step_text) if step_text is not None else None
        except ValueError:
            fail(EXIT_BAD_RESUME, f"{ENV_RESUME_STEP}={step_text!r} is not an integer")
    elif job.args.resume_latest:
        path, step = latest_common_checkpoint(job)
    if not path:
        log("starting from scratch")
        return
    load_checkpoint(job, path, step)
    log(f"resumed from {path} at step {job.step}")


def maybe_inject_fault(job):
    """Fail as --fail-* asks, on the first attempt only unless --fail-every-attempt."""
    args = job.args
    if args.fail_at_step != job.step or args.fail_rank != job.rank:
        return
    if not args.fail_every_attempt and os.environ.get(ENV_RESTART_COUNT, "0") != "0":
        return
    log(f"injecting fault '{args.fail_mode}' on rank {job.rank} at step {job.step}")
    sys.stderr.flush()
    if args.fail_mode == "exit":
        exit_now(1)
    if args.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fail_mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    # "hang": a stuck rank that ignores SIGTERM, so only SIGKILL ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(3600)


def agree_on_stop(job, stops):
    """All-reduce(MAX) [graceful-exit request, signal number] so that every rank stops at the
    same step for the same reason. Returns the agreed pair."""
    return tuple(all_reduce_ints(job, [int(stops.exit_requested()), stops.signum],
                                 dist.ReduceOp.MAX))


def dying_gasp(job, code, why):
    """Save the breakpoint checkpoint of the last completed step (unless the launcher forbids it),
    then exit with `code`."""
    if os.environ.get(ENV_GASP_SAVE_ALLOWED, "1") == "0":
        log(f"{why} at step {job.step}: breakpoint save not allowed, exiting")
    else:
        path = save_checkpoint(job, breakpoint=True)
        log(f"{why} at step {job.step}: saved breakpoint {path}")
    exit_now(code)


def beat(job):
    """Tell the launcher this rank's step (a no-op without its heartbeat slot): its hang detector
    watches the beats, and its goodput counts the steps a restart made the ranks recompute."""
    if launcher_heartbeat is not None:
        launcher_heartbeat.heartbeat(step=job.step)


def run(job, stops):
    """The training loop, from job.step to --steps."""
    args = job.args
    beat(job)  # the step this attempt starts (resumes) from
    while job.step < args.steps:
        graceful, signum = agree_on_stop(job, stops)
        if graceful:
            dying_gasp(job, 0, "graceful exit requested")
        if signum:
            dying_gasp(job, 128 + signum, f"signal {signum} received")
        maybe_inject_fault(job)
        loss = job.train_step()
        beat(job)
        if args.log_every > 0 and job.step % args.log_every == 0:
            log(f"step {job.step}/{args.steps} loss {loss:.4f}")
        if args.ckpt_every > 0 and job.step % args.ckpt_every == 0:
            save_checkpoint(job, breakpoint=False)
        if args.step_time > 0:
            time.sleep(args.step_time)


def finish(job):
    """Check that the replicas are bit-identical; rank 0 writes the final model and its hash."""
    digest = job.params_sha256()
    digest_ints = list(bytes.fromhex(digest))
    lowest = all_reduce_ints(job, digest_ints, dist.ReduceOp.MIN)
    highest = all_reduce_ints(job, digest_ints, dist.ReduceOp.MAX)
    if lowest != highest:
        fail(EXIT_PEER_FAILED, f"replicas diverged: rank {job.rank} has sha256 {digest}")
    if job.rank == 0:
        output = job.args.output or os.path.join(job.args.ckpt_dir, "final.pt")
        atomic_save(job.model.state_dict(), output)
        log(f"final sha256 {digest}")
    # No rank exits before the final model is on disk, so "all ranks exited 0" means it is there.
    collective(dist.barrier)


def log(message, stream=None):
    """Print one line with a single write, so lines of ranks sharing a stream never interleave."""
    stream = stream or sys.stdout
    stream.write(message + "\n")
    stream.flush()


def fail(code, message):
    """Print one error line and exit with `code`."""
    log(f"error: {message}", sys.stderr)
    exit_now(code)


def exit_now(code):
    """Exit without tearing the process group down: after a peer failure the teardown can block,
    and the launcher needs the exit code promptly."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None):
    """Train, resuming and stopping as the environment asks."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # ranks share the cores; more threads only contend
    stops = StopRequests(os.environ.get(ENV_GRACEFUL_EXIT_FILE))
    rank, world, device = init_distributed(args)
    job = Job(args, rank, world, device)
    try:
        resume(job)
        # Until now there is nothing to save, so a signal keeps its default action: prompt death,
        # even while blocked in init_process_group where a Python handler could not run.
        stops.install()
        run(job, stops)
        finish(job)
    except PeerFailure as exc:
        if stops.signal_within(args.peer_failure_grace):
            # The parameters are still those of the last completed step (the optimizer runs only
            # after a successful exchange), so the breakpoint is valid even though a peer is gone.
            dying_gasp(job, 128 + stops.signum, f"signal {stops.signum} after peer failure ({exc})")
        fail(EXIT_PEER_FAILED, f"collective failed at step {job.step} (peer died or hung?): {exc}")
    dist.destroy_process_group()
    # Skip interpreter finalization: a gloo worker thread can still be releasing the last Work
    # (which holds Python tensors) and would abort the process (SIGABRT) while Python shuts down.
    exit_now(0)


if __name__ == "__main__":
    main()
