"""End to end: examples/pytorch/train.py under ``launcher run`` survives faults bit-identically.

A reference run without faults gives the final parameter hash. Two interrupted runs must end with
the same hash: one where rank 2 is SIGKILLed and the launcher restarts the group, one where the
launcher itself gets SIGTERM (dying gasp) and a second launch resumes from the breakpoints.
Four ranks on CPU with gloo; the step counts are small to keep the module well under a minute.
"""

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.helpers.launch import Launcher
from tests.helpers.procs import free_port

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "pytorch" / "train.py")
NPROC = 4
# 40 steps, checkpoints every 10, "epochs" of 10 steps: file names carry both numbers.
TRAIN_ARGS = ["--steps", "40", "--ckpt-every", "10", "--steps-per-epoch", "10", "--log-every", "5",
              "--step-time", "0.01"]
FINAL_HASH = re.compile(r"final sha256 ([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")

pytestmark = pytest.mark.slow


def start_launcher(tmp: Path, options=(), train_args=(), name: str = "") -> Launcher:
    """``launcher run`` with 4 ranks of the example, run dir and logs under ``tmp``, started."""
    job = Launcher(tmp, cwd=REPO, name=name)
    job.start(["--nproc-per-node", str(NPROC), "--master-port", str(free_port()), *options],
              command=[sys.executable, EXAMPLE, "--ckpt-dir", tmp / "ckpt", *TRAIN_ARGS, *train_args])
    return job


def run_launcher(tmp: Path, options=(), train_args=(), name: str = "") -> Launcher:
    """Run the launcher to completion."""
    job = start_launcher(tmp, options, train_args, name)
    job.wait(120)
    return job


def final_hash(proc: Launcher) -> str:
    """The ``final sha256`` rank 0 printed (the console shows every rank's output)."""
    found = FINAL_HASH.findall(proc.stdout)
    assert len(found) == 1, f"exit {proc.code}\n{proc.stdout}\n{proc.stderr}"
    return found[0]


def file_hash(path: Path) -> str:
    """The example's hash, recomputed from the final state_dict file it wrote."""
    import torch

    digest = hashlib.sha256()
    for tensor in torch.load(str(path), weights_only=True).values():
        digest.update(bytes(tensor.contiguous().view(torch.uint8).reshape(-1).tolist()))
    return digest.hexdigest()


def attempt_logs(tmp: Path) -> dict:
    """{attempt number: {rank: log text}} of the latest session."""
    session = tmp / "logs" / "latest"
    assert session.is_symlink(), f"no latest symlink in {tmp / 'logs'}"
    attempts = {}
    for attempt_dir in sorted(session.glob("attempt_*")):
        number = int(attempt_dir.name.split("_")[1])
        attempts[number] = {r: (attempt_dir / f"rank_{r}.log").read_text() for r in range(NPROC)}
    return attempts


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory) -> str:
    """The final hash of an uninterrupted run, launched the same way."""
    tmp = tmp_path_factory.mktemp("reference")
    proc = run_launcher(tmp)
    assert proc.code == 0, proc.stdout + proc.stderr
    digest = final_hash(proc)
    assert file_hash(tmp / "ckpt" / "final.pt") == digest
    return digest


def test_killed_rank_resumes_bit_identical(tmp_path, reference_hash):
    """Rank 2 SIGKILLed after step 20: the others save a breakpoint of step 20, the launcher
    restarts all four from it, and the result is bit-identical to the reference."""
    proc = run_launcher(tmp_path, ["--max-restarts", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                   "--dp", str(NPROC), "--heartbeat-timeout", "120"],
                        ["--fail-at-step", "20", "--fail-rank", "2", "--fail-mode", "kill"])
    assert proc.code == 0, proc.stdout + proc.stderr
    assert final_hash(proc) == reference_hash
    assert file_hash(tmp_path / "ckpt" / "final.pt") == reference_hash

    attempts = attempt_logs(tmp_path)
    assert sorted(attempts) == [0, 1]
    assert "injecting fault 'kill' on rank 2 at step 20" in attempts[0][2]
    for rank, text in attempts[1].items():
        resumed = RESUMED.findall(text)
        assert resumed, f"rank {rank} did not resume:\n{text}"
        # Nothing lost: the resume point is the breakpoint of the step the fault struck at.
        assert resumed[0][1] == "20" and resumed[0][0].endswith("_breakpoint.pt"), resumed
    # ... and it is the launcher's choice, read from its variables: the plan of attempt 1.
    plan = json.loads((tmp_path / "run" / "restore_plan.json").read_text())
    events = proc.events()
    planned = proc.events("restore_plan", attempt=1)
    assert planned and planned[0]["step"] == 20 and planned[0]["fault_ranks"] == [2]
    # The ranks beat their steps (launcher_heartbeat): attempt 0 got to step 20 and attempt 1 resumed
    # there, so the goodput knows that the breakpoint left no step to recompute (not "unknown").
    assert [(e["attempt"], e["step"]) for e in events if e["event"] == "step_last"][0] == (0, 20)
    assert "1 failure(s), 0 steps recomputed" in proc.stderr
    chosen = {RESUMED.findall(text)[0][0] for text in attempts[1].values()}
    assert chosen == set(plan["checkpoints"].values()) and len(chosen) == 1  # one replica's file
    # Every checkpoint was reported to the launcher's index (rankhooks/launcher_saves.py), with its size.
    saved = {f"{path.parent.name[5:]}.{path.stat().st_size}.{path.name}"
             for path in (tmp_path / "ckpt").glob("rank_*/ckpt-*.pt")}
    assert saved and {path.name for path in (tmp_path / "ckpt" / ".saves").iterdir()} == saved


def wait_for_progress(tmp: Path, pattern: str, proc: Launcher, timeout: float = 60):
    """Wait until every rank's log of attempt 0 contains ``pattern`` (test-side polling)."""
    deadline = time.monotonic() + timeout
    logs = [tmp / "logs" / "latest" / "attempt_0" / f"rank_{r}.log" for r in range(NPROC)]
    while time.monotonic() < deadline and proc.running():
        if all(log.exists() and pattern in log.read_text() for log in logs):
            return
        time.sleep(0.05)
    raise AssertionError(f"ranks never printed {pattern!r} (launcher exit {proc.proc.poll()})")


def test_sigterm_gasp_then_resume_bit_identical(tmp_path, reference_hash):
    """SIGTERM to the launcher mid-run: every rank saves a breakpoint of the same step; a new
    launch resumes from it and ends bit-identical to the reference."""
    first = tmp_path / "first"
    proc = start_launcher(first, [], ["--step-time", "0.05"], name="gasp-")
    wait_for_progress(first, "step 10/", proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    breakpoints = {r: sorted((first / "ckpt" / f"rank_{r}").glob("*_breakpoint.pt"))
                   for r in range(NPROC)}
    names = {r: [p.name for p in files] for r, files in breakpoints.items()}
    assert all(len(files) == 1 for files in names.values()), names
    assert len({files[0] for files in names.values()}) == 1, f"ranks stopped apart: {names}"

    again = run_launcher(first, ["--checkpoint-dir", str(first / "ckpt"), "--dp", str(NPROC)])
    assert again.code == 0, again.stdout + again.stderr
    resumed = RESUMED.findall(again.stdout)
    assert len(resumed) == NPROC and {os.path.basename(p) for p, _ in resumed} == {names[0][0]}
    assert final_hash(again) == reference_hash
