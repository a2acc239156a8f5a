"""End to end: sharded training saved by torch.distributed.checkpoint resumes on 4, then 2, then 3 ranks.

Three ``launcher run``s of examples/pytorch/dcp_train.py (FSDP2 over gloo on CPU) share one checkpoint
directory: 4 ranks train to step 20, 2 ranks resume from step 20 and train to 30, 3 ranks resume from
step 30 and train to 40. After each load the full parameters rank 0 reports must equal the step
resharded offline (``dcp_to_torch_save``: the same step loaded by a world of one, no launcher); the
launcher's plan record and event must name the 4 -> 2 and 2 -> 3 conversions; and the loss of every
step after a resume must continue the curve of an uninterrupted 4-rank run (the global batch is split
evenly, so only the summation order differs: measured within 2e-7 relative).
"""

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.dcp import LOSS, RESUMED, check_conversion, check_loaded_equals_offline
from tests.helpers.launch import Launcher, events_in
from tests.helpers.procs import free_port

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "pytorch" / "dcp_train.py")

pytestmark = pytest.mark.slow


def launch(tmp: Path, name: str, nproc: int, ckpt: Path, steps: int, *train_args: str):
    """One ``launcher run`` of the example; the launcher, its run dir and rank 0's losses."""
    proc = Launcher(tmp / name, cwd=REPO)
    code = proc.run(["--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--checkpoint-dir", ckpt],
                    command=[sys.executable, EXAMPLE, "--ckpt-dir", ckpt, "--steps", str(steps), *train_args],
                    timeout=300)
    assert code == 0, f"{name}: exit {code}\n{proc.stdout}\n{proc.stderr}"
    losses = {int(step): float(loss) for step, loss in LOSS.findall(proc.stdout)}
    return proc, proc.run_dir, losses


def plan_event(run_dir: Path) -> dict:
    found = events_in(run_dir, "restore_plan")
    assert len(found) == 1, events_in(run_dir)
    return found[0]


def check_resume(tmp, proc, run_dir, name, step, saved, world):
    """The plan, the event, the console line and the loaded parameters of one resumed run."""
    ckpt = tmp / "ckpt"
    step_dir = ckpt / "dcp" / f"step-{step}"
    record = json.loads((run_dir / "restore_plan.json").read_text())
    assert (record["dcp_dir"], record["step"], record["saved_world_size"]) == (str(step_dir), step, saved)
    check_conversion(record["conversion"], step_dir, saved, world)
    assert plan_event(run_dir)["conversion"] == record["conversion"]
    assert f"resharding {saved} -> {world} ranks" in proc.stderr
    resumed = RESUMED.findall(proc.stdout)
    assert sorted(resumed) == [(str(step_dir), str(step), str(saved))] * world
    check_loaded_equals_offline(tmp / f"loaded_{name}.pt", step_dir, tmp / f"reference_{name}.pt")


def test_four_then_two_then_three_ranks(tmp_path):
    ckpt = tmp_path / "ckpt"
    _, _, reference = launch(tmp_path, "reference", 4, tmp_path / "ref_ckpt", 40)
    assert sorted(reference) == list(range(1, 41))

    proc, run_dir, losses = launch(tmp_path, "four", 4, ckpt, 20)
    assert json.loads((run_dir / "restore_plan.json").read_text())["kind"] == "none"
    assert losses == {s: reference[s] for s in range(1, 21)}  # same world, same arithmetic

    proc, run_dir, two = launch(tmp_path, "two", 2, ckpt, 30, "--dump-loaded", str(tmp_path / "loaded_two.pt"))
    check_resume(tmp_path, proc, run_dir, "two", 20, 4, 2)
    proc, run_dir, three = launch(tmp_path, "three", 3, ckpt, 40,
                                  "--dump-loaded", str(tmp_path / "loaded_three.pt"))
    check_resume(tmp_path, proc, run_dir, "three", 30, 2, 3)

    resumed = {**two, **three}
    assert sorted(resumed) == list(range(21, 41))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], rel=1e-5), step
