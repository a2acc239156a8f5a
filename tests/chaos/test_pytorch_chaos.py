"""Chaos: the PyTorch example under ``launcher run`` survives faults at random steps, losing nothing.

Every run uses the launcher as the README's Quick start does (``--checkpoint-dir``, ``--dp 4``,
``--max-restarts 3``: the launcher plans each resume) on a 4-rank gloo job of 200 steps with a
periodic checkpoint every 20, and must end bit-identical to a fault-free reference run. The fault
steps and ranks come from ``random.Random(SEED)``, drawn in a fixed order at import, so every
CI run injects the same faults whatever subset of tests is selected. See docs/chaos.md.
"""

import os
import random
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos.damage import flip_bit_in_tensor_data, planned_files, truncate
from tests.chaos.harness import (REPO, Attempt, ChaosJob, check_gasp_events, check_launch_events,
                                 check_no_survivors, measure, wait_until)

pytest.importorskip("torch")

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

EXAMPLE = str(REPO / "examples" / "pytorch" / "train.py")
NPROC = 4
STEPS, CKPT_EVERY = 200, 20
TRAIN_ARGS = ["--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY), "--log-every", "1",
              "--step-time", "0"]
LAUNCHER_OPTS = ["--dp", str(NPROC), "--max-restarts", "3"]
SEED = 6  # issue 6

#: (fault kind, runs) that draw a step and a rank. Draw order is fixed: a kind added at the end
#: keeps the others' steps. The damaged-checkpoint kinds reuse a stopped job (see ``stop_job``):
#: truncated-breakpoint and bitflip-breakpoint the prestop-gasp one, truncated-periodic the
#: launcher-sigkill one, so each stop is run once for three and two tests.
KINDS = [("rank-sigkill", 1), ("rank-exit-1", 1), ("rank-sigsegv", 1), ("prestop-gasp", 1),
         ("launcher-sigkill", 1)]
FAIL_MODE = {"rank-sigkill": "kill", "rank-exit-1": "exit", "rank-sigsegv": "segv"}


def _schedule():
    """(kind, run) -> (step, rank). Rank faults anywhere in [10, 190]; stops the test triggers
    while the job runs in [30, 120]: past the first periodic checkpoint, and 80 steps (a few
    seconds) before the end, so a slow ``launcher prestop`` on a loaded machine still lands."""
    rng = random.Random(SEED)
    plan = {}
    for kind, runs in KINDS:
        for run in range(runs):
            low, high = (10, 190) if kind in FAIL_MODE else (30, 120)
            step, rank = rng.randint(low, high), rng.randrange(NPROC)
            if kind == "launcher-sigkill":
                # 5-12 steps past a periodic checkpoint: the SIGKILL (a few steps after the ranks
                # pass the step) lands between saves, so every rank holds the newest periodic step
                # that truncated-periodic damages.
                step = step - step % CKPT_EVERY + 5 + step % 8
            plan[(kind, run)] = (step, rank)
    return plan


SCHEDULE = _schedule()


def new_job(tmp: Path) -> ChaosJob:
    return ChaosJob(tmp, NPROC, EXAMPLE, TRAIN_ARGS, LAUNCHER_OPTS)


@pytest.fixture(scope="session")
def reference_hash(tmp_path_factory) -> str:
    """The final parameter hash of a fault-free run launched the same way."""
    job = new_job(tmp_path_factory.mktemp("chaos-reference"))
    launch = job.start()
    code = job.wait(launch)
    assert code == 0, job.output(launch)[-3000:]
    attempts = job.attempts(launch)
    assert len(attempts) == 1 and attempts[0].max_step() == STEPS
    digest = attempts[0].final_hash()
    assert digest, job.output(launch)[-3000:]
    assert not job.survivors()
    return digest


# -- checks -------------------------------------------------------------------------------
def check_resumed(job: ChaosJob, launch, after: Attempt, expected_kind):
    """Every rank of ``after`` resumed from the step its restore plan chose (of ``expected_kind``,
    a kind or a tuple of acceptable kinds); returns that step."""
    plans = [e for e in job.events(launch) if e["event"] == "restore_plan" and e["attempt"] == after.number]
    assert len(plans) == 1, plans
    plan = plans[0]
    kinds = (expected_kind,) if isinstance(expected_kind, str) else tuple(expected_kind)
    assert plan["kind"] in kinds, plan
    resumed = after.resumed()
    assert sorted(resumed) == list(range(NPROC)), f"not every rank resumed: {resumed}\n{after.logs}"
    assert {step for _, step in resumed.values()} == {plan["step"]}, (plan, resumed)
    breakpoint = plan["kind"] == "breakpoint"
    assert all(path.endswith("_breakpoint.pt") == breakpoint for path, _ in resumed.values()), resumed
    return plan["step"]


def breakpoint_steps(job: ChaosJob):
    """rank -> sorted steps of its breakpoint files."""
    pattern = re.compile(r"ckpt-\d+_(\d+)_breakpoint\.pt$")
    return {r: sorted(int(m.group(1)) for p in (job.ckpt_dir / f"rank_{r}").glob("*_breakpoint.pt")
                      if (m := pattern.search(p.name)))
            for r in range(NPROC)}


# -- rank faults: the launcher restarts the group ----------------------------------------------
@pytest.mark.parametrize("kind,run", [(k, i) for k, n in KINDS if k in FAIL_MODE for i in range(n)])
def test_rank_fault(kind, run, tmp_path, reference_hash, chaos_record):
    """A rank SIGKILLed / exiting 1 / SIGSEGV at step S: the survivors save a breakpoint of S, the
    launcher restarts all four from it, nothing is recomputed, the result is bit-identical."""
    step, rank = SCHEDULE[(kind, run)]
    mode = FAIL_MODE[kind]
    record = chaos_record("pytorch", kind, run)
    record.fault, record.fault_step = f"rank {rank} {mode} at step {step}", step
    job = new_job(tmp_path)
    launch = job.start(["--fail-at-step", str(step), "--fail-rank", str(rank), "--fail-mode", mode])
    code = job.wait(launch)
    record.exit_codes = [code]
    attempts = job.attempts(launch)
    assert len(attempts) == 2, (code, job.output(launch)[-3000:])
    before, after = attempts
    exits = [e for e in job.events(launch) if e["event"] == "rank_exited" and e["attempt"] == 0]
    faulty = [e for e in exits if e["rank"] == rank]
    assert len(faulty) == 1, exits
    measure(record, before.max_step(), after, faulty[0]["exited_at"], reference_hash, code)

    assert code == 0, job.output(launch)[-3000:]
    assert after.final_hash() == reference_hash
    assert f"injecting fault '{mode}' on rank {rank} at step {step}" in before.logs[rank]
    assert record.progress == step, "a rank got past the faulty one"
    # The fault as recorded: the faulty rank's own exit, the others stopped after saving (143).
    expected = {"kill": ("SIGKILL", -9), "segv": ("SIGSEGV", -11), "exit": (None, 1)}[mode]
    assert (faulty[0]["state"], faulty[0]["signal"], faulty[0]["returncode"]) == ("failed", *expected), faulty
    survivors = sorted((e["rank"], e["state"], e["exit_code"]) for e in exits if e["rank"] != rank)
    assert survivors == [(r, "stopped", 143) for r in range(NPROC) if r != rank], exits
    restarts = [e for e in job.events(launch) if e["event"] == "restart"]
    assert [(e["attempt"], e["after_rank"]) for e in restarts] == [(1, rank)], restarts
    resumed_at = check_resumed(job, launch, after, "breakpoint")
    plan = next(e for e in job.events(launch) if e["event"] == "restore_plan" and e["attempt"] == 1)
    assert plan["fault_ranks"] == [rank], plan
    assert rank not in plan["restore_ranks"], plan
    assert resumed_at == step and record.steps_lost == 0
    check_launch_events(job, launch, 0)
    check_no_survivors(job)


# -- a job stopped mid-run, started again by a fresh launcher on the same directories -------------
@dataclass
class Stopped:
    """A job stopped mid-run by ``launcher prestop`` or by SIGKILL of its launcher. Its run dir and
    checkpoint dir are kept as a snapshot: each test copies them and starts a fresh launcher there."""

    how: str
    step: int             # the step every rank had passed when the test struck
    snapshot: Path        # holds run/ and ckpt/ as the first launcher left them
    progress: int         # the highest step any rank completed
    fault_time: float     # the gasp event / the SIGKILL
    ended_at: float       # the first launcher's exit
    exit_code: int


def stop_job(tmp: Path, how: str, step: int) -> Stopped:
    """Run until every rank passed ``step``, then stop the job ``how``; check that stop."""
    job = new_job(tmp)
    first = job.start()
    job.wait_for_step(first, step)
    if how == "prestop":
        pre = job.prestop()
        code = job.wait(first)
        assert code == 143, job.output(first)[-3000:]
        fault_time = check_gasp_events(job, first, pre)
    else:
        code = job.sigkill(first)
        assert code == -9
        fault_time = first.killed_at
    check_no_survivors(job)  # the ranks are gone before anything restarts
    check_launch_events(job, first, 143 if how == "prestop" else None)
    progress = job.attempts(first)[-1].max_step()
    saved = breakpoint_steps(job)
    if how == "prestop":  # every rank saved a breakpoint of the same, last completed step
        assert all(steps == [progress] for steps in saved.values()), (saved, progress)
    else:  # a SIGKILLed rank cannot save anything
        assert not any(saved.values()), saved
    return Stopped(how, step, tmp, progress, fault_time, first.ended_at, code)


@pytest.fixture(scope="module")
def gasped(tmp_path_factory) -> Stopped:
    """The job stopped by ``launcher prestop`` (shared by the gasp and damaged-breakpoint runs)."""
    return stop_job(tmp_path_factory.mktemp("chaos-gasped"), "prestop", SCHEDULE[("prestop-gasp", 0)][0])


@pytest.fixture(scope="module")
def launcher_killed(tmp_path_factory) -> Stopped:
    """The job whose launcher was SIGKILLed (shared by the launcher-sigkill and periodic runs)."""
    return stop_job(tmp_path_factory.mktemp("chaos-killed"), "sigkill", SCHEDULE[("launcher-sigkill", 0)][0])


def adopt(stopped: Stopped, tmp: Path) -> ChaosJob:
    """A job on a copy of the stopped job's run dir and checkpoint dir."""
    job = new_job(tmp)
    job.adopt_dirs(stopped.snapshot)
    return job


def restart(stopped: Stopped, job: ChaosJob, record, reference: str):
    """Start a fresh launcher on the job's directories and wait for it; measures into ``record``
    (times exclude the gap between the first launcher's exit and the second one's start)."""
    launch = job.start()
    code = job.wait(launch)
    record.exit_codes = [stopped.exit_code, code]
    attempts = job.attempts(launch)
    measure(record, stopped.progress, attempts[-1], stopped.fault_time, reference, code,
            gap=launch.started - stopped.ended_at)
    return launch, code, attempts


def test_prestop_gasp_then_fresh_launch(gasped, tmp_path, reference_hash, chaos_record):
    """``launcher prestop`` mid-run: all ranks saved a breakpoint of the same step and the launcher
    exited 143 (checked in ``stop_job``); a new ``launcher run`` resumes every rank from it with 0
    steps recomputed and ends bit-identical."""
    record = chaos_record("pytorch", "prestop-gasp", 0)
    record.fault, record.fault_step = f"prestop after step {gasped.step}", gasped.step
    job = adopt(gasped, tmp_path)
    launch, code, attempts = restart(gasped, job, record, reference_hash)

    assert code == 0, job.output(launch)[-3000:]
    assert len(attempts) == 1
    assert check_resumed(job, launch, attempts[0], "breakpoint") == gasped.progress
    assert record.steps_lost == 0
    assert attempts[0].final_hash() == reference_hash
    check_launch_events(job, launch, 0)
    check_no_survivors(job)


def test_launcher_sigkill_then_fresh_launch(launcher_killed, tmp_path, reference_hash, chaos_record):
    """SIGKILL to the launcher: its ranks die with it (no breakpoint is possible); a new launcher
    on the same directories resumes from the newest periodic checkpoint (<= 20 steps recomputed)."""
    record = chaos_record("pytorch", "launcher-sigkill", 0)
    record.fault, record.fault_step = f"launcher SIGKILL after step {launcher_killed.step}", launcher_killed.step
    job = adopt(launcher_killed, tmp_path)
    launch, code, attempts = restart(launcher_killed, job, record, reference_hash)

    assert code == 0, job.output(launch)[-3000:]
    assert len(attempts) == 1
    resumed_at = check_resumed(job, launch, attempts[0], "periodic")
    progress = launcher_killed.progress
    # The newest multiple of 20, or the one before when the SIGKILL struck mid-save.
    assert resumed_at in (progress // CKPT_EVERY * CKPT_EVERY, (progress - 1) // CKPT_EVERY * CKPT_EVERY)
    assert 0 <= record.steps_lost <= CKPT_EVERY
    assert attempts[0].final_hash() == reference_hash
    check_launch_events(job, launch, 0, after_unclean=True)
    check_no_survivors(job)


# -- a damaged newest checkpoint between a stop and the next start -------------------------------


@pytest.mark.parametrize("kind", ["truncated-breakpoint", "truncated-periodic", "bitflip-breakpoint"])
def test_damaged_checkpoint_then_fresh_launch(kind, request, tmp_path, reference_hash, chaos_record):
    """After a stop (the gasp; the launcher's SIGKILL for the periodic case), damage the file the
    restore plan would pick for rank 0, start again: the launcher must not hand any rank a file it
    cannot prove intact; the job resumes from an intact replica or older step, bit-identical."""
    stopped = request.getfixturevalue("launcher_killed" if kind == "truncated-periodic" else "gasped")
    record = chaos_record("pytorch", kind, 0)
    record.fault, record.fault_step = f"{stopped.how} after step {stopped.step}", stopped.step
    job = adopt(stopped, tmp_path)
    # Preconditions fail with pytest.fail: a broken set-up is reported as such, not as a finding.
    plan_kind, plan_step, files = planned_files(job.ckpt_dir, NPROC, NPROC)
    if plan_kind != ("periodic" if kind == "truncated-periodic" else "breakpoint") or 0 not in files:
        pytest.fail(f"unexpected plan before the damage: {plan_kind} at {plan_step}, files {files}")
    victim = Path(files[0])  # rank 0: the source of a breakpoint plan, its own file in a periodic one
    if kind.startswith("truncated"):
        old, new = truncate(victim)
        how = f"{old} -> {new} B"
    else:
        offset, size = flip_bit_in_tensor_data(victim)
        how = f"1 bit at byte {offset}, size {size} B kept"
    record.fault += f"; {victim.parent.name}/{victim.name} damaged ({how})"
    launch, code, attempts = restart(stopped, job, record, reference_hash)
    loaded = [f"attempt {a.number} rank {r}" for a in attempts for r, text in a.logs.items()
              if str(victim) in text]
    if loaded:
        record.note = f"damaged file handed to {', '.join(loaded)}"
    if len(attempts) > 1:
        record.note += f"; {len(attempts)} attempts"

    assert not loaded, f"the restore plan handed out the damaged {victim}: {loaded}"
    assert code == 0, job.output(launch)[-3000:]
    assert len(attempts) == 1, "a rank failed on its resume checkpoint"
    # A damaged breakpoint copy is replaced by an intact replica's (majority size, sha256 sidecar);
    # a damaged periodic file by a replica's or an older step.
    check_resumed(job, launch, attempts[0], ("breakpoint", "periodic"))
    assert 0 <= record.steps_lost <= CKPT_EVERY
    assert attempts[0].final_hash() == reference_hash
    check_launch_events(job, launch, 0, after_unclean=kind == "truncated-periodic")  # SIGKILLed before
    check_no_survivors(job)


# -- the same fault with warm standby ranks (--preload torch) -------------------------------------
def test_rank_sigkill_with_preload(tmp_path, reference_hash, chaos_record):
    """``--preload torch,torch._dynamo`` (the example's optimizer imports torch._dynamo lazily, in the
    resume's path): once every rank's standby imported them, SIGKILL one rank; the four ranks of the
    restart are the standbys (no interpreter start, no imports), resume from the breakpoint the
    survivors saved, and end bit-identical to the fault-free reference."""
    record = chaos_record("pytorch", "rank-sigkill-preload", 0)
    step, rank = SCHEDULE[("rank-sigkill", 0)]
    job = new_job(tmp_path)
    # A 50 ms step leaves the standbys time to import torch before the job would end by itself.
    launch = job.start(["--step-time", "0.05"], ["--preload", "torch,torch._dynamo"])
    ready = lambda: len([e for e in job.events(launch) if e["event"] == "standby_ready"]) >= NPROC
    assert wait_until(lambda: ready() or launch.proc.poll() is not None, 120), job.output(launch)[-3000:]
    assert ready(), job.output(launch)[-3000:]
    job.wait_for_step(launch, step)
    victim = job.attempts(launch)[0].pids[rank]
    fault_time = time.time()
    os.kill(victim, signal.SIGKILL)
    record.fault = f"rank {rank} SIGKILL (by the test) once the standbys were ready, at step >= {step}"
    code = job.wait(launch)
    record.exit_codes = [code]
    attempts = job.attempts(launch)
    assert len(attempts) == 2, (code, job.output(launch)[-3000:])
    before, after = attempts
    record.fault_step = before.max_step()
    measure(record, before.max_step(), after, fault_time, reference_hash, code)
    assert code == 0, job.output(launch)[-3000:]
    started = [e for e in job.events(launch) if e["event"] == "standby_start"]
    assert [e["ranks"] for e in started] == [list(range(NPROC))], started  # every rank from a standby
    assert after.final_hash() == reference_hash
    resumed_at = check_resumed(job, launch, after, "breakpoint")
    assert record.steps_lost == 0 and resumed_at == record.progress
    check_launch_events(job, launch, 0)
    check_no_survivors(job)
