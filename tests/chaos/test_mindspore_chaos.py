"""Chaos, smaller, for MindSpore on CPU: ``examples/mindspore/train.py`` under
``launcher run --framework mindspore`` (dynamic cluster: the launcher starts the scheduler, rank -1,
and 2 workers) survives a SIGKILLed worker and a dying gasp, bit-identical to a fault-free run.

What MindSpore on CPU makes meaningful (examples/mindspore/README.md, "What MindSpore on CPU cannot
do here"): a worker blocked in a CPU collective ignores SIGTERM, so after a worker fault its peer is
SIGKILLed at ``--stop-timeout`` without a breakpoint and the job resumes from the newest periodic
checkpoint (up to ``--save-steps`` recomputed, not 0). The dying gasp is coordinated in the graph,
so after ``launcher prestop`` nothing is recomputed.
"""

import importlib.util
import random
import re
from pathlib import Path

import pytest

from tests.chaos.harness import (REPO, Attempt, ChaosJob, check_gasp_events, check_launch_events,
                                 check_no_survivors, measure)

# find_spec, not importorskip: importing MindSpore takes seconds, even for a deselected module.
if importlib.util.find_spec("mindspore") is None:
    pytest.skip("mindspore is not installed", allow_module_level=True)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

EXAMPLE = str(REPO / "examples" / "mindspore" / "train.py")
NPROC = 2
EPOCHS, STEPS_PER_EPOCH, SAVE_STEPS = 2, 10, 5
STEPS = EPOCHS * STEPS_PER_EPOCH
TRAIN_ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH), "--save-steps",
              str(SAVE_STEPS), "--log-every", "1", "--step-time", "0.05"]
# --stop-timeout 3: the peer of a dead worker cannot react to SIGTERM inside a CPU collective and
# is SIGKILLed at the deadline anyway; waiting the default 10 s would only cost suite time.
LAUNCHER_OPTS = ["--framework", "mindspore", "--dp", str(NPROC), "--max-restarts", "3", "--stop-timeout", "3"]
SEED = 6
KINDS = [("ms-worker-sigkill", 1), ("ms-prestop-gasp", 1)]
MS_NAME = re.compile(r"-(\d+)_(\d+)(_breakpoint)?\.ckpt$")


def _schedule():
    """(kind, run) -> (step, rank): steps in [4, 8] of 20, so that ``launcher prestop`` lands with
    12 steps (a few seconds) to spare."""
    rng = random.Random(SEED)
    return {(kind, run): (rng.randint(4, 8), rng.randrange(NPROC)) for kind, runs in KINDS
            for run in range(runs)}


SCHEDULE = _schedule()


def new_job(tmp: Path) -> ChaosJob:
    return ChaosJob(tmp, NPROC, EXAMPLE, TRAIN_ARGS, LAUNCHER_OPTS)


@pytest.fixture(scope="session")
def ms_reference_hash(tmp_path_factory) -> str:
    job = new_job(tmp_path_factory.mktemp("chaos-ms-reference"))
    launch = job.start()
    code = job.wait(launch, timeout=150)
    assert code == 0, job.output(launch)[-3000:]
    (attempt,) = job.attempts(launch)
    assert attempt.max_step() == STEPS
    hashes = {re.findall(r"final params sha256 ([0-9a-f]{64})", text)[-1] for text in attempt.logs.values()}
    assert len(hashes) == 1, attempt.logs
    assert not job.survivors()
    return hashes.pop()


def check_resumed(job: ChaosJob, launch, after: Attempt, expected_kind: str) -> int:
    """Every worker resumed from the planned kind of file at one global step, which matches the
    file's MindSpore name (<epoch>_<step in epoch>) and the plan's step; returns the global step."""
    plan = [e for e in job.events(launch) if e["event"] == "restore_plan" and e["attempt"] == after.number]
    assert len(plan) == 1 and plan[0]["kind"] == expected_kind, plan
    resumed = after.resumed()
    assert sorted(resumed) == list(range(NPROC)), f"not every rank resumed: {resumed}\n{after.logs}"
    steps = {step for _, step in resumed.values()}
    assert len(steps) == 1, resumed
    step = steps.pop()
    for path, _ in resumed.values():
        m = MS_NAME.search(path)
        assert m and bool(m.group(3)) == (expected_kind == "breakpoint"), path
        assert int(m.group(2)) == plan[0]["step"], (path, plan)
        assert (int(m.group(1)) - 1) * STEPS_PER_EPOCH + int(m.group(2)) == step, (path, step)
    return step


def test_ms_worker_sigkill(tmp_path, ms_reference_hash, chaos_record):
    """A worker SIGKILLed after step S: the launcher stops the rest (the peer by SIGKILL at the stop
    timeout), restarts scheduler and workers from the newest periodic checkpoint, same hash."""
    kind = "ms-worker-sigkill"
    step, rank = SCHEDULE[(kind, 0)]
    record = chaos_record("mindspore", kind, 0)
    record.fault, record.fault_step = f"worker {rank} kill after step {step}", step
    job = new_job(tmp_path)
    launch = job.start(["--fail-at-step", str(step), "--fail-rank", str(rank), "--fail-mode", "kill"])
    code = job.wait(launch, timeout=150)
    record.exit_codes = [code]
    attempts = job.attempts(launch)
    assert len(attempts) == 2, (code, job.output(launch)[-3000:])
    before, after = attempts
    exits = [e for e in job.events(launch) if e["event"] == "rank_exited" and e["attempt"] == 0]
    faulty = [e for e in exits if e["rank"] == rank]
    assert len(faulty) == 1, exits
    measure(record, before.max_step(), after, faulty[0]["exited_at"], ms_reference_hash, code)
    record.note = "peer SIGKILLed at --stop-timeout (blocked in a CPU collective): periodic restore"

    assert code == 0, job.output(launch)[-3000:]
    assert f"injecting fault 'kill' on rank {rank} after step {step}" in before.logs[rank]
    assert record.progress == step
    assert (faulty[0]["state"], faulty[0]["signal"], faulty[0]["returncode"]) == ("failed", "SIGKILL", -9)
    assert sorted(e["rank"] for e in exits) == [-1, *range(NPROC)], exits  # the scheduler too
    assert all(e["state"] == "stopped" for e in exits if e["rank"] != rank), exits
    resumed_at = check_resumed(job, launch, after, "periodic")
    assert resumed_at == step // SAVE_STEPS * SAVE_STEPS
    assert 0 <= record.steps_lost <= SAVE_STEPS
    assert {re.findall(r"final params sha256 (\w+)", t)[-1] for t in after.logs.values()} == {ms_reference_hash}
    check_launch_events(job, launch, 0)
    check_no_survivors(job)


def test_ms_prestop_gasp_then_fresh_launch(tmp_path, ms_reference_hash, chaos_record):
    """``launcher prestop``: the workers agree on a step in the graph, exception_save writes one
    breakpoint each, exit 143; a fresh launch resumes from them with 0 steps recomputed."""
    kind = "ms-prestop-gasp"
    step, _ = SCHEDULE[(kind, 0)]
    record = chaos_record("mindspore", kind, 0)
    record.fault, record.fault_step = f"prestop after step {step}", step
    job = new_job(tmp_path)
    first = job.start()
    job.wait_for_step(first, step, timeout=120)
    pre = job.prestop()
    code0 = job.wait(first)
    record.exit_codes = [code0]
    gasp_ts = check_gasp_events(job, first, pre)
    check_no_survivors(job)
    second = job.start()
    code1 = job.wait(second, timeout=150)
    record.exit_codes.append(code1)
    before, after = job.attempts(first)[-1], job.attempts(second)[0]
    measure(record, before.max_step(), after, gasp_ts, ms_reference_hash, code1,
            gap=second.started - first.ended_at)

    assert code0 == 143, job.output(first)[-3000:]
    check_launch_events(job, first, 143)
    names = {r: sorted(p.name for p in (job.ckpt_dir / f"rank_{r}").glob("*_breakpoint.ckpt"))
             for r in range(NPROC)}
    assert all(len(v) == 1 for v in names.values()) and len({v[0] for v in names.values()}) == 1, names
    assert code1 == 0, job.output(second)[-3000:]
    assert check_resumed(job, second, after, "breakpoint") == record.progress
    assert record.steps_lost == 0
    assert {re.findall(r"final params sha256 (\w+)", t)[-1] for t in after.logs.values()} == {ms_reference_hash}
    check_launch_events(job, second, 0)
    check_no_survivors(job)
