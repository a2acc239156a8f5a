#!/usr/bin/env python3
"""Deterministic data-parallel MindSpore training (dynamic cluster) that stops, saves and resumes.

A small dense network learns a synthetic regression task with ``Model.train``. Every rank holds a
full replica and gradients are averaged over the ranks every step, so the replicas stay identical
and any rank's checkpoint can restore any other rank (stock ``DATA_PARALLEL``). The same script is
the dynamic-cluster
scheduler (``MS_ROLE=MS_SCHED``: it only calls ``init()``, which serves the cluster and never
returns) and every worker (``MS_ROLE=MS_WORKER``), so it runs under
``launcher run --framework mindspore`` and under ``msrun`` alike; without ``MS_ROLE`` it trains
stand-alone.

MindSpore's own mechanisms, driven by the launcher's plain environment variables (this file does
not import the ``launcher`` package: it is user code):

* periodic checkpoints: ``ModelCheckpoint`` writes
  ``<ckpt-dir>/rank_<RANK_ID>/<prefix>-<epoch>_<step>.ckpt`` (MindSpore's step is the step within
  the epoch; the optimizer's ``global_step`` inside the file is the total);
* graceful exit on request: ``OnRequestExit(config_file=$LAUNCHER_GRACEFUL_EXIT_FILE)`` with
  ``MS_ENABLE_GRACEFUL_EXIT=1``. When the file holds ``{"GracefulExit": 1}`` the ranks agree
  in-graph (an all-reduce), finish the step, write ``<ckpt-dir>/rank_<RANK_ID>/<exit-name>_train.ckpt``
  and stop; exit 0;
* dying gasp on SIGTERM: ``OnRequestExit``'s own SIGTERM handler makes the ranks agree on a step
  the same way; at that step's end the script raises, and ``CheckpointConfig(exception_save=True)``
  writes ``<prefix>-<epoch>_<step>_breakpoint.ckpt``; exit 143. ``exception_save`` is off when the
  launcher says ``LAUNCHER_GASP_SAVE_ALLOWED=0`` (crash loop);
* resume from ``LAUNCHER_RESUME_CHECKPOINT`` (or ``--resume-from``): parameters, momenta and the
  optimizer's ``global_step``; the data pipeline skips exactly the steps already done
  (``initial_epoch`` plus ``Dataset.set_init_step``), so a resumed run sees the batches an
  uninterrupted one would have seen and ends with bit-identical parameters;
* replica groups for the restore planner: ``$GROUP_INFO_FILE`` (``launcher run --group-info-root``)
  gets the ``group_info.pb`` MindSpore writes in ``DATA_PARALLEL``, written by this script on CPU,
  where MindSpore cannot (``take_over_group_info``); on a breakpoint plan the vendor's
  ``RESTORE_RANKS_MAP`` is checked against the launcher's choice;
* fault injection (``--fail-at-step``/``--fail-rank``) on the first attempt only.

Exit codes: 0 finished or stopped on request; 143 after the SIGTERM gasp; 1 a failure;
2 an unusable resume checkpoint, or a ``RESTORE_RANKS_MAP`` that disagrees with the plan.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

# MindSpore's C++ side logs every connection attempt at WARNING (GLOG_v=2). Errors only, unless the
# user set GLOG_v. This must happen before mindspore is imported.
os.environ.setdefault("GLOG_v", "3")
# Graceful exit and the coordinated gasp need TrainOneStepCell's agreement flags; the launcher sets
# this only with --graceful-exit, msrun never. Read when the cells are built.
os.environ.setdefault("MS_ENABLE_GRACEFUL_EXIT", "1")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402
from mindspore.common import dtype as mstype  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402
from mindspore.train import Model  # noqa: E402
from mindspore.train.callback import (Callback, CheckpointConfig, ModelCheckpoint,  # noqa: E402
                                      OnRequestExit)
from mindspore.utils import ExitByRequest  # noqa: E402

# The launcher's contract, spelled out because user code does not import the launcher.
ENV_RESUME_CHECKPOINT = "LAUNCHER_RESUME_CHECKPOINT"
ENV_RESUME_STEP = "LAUNCHER_RESUME_STEP"
ENV_RESUME_KIND = "LAUNCHER_RESUME_KIND"
ENV_RESUME_SOURCE_RANK = "LAUNCHER_RESUME_SOURCE_RANK"
ENV_GRACEFUL_EXIT_FILE = "LAUNCHER_GRACEFUL_EXIT_FILE"
ENV_GASP_SAVE_ALLOWED = "LAUNCHER_GASP_SAVE_ALLOWED"
ENV_RESTORE_RANKS = "RESTORE_RANKS"
ENV_RESTORE_RANKS_MAP = "RESTORE_RANKS_MAP"
ENV_GROUP_INFO_FILE = "GROUP_INFO_FILE"
ENV_ATTEMPT = ("LAUNCHER_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")  # the first one set wins

EXIT_FAILED = 1
EXIT_BAD_RESUME = 2

IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4
# TrainOneStepCell's graceful-exit flags (MS_ENABLE_GRACEFUL_EXIT=1) are parameters, so they are in
# every checkpoint, and one written on an exit request holds graceful_init=1. They are control state
# of the run that wrote them: never restored.
GRACEFUL_PARAMS = ("graceful_exit", "graceful_init")


def parse_args(argv=None):
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1234, help="seed of weights, data and teacher")
    p.add_argument("--epochs", type=int, default=4, help="epochs to train in total")
    p.add_argument("--steps-per-epoch", type=int, default=25, help="batches per epoch and rank")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (Momentum)")
    p.add_argument("--momentum", type=float, default=0.9, help="momentum (Momentum)")
    p.add_argument("--ckpt-dir", default="./checkpoints", help="checkpoint root; rank r uses <dir>/rank_<r>/")
    p.add_argument("--prefix", default="ms", help="ModelCheckpoint prefix: <prefix>-<epoch>_<step>.ckpt")
    p.add_argument("--save-steps", type=int, default=5, help="CheckpointConfig.save_checkpoint_steps")
    p.add_argument("--keep-max", type=int, default=10, help="CheckpointConfig.keep_checkpoint_max")
    p.add_argument("--exit-name", default="ms", help="OnRequestExit file_name: <exit-name>_train.ckpt")
    p.add_argument("--resume-from", default=None,
                   help="without LAUNCHER_RESUME_CHECKPOINT: the checkpoint to resume from, '{rank}' "
                        "replaced by this rank (e.g. ckpt/rank_{rank}/ms_train.ckpt)")
    p.add_argument("--log-every", type=int, default=5, help="print the loss every N steps (0: never)")
    p.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step, seconds (tests)")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="inject a fault once this many steps are done (first attempt only)")
    p.add_argument("--fail-rank", type=int, default=0, help="the rank that injects the fault")
    p.add_argument("--fail-mode", choices=("raise", "exit", "kill"), default="raise",
                   help="raise: a Python exception (exception_save writes a breakpoint); "
                        "exit: os._exit(1), nothing saved; kill: SIGKILL")
    p.add_argument("--pynative", action="store_true", help="PyNative mode instead of graph mode")
    p.add_argument("--device-target", default="CPU", help="MindSpore device target (only CPU is tested)")
    args = p.parse_args(argv)
    if min(args.epochs, args.steps_per_epoch, args.batch_size, args.save_steps) < 1:
        p.error("--epochs, --steps-per-epoch, --batch-size and --save-steps must be positive")
    return args


def log(message, stream=None):
    """Print one line with a single write, so lines of ranks sharing a stream never interleave."""
    stream = stream or sys.stdout
    stream.write(message + "\n")
    stream.flush()


def fail(code, message):
    """Print one error line and exit with ``code`` at once."""
    log(f"error: {message}", sys.stderr)
    sys.stdout.flush()
    os._exit(code)


def attempt_number():
    """The launcher's restart count: 0 on the first start, and when not under a launcher."""
    for name in ENV_ATTEMPT:
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


# -- data and model ------------------------------------------------------------------------------
class RankBatches:
    """Random-access dataset source: item ``i`` is the whole batch ``i`` of this rank, a pure
    function of (seed, rank, i). No ``Dataset.batch``: a dataset row is a training step, so
    ``set_init_step`` skips exactly the steps already trained."""

    def __init__(self, seed, rank, steps, batch):
        rng = np.random.default_rng([seed, 1])  # the teacher: the same on every rank
        w_in = rng.standard_normal((IN_FEATURES, HIDDEN)) / IN_FEATURES ** 0.5
        w_out = rng.standard_normal((HIDDEN, OUT_FEATURES)) / HIDDEN ** 0.5
        rng = np.random.default_rng([seed, 2, rank])  # this rank's shard
        self.x = rng.standard_normal((steps, batch, IN_FEATURES)).astype(np.float32)
        self.y = (np.sin(self.x @ w_in) @ w_out).astype(np.float32)

    def __getitem__(self, index):
        return self.x[index], self.y[index]

    def __len__(self):
        return len(self.x)


def build_network(seed):
    """The model; identical initial weights on every rank."""
    ms.set_seed(seed)
    return nn.SequentialCell(nn.Dense(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Dense(HIDDEN, HIDDEN),
                             nn.Tanh(), nn.Dense(HIDDEN, OUT_FEATURES))


class Float32ExitByRequest(ExitByRequest):
    """``ExitByRequest`` whose all-reduce runs on float32.

    The stock one all-reduces the int32 ``graceful_init`` flag, and MindSpore's CPU AllReduce kernel
    takes float32/float16 only ("Select CPU operator[AllReduce] fail! Unsupported data type!"): a
    distributed CPU job with ``MS_ENABLE_GRACEFUL_EXIT=1`` fails at its first step. Same rule:
    stop when every rank asked (sum of the flags == group size).
    """

    def __init__(self):
        super().__init__()
        self.cast = ops.Cast()
        if self.is_distributed:
            self.base = ms.Tensor([self.group_size], dtype=mstype.float32)

    def exit_by_request(self, grad, init_value, exit_value):
        if self.is_distributed:
            all_status = self.all_reduce(self.cast(init_value, mstype.float32))
            reduce_all = self.reduce_all(self.equal(all_status, self.base))
            grad = ops.depend(grad, self.assign(exit_value, reduce_all))
        return grad


class TrainStep(nn.TrainOneStepCell):
    """``TrainOneStepCell`` whose graceful-exit agreement works on CPU (``Float32ExitByRequest``).

    The gradient all-reduce is the stock one: ``DATA_PARALLEL`` (set in ``setup``) makes
    ``TrainOneStepCell`` add its ``DistributedGradReducer``.
    """

    def __init__(self, network, optimizer):
        super().__init__(network, optimizer)
        if self.use_graceful_exit and self.graceful_exit.is_distributed:
            self.graceful_exit = Float32ExitByRequest()


def params_sha256(net):
    """SHA-256 over the network's parameters (name, dtype, shape, raw bytes) in name order."""
    digest = hashlib.sha256()
    for param in sorted(net.get_parameters(), key=lambda p: p.name):
        value = np.ascontiguousarray(param.asnumpy())
        digest.update(f"{param.name}|{value.dtype}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def steps_done(optimizer):
    """The optimizer's step counter: the number of completed steps."""
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


# -- replica groups (GROUP_INFO_FILE) -------------------------------------------------------------
def take_over_group_info(world):
    """Write ``$GROUP_INFO_FILE`` as MindSpore does in ``DATA_PARALLEL``, which it cannot on CPU.

    With ``GROUP_INFO_FILE`` set, MindSpore's data-parallel compile pass (``SetDataParallelGroupInfo``)
    writes a ``ParallelGroupMap`` whose ``ckpt_restore_rank_list`` is every rank (all replicas
    are identical), but on CPU that pass first fails ("Invalid communication backend: CPU for
    semi_auto_parallel/auto_parallel mode"). So on CPU this removes the variable before the compile
    and writes the same message with MindSpore's own protobuf class; the launcher's restore planner
    (``--group-info-root``) reads it as one replica group.
    """
    path = os.environ.pop(ENV_GROUP_INFO_FILE, None)
    if not path:
        return
    from mindspore.train.node_strategy_pb2 import ParallelGroupMap

    message = ParallelGroupMap()
    message.ckpt_restore_rank_list.dim.extend(range(world))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.tmp"
    with open(partial, "wb") as fh:
        fh.write(message.SerializeToString())
    os.replace(partial, path)  # the planner of a restart never sees half a file
    log(f"group info: wrote {path}, ckpt_restore_rank_list {list(range(world))}")


def replica_source(rank):
    """This rank's source in ``RESTORE_RANKS_MAP`` (``{"0,1": 0}``: group -> source), or None.

    Membership is tested on the split key: the vendor's substring test finds rank 1 in "0,10".
    """
    text = os.environ.get(ENV_RESTORE_RANKS_MAP)
    if not text:
        return None
    try:
        mapping = json.loads(text)
    except ValueError:
        fail(EXIT_BAD_RESUME, f"{ENV_RESTORE_RANKS_MAP} is not JSON: {text!r}")
    for group, source in mapping.items():
        if str(rank) in group.split(","):
            return int(source)
    return None


def check_restore_map(rank):
    """On a breakpoint plan, the vendor's ``RESTORE_RANKS``/``RESTORE_RANKS_MAP`` must name the source
    the launcher chose for this rank: a script written for the MindX variables loads the same file."""
    if os.environ.get(ENV_RESUME_KIND) != "breakpoint":
        return
    source = replica_source(rank)
    log(f"restore ranks {os.environ.get(ENV_RESTORE_RANKS, '?')} map {os.environ.get(ENV_RESTORE_RANKS_MAP)}: "
        f"rank {rank} loads rank {source}'s breakpoint")
    if str(source) != os.environ.get(ENV_RESUME_SOURCE_RANK):
        fail(EXIT_BAD_RESUME, f"{ENV_RESTORE_RANKS_MAP} names source {source} for rank {rank}, "
                              f"{ENV_RESUME_SOURCE_RANK} {os.environ.get(ENV_RESUME_SOURCE_RANK)}")


# -- resume --------------------------------------------------------------------------------------
def resume_source(args, rank):
    """``(path, how)`` of the checkpoint to resume from, or ``(None, None)``."""
    path = os.environ.get(ENV_RESUME_CHECKPOINT) or None
    if path:
        how = (f"launcher plan: kind={os.environ.get(ENV_RESUME_KIND, '?')} "
               f"source_rank={os.environ.get(ENV_RESUME_SOURCE_RANK, '?')} "
               f"step={os.environ.get(ENV_RESUME_STEP, '?')}")
        check_restore_map(rank)
        return path, how
    if args.resume_from:
        return args.resume_from.replace("{rank}", str(rank)), "--resume-from"
    return None, None


def load_resume_checkpoint(train_net, path, how, args):
    """Load parameters, momenta and ``global_step`` into the train network; returns the steps done.

    The number of steps done comes from the state (the optimizer's ``global_step``), not from the
    file name: MindSpore names a breakpoint after the step in progress when the exception hit, which
    is one more than the steps the file holds when the exception came before the step ran.
    """
    try:
        # crc_check: a file saved with a CRC (see CheckpointConfig below) that no longer matches it
        # raises ValueError; files saved without one load as before.
        params = ms.load_checkpoint(path, crc_check=True)
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        fail(EXIT_BAD_RESUME, f"cannot load resume checkpoint {path}: {exc}")
    if "global_step" not in params:
        fail(EXIT_BAD_RESUME, f"{path} has no optimizer global_step: not a checkpoint of this script")
    done = int(params["global_step"].asnumpy().reshape(-1)[0])
    # OnRequestExit's <name>_train.ckpt stores global_step as an int64 scalar (its append_dict
    # entry replaces the optimizer's int32 [1] parameter), which load_param_into_net rejects.
    params["global_step"] = ms.Parameter(ms.Tensor([done], mstype.int32), name="global_step")
    for name in GRACEFUL_PARAMS:
        params.pop(name, None)
    try:
        not_loaded, _ = ms.load_param_into_net(train_net, params)
    except (RuntimeError, ValueError, TypeError) as exc:
        fail(EXIT_BAD_RESUME, f"{path} does not fit this network: {str(exc).splitlines()[0]}")
    missing = [name for name in not_loaded if name not in GRACEFUL_PARAMS]
    if missing:
        fail(EXIT_BAD_RESUME, f"{path} lacks parameters {missing}: a different network?")
    total = args.epochs * args.steps_per_epoch
    if done > total:
        fail(EXIT_BAD_RESUME, f"{path} is at step {done}, beyond this run's {total} steps")
    note = ""
    named = os.environ.get(ENV_RESUME_STEP) if path == os.environ.get(ENV_RESUME_CHECKPOINT) else None
    in_epoch = (done - 1) % args.steps_per_epoch + 1 if done else 0
    if named is not None and named != str(in_epoch):
        note = f" (its name says step {named} of the epoch, its state step {in_epoch}: using the state)"
    log(f"resumed from {path} [{how}] at global step {done}{note}")
    return done


# -- callbacks -----------------------------------------------------------------------------------
class RankOnRequestExit(OnRequestExit):
    """``OnRequestExit`` with two changes for a supervised, resumable job.

    * Its directory is ``rank_<global rank>``. The stock callback uses ``rank_<device_id>``, the
      local device index, so on a second node it would write into node 0's rank directories.
    * It does not load ``<name>_train.ckpt`` by itself at ``on_train_begin``. That stock behaviour
      restores the parameters but not the data position or the step count, and would silently
      override the checkpoint the launcher planned; it even fails on its own file (see
      ``load_resume_checkpoint``). Resume from that file with ``--resume-from``.
    """

    def __init__(self, rank, file_name, directory, config_file):
        super().__init__(save_ckpt=True, save_mindir=False, file_name=file_name, directory=directory,
                         config_file=config_file, sig=signal.SIGTERM)
        rank_dir = os.path.join(directory, f"rank_{rank}")
        os.makedirs(rank_dir, exist_ok=True)
        self.train_name = os.path.join(rank_dir, f"{file_name}_train")
        self.eval_name = os.path.join(rank_dir, f"{file_name}_eval")

    def on_train_begin(self, run_context):
        if self.use_graceful:  # without MS_ENABLE_GRACEFUL_EXIT=1 the handler would swallow SIGTERM
            signal.signal(self.sig, self._handle_signal)

    @property
    def signalled(self):
        """True once SIGTERM arrived (the handler only sets this flag)."""
        return bool(self.exit)

    @property
    def stopped(self):
        """True once the ranks agreed to stop and this one stopped."""
        return bool(self.stop_train)


class GaspRequested(BaseException):
    """Raised at the agreed step's end after SIGTERM, so that exception_save writes the breakpoint.
    A BaseException, like KeyboardInterrupt: no ``except Exception`` on the way swallows it."""


class DyingGasp(Callback):
    """SIGTERM as a coordinated dying gasp, saved by ``exception_save``.

    ``OnRequestExit`` catches SIGTERM and, at the next step start, asks for the in-graph agreement;
    all ranks then stop after the same step. Instead of its ``<name>_train.ckpt`` this callback
    raises at that step's end: ``Model.train``'s exception_save then writes
    ``<prefix>-<epoch>_<step>_breakpoint.ckpt`` holding exactly that step. Raising at once in the
    signal handler (the vendor ExceptionCheckpoint's way) is unsafe with collectives: a peer that
    is already inside the next step's all-reduce waits forever for this rank, cannot run its own
    Python handler there, and dies by SIGKILL without a checkpoint.
    Must come after the ``RankOnRequestExit`` in the callback list.
    """

    def __init__(self, exit_cb):
        super().__init__()
        self.exit_cb = exit_cb

    def on_train_step_begin(self, run_context):
        if self.exit_cb.signalled:
            self.exit_cb.save_ckpt = False  # one file in the gasp's time budget: the breakpoint

    def on_train_step_end(self, run_context):
        if self.exit_cb.signalled and self.exit_cb.stopped:
            raise GaspRequested(self.exit_cb.sig)


class StartAt(Callback):
    """Resume bookkeeping. ``Model.train`` has ``initial_epoch`` but no initial step: make MindSpore
    count steps from the restored global step, so that file names (epoch, step within the epoch)
    continue the run, and keep ModelCheckpoint's cadence on multiples of --save-steps (it would
    otherwise save at the first step after the resume, then every k)."""

    def __init__(self, done, checkpoints, save_steps):
        super().__init__()
        self.done, self.checkpoints, self.save_steps = done, checkpoints, save_steps

    def on_train_begin(self, run_context):
        run_context.original_args().cur_step_num = self.done
        if hasattr(self.checkpoints, "_last_triggered_step"):  # private; MindSpore's TFT resets it too
            self.checkpoints._last_triggered_step = self.done - self.done % self.save_steps


class Progress(Callback):
    """The loss every --log-every steps, the --step-time sleep, and the injected fault."""

    def __init__(self, args, rank, total):
        super().__init__()
        self.args, self.rank, self.total = args, rank, total
        self.inject = args.fail_at_step is not None and args.fail_rank == rank and attempt_number() == 0

    def on_train_step_begin(self, run_context):
        if not self.inject:
            return
        done = run_context.original_args().cur_step_num - 1  # MindSpore already counts this step
        if done != self.args.fail_at_step:
            return
        log(f"injecting fault '{self.args.fail_mode}' on rank {self.rank} after step {done}")
        sys.stderr.flush()
        if self.args.fail_mode == "raise":
            raise RuntimeError(f"injected fault on rank {self.rank} after step {done}")
        if self.args.fail_mode == "exit":
            os._exit(EXIT_FAILED)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        step = cb_params.cur_step_num
        if self.args.log_every > 0 and (step % self.args.log_every == 0 or step == self.total):
            loss = float(np.asarray(cb_params.net_outputs.asnumpy()).reshape(-1)[0])
            log(f"epoch {cb_params.cur_epoch_num} step {step}/{self.total} loss {loss:.6f}")
        if self.args.step_time > 0:
            time.sleep(self.args.step_time)


# -- main ----------------------------------------------------------------------------------------
def setup(args):
    """Context and cluster; returns ``(rank, world)``, or None in the scheduler process."""
    graph = not args.pynative
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE, device_target=args.device_target)
    role = os.environ.get("MS_ROLE")
    if role == "MS_SCHED":
        # The scheduler serves the cluster inside init(), and MindSpore ends the process once every
        # worker has unregistered (exit 0) or timed out (exit 1). Nothing after init() runs.
        init()
        return None
    if not role:
        return 0, 1
    init()
    rank, world = get_rank(), get_group_size()
    if args.device_target == "CPU":
        take_over_group_info(world)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return rank, world


def leave(code):
    """Exit at once, skipping MindSpore's teardown. After SIGTERM the scheduler got the signal too,
    and the teardown would wait for it until the node timeout; everything is saved already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None):
    """Train, resuming and stopping as the environment asks; returns the exit code."""
    args = parse_args(argv)
    placement = setup(args)
    if placement is None:
        return 0
    rank, world = placement
    total = args.epochs * args.steps_per_epoch
    log(f"rank {rank}/{world} attempt {attempt_number()} pid {os.getpid()}")

    net = build_network(args.seed)
    optimizer = nn.Momentum(net.trainable_params(), args.lr, args.momentum)
    train_net = TrainStep(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    model = Model(train_net)

    done = 0
    path, how = resume_source(args, rank)
    if path:
        done = load_resume_checkpoint(train_net, path, how, args)
    else:
        log("starting from scratch")
    if done >= total:
        log(f"nothing to train: the checkpoint is at step {done} of {total}")
        log(f"final params sha256 {params_sha256(net)}")
        return 0

    data = ms.dataset.GeneratorDataset(RankBatches(args.seed, rank, args.steps_per_epoch, args.batch_size),
                                       ["x", "y"], shuffle=False)
    if done:
        data.set_init_step(done)  # global: skips done // steps-per-epoch epochs, then the rest

    rank_dir = os.path.join(args.ckpt_dir, f"rank_{rank}")
    gasp_allowed = os.environ.get(ENV_GASP_SAVE_ALLOWED, "1") != "0"
    config = CheckpointConfig(save_checkpoint_steps=args.save_steps, keep_checkpoint_max=args.keep_max,
                              crc_check=True,
                              append_info=["epoch_num", "step_num"], exception_save=gasp_allowed)
    checkpoints = ModelCheckpoint(prefix=args.prefix, directory=rank_dir, config=config)
    exit_cb = RankOnRequestExit(rank, args.exit_name, args.ckpt_dir, os.environ.get(ENV_GRACEFUL_EXIT_FILE))
    callbacks = [StartAt(done, checkpoints, args.save_steps), Progress(args, rank, total), exit_cb,
                 DyingGasp(exit_cb), checkpoints]

    started = time.monotonic()
    try:
        # callbacks= must be a keyword argument: exception_save looks for the ModelCheckpoint there.
        model.train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False,
                    initial_epoch=done // args.steps_per_epoch)
    except GaspRequested as gasp:
        saved = ("exception_save wrote the breakpoint" if gasp_allowed
                 else "no save (LAUNCHER_GASP_SAVE_ALLOWED=0)")
        log(f"dying gasp: signal {gasp.args[0]}, all ranks stopped after global step "
            f"{steps_done(optimizer)}; {saved} in {rank_dir}")
        leave(128 + gasp.args[0])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # OnRequestExit's handler would only set a flag
    steps, elapsed = steps_done(optimizer), time.monotonic() - started
    if exit_cb.stopped:
        log(f"graceful exit after global step {steps}: saved {exit_cb.train_name}.ckpt ({elapsed:.1f} s)")
        return 0
    log(f"trained {steps - done} steps in {elapsed:.1f} s")
    log(f"final params sha256 {params_sha256(net)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
