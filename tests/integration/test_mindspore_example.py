"""End to end: examples/mindspore/train.py under ``launcher run --framework mindspore`` on CPU.

Each launch starts the MindSpore dynamic-cluster scheduler plus two workers and costs 10-20 s of
start-up on a small machine, so the module runs five launches (about 1.5-2 minutes):

* a reference run without faults gives the final parameter hash;
* ``launcher exit``: OnRequestExit writes ``rank_<id>/<name>_train.ckpt`` on every rank, exit 0;
* an injected crash of one rank with ``--max-restarts 1 --group-info-root``: the ranks write
  group_info.pb (one replica group), and the restarted ranks resume from the launcher's restore plan,
  the failed rank from its healthy replica's checkpoint, bit-identical to the reference;
* ``launcher prestop``: the dying gasp writes one breakpoint checkpoint per rank, all of the same
  step (exception_save); a second launch plans from those breakpoints and the group_info.pb files
  (RESTORE_RANKS, RESTORE_RANKS_MAP) and ends bit-identical to the reference.
"""

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from tests.helpers.launch import Launcher, cli
from tests.helpers.procs import free_port

# find_spec, not importorskip: importing MindSpore takes seconds and would slow down collection
# even when the slow tests are deselected.
if importlib.util.find_spec("mindspore") is None:
    pytest.skip("mindspore is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "mindspore" / "train.py")
NPROC = 2
# 2 epochs of 10 steps, periodic checkpoints every 5 steps: the file names carry epoch and step.
TRAIN_ARGS = ["--epochs", "2", "--steps-per-epoch", "10", "--save-steps", "5", "--log-every", "5"]
FINAL_HASH = re.compile(r"final params sha256 ([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from (\S+) \[launcher plan: kind=(\w+) source_rank=(\d+) step=(\d+)\] "
                     r"at global step (\d+)")
LAUNCH_TIMEOUT = 150  # one launch, generous: a whole run takes 10-45 s


class Launch(Launcher):
    """One ``launcher run`` of the example, started in the background; its files live under ``tmp``
    (killed at the end of the test if still running, by the harness)."""

    def __init__(self, tmp: Path, ckpt: Path, options: Sequence[str] = (), train_args: Sequence[str] = ()):
        super().__init__(tmp, merge_output=True)
        self.ckpt = ckpt
        self.start(["--framework", "mindspore", "--nproc-per-node", str(NPROC), "--master-port", str(free_port()),
                    *options], command=[sys.executable, EXAMPLE, "--ckpt-dir", ckpt, *TRAIN_ARGS, *train_args])

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> int:
        return super().wait(timeout)

    def explain(self) -> str:
        """Launcher exit code and console output, for assertion messages."""
        return f"launcher exit {self.proc.poll()}\n{self.output[-6000:]}"

    def rank_logs(self, attempt: int) -> Dict[int, str]:
        """{rank: log text} of one attempt of the latest session."""
        folder = self.log_dir / "latest" / f"attempt_{attempt}"
        return {r: (folder / f"rank_{r}.log").read_text(errors="replace") for r in range(NPROC)}

    def attempts(self) -> List[int]:
        return sorted(int(p.name.split("_")[1]) for p in (self.log_dir / "latest").glob("attempt_*"))

    def wait_for_files(self, name: str, timeout: float = 90) -> None:
        """Wait until every rank wrote ``rank_<r>/<name>`` (test-side polling: training is on)."""
        deadline = time.monotonic() + timeout
        paths = [self.ckpt / f"rank_{r}" / name for r in range(NPROC)]
        while time.monotonic() < deadline and self.running():
            if all(p.exists() for p in paths):
                return
            time.sleep(0.05)
        raise AssertionError(f"not every rank wrote {name}\n{self.explain()}")


def control(command: str, run_dir: Path) -> subprocess.CompletedProcess:
    """``launcher exit`` / ``launcher prestop`` against a running launcher."""
    return cli(command, "--run-dir", run_dir, timeout=90)


def final_hashes(logs: Dict[int, str]) -> Dict[int, Optional[str]]:
    found = {r: FINAL_HASH.findall(text) for r, text in logs.items()}
    return {r: hashes[-1] if hashes else None for r, hashes in found.items()}


def ms_name(global_step: int, steps_per_epoch: int = 10) -> str:
    """MindSpore's ``<epoch>_<step within the epoch>`` for a global step (both 1-based)."""
    return f"{(global_step - 1) // steps_per_epoch + 1}_{(global_step - 1) % steps_per_epoch + 1}"


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory) -> str:
    """The final parameter hash of an uninterrupted run, launched the same way."""
    tmp = tmp_path_factory.mktemp("reference")
    launch = Launch(tmp, tmp / "ckpt", [], [])
    try:
        assert launch.wait() == 0, launch.explain()
    finally:
        launch.kill()  # a module fixture's launch: the end of a test does not stop it
    hashes = final_hashes(launch.rank_logs(0))
    assert None not in hashes.values() and len(set(hashes.values())) == 1, hashes  # replicas agree
    return hashes[0]


def test_launcher_exit_writes_train_ckpt_on_every_rank(tmp_path):
    """``launcher exit`` mid-run: OnRequestExit's agreement stops both ranks after the same step,
    each writes rank_<id>/ms_train.ckpt, and the launcher exits 0 without restarting."""
    launch = Launch(tmp_path, tmp_path / "ckpt", [], ["--epochs", "8", "--step-time", "0.2"])
    launch.wait_for_files("ms-1_5.ckpt")
    result = control("exit", launch.run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert launch.wait() == 0, launch.explain()

    logs = launch.rank_logs(0)
    stopped = {r: re.findall(r"graceful exit after global step (\d+)", text) for r, text in logs.items()}
    assert all(len(steps) == 1 for steps in stopped.values()), launch.explain()
    steps = {int(found[0]) for found in stopped.values()}
    assert len(steps) == 1, f"ranks stopped at different steps: {stopped}"
    step = steps.pop()
    assert 5 <= step < 80, step
    for rank in range(NPROC):
        rank_dir = tmp_path / "ckpt" / f"rank_{rank}"
        train_ckpt = rank_dir / "ms_train.ckpt"
        assert train_ckpt.is_file() and train_ckpt.stat().st_size > 0, sorted(rank_dir.iterdir())
        # ModelCheckpoint's end-of-training save: the name the launcher's restore planner resumes from.
        assert (rank_dir / f"ms-{ms_name(step)}.ckpt").is_file(), sorted(rank_dir.iterdir())
    assert launch.attempts() == [0]
    assert [e["reason"] for e in launch.events("job_end")] == ["graceful-exit"]


def group_info_lists(root: Path) -> Dict[int, tuple]:
    """{rank: ckpt_restore_rank_list} of every ``device<r>/group_info.pb`` under ``root``."""
    from launcher.restore.groupinfo import parse_restore_rank_list

    return {r: parse_restore_rank_list((root / f"device{r}" / "group_info.pb").read_bytes())
            for r in range(NPROC)}


def latest_plan(launch: Launch) -> dict:
    return json.loads((launch.run_dir / "restore_plan.json").read_text(encoding="utf-8"))


def test_crashed_rank_restarts_and_resumes_bit_identical(tmp_path, reference_hash):
    """Rank 1 raises after step 7: the launcher stops rank 0 (stuck in the all-reduce), plans the
    restore from the checkpoints, restarts both, and the run ends bit-identical to the reference.
    With --group-info-root the ranks write group_info.pb (one replica group {0, 1}), so the failed
    rank 1 resumes from healthy rank 0's periodic checkpoint."""
    ckpt, group_info = tmp_path / "ckpt", tmp_path / "group_info"
    launch = Launch(tmp_path, ckpt,
                      ["--max-restarts", "1", "--stop-timeout", "2", "--checkpoint-dir", str(ckpt),
                       "--group-info-root", str(group_info)],
                      ["--fail-at-step", "7", "--fail-rank", "1", "--fail-mode", "raise"])
    assert launch.wait() == 0, launch.explain()
    assert launch.attempts() == [0, 1]
    first = launch.rank_logs(0)
    assert "injecting fault 'raise' on rank 1 after step 7" in first[1]
    # exception_save caught the injected exception: the failing rank wrote a breakpoint.
    assert list((ckpt / "rank_1").glob("ms-1_*_breakpoint.ckpt")), sorted((ckpt / "rank_1").iterdir())

    assert group_info_lists(group_info) == {r: tuple(range(NPROC)) for r in range(NPROC)}

    second = launch.rank_logs(1)
    for rank, text in second.items():
        resumed = RESUMED.findall(text)
        assert resumed, f"rank {rank} did not resume from the launcher's plan:\n{text}"
        # Rank 1's breakpoint is a fault rank's and rank 0 has none (SIGKILLed in the all-reduce), so
        # the only state the group can resume from is step 5's periodic checkpoint, and the failed
        # rank takes its healthy replica's file.
        assert resumed[0] == (str(ckpt / "rank_0" / "ms-1_5.ckpt"), "periodic", "0", "5", "5"), resumed
    assert final_hashes(second) == {r: reference_hash for r in range(NPROC)}
    plans = launch.events("restore_plan")
    assert [p["attempt"] for p in plans] == [0, 1] and plans[1]["kind"] == "periodic", plans
    assert plans[1]["fault_ranks"] == [1], plans
    # The planner saw the group: rank 1's breakpoint alone could not stand in for the whole group.
    assert [w for w in plans[1]["warnings"] if "replica groups {0,1} have no healthy rank with a breakpoint"
            in w], plans[1]["warnings"]
    plan = latest_plan(launch)
    assert plan["groups"] == [[0, 1]] and "group_info.pb" in plan["groups_source"], plan


def test_prestop_gasp_writes_breakpoints_then_resume_bit_identical(tmp_path, reference_hash):
    """``launcher prestop``: SIGTERM to every rank; they agree on a step, exception_save writes one
    breakpoint per rank of that step, exit 143. A second launch with --checkpoint-dir resumes from
    rank 0's breakpoint: the group_info.pb files of the first launch make {0, 1} one replica group,
    so RESTORE_RANKS=0 and RESTORE_RANKS_MAP={"0,1":0}, and it ends bit-identical to the reference."""
    ckpt, group_info = tmp_path / "ckpt", tmp_path / "group_info"
    launch = Launch(tmp_path / "first", ckpt, ["--group-info-root", str(group_info)],
                      ["--step-time", "0.5"])
    launch.wait_for_files("ms-1_5.ckpt")
    result = control("prestop", launch.run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(NPROC):
        assert f"rank {rank}: exited with code 143" in result.stdout, result.stdout
    assert launch.wait() == 143, launch.explain()

    logs = launch.rank_logs(0)
    stopped = {r: re.findall(r"dying gasp: signal 15, all ranks stopped after global step (\d+)", text)
               for r, text in logs.items()}
    steps = {int(found[0]) for found in stopped.values() if len(found) == 1}
    assert len(steps) == 1 and all(stopped.values()), f"{stopped}\n{launch.explain()}"
    step = steps.pop()
    assert 5 <= step < 20, step
    for rank in range(NPROC):
        rank_dir = ckpt / f"rank_{rank}"
        assert [p.name for p in rank_dir.glob("*_breakpoint.ckpt")] == [f"ms-{ms_name(step)}_breakpoint.ckpt"]
        assert not (rank_dir / "ms_train.ckpt").exists()  # the gasp writes the breakpoint only

    again = Launch(tmp_path / "again", ckpt,
                     ["--checkpoint-dir", str(ckpt), "--group-info-root", str(group_info)])
    assert again.wait() == 0, again.explain()
    plan = latest_plan(again)
    assert (plan["kind"], plan["restore_ranks"], plan["restore_ranks_map"], plan["groups"]) == (
        "breakpoint", [0], {"0,1": 0}, [[0, 1]]), plan
    second = again.rank_logs(0)
    for rank, text in second.items():
        resumed = RESUMED.findall(text)
        assert resumed, f"rank {rank} did not resume from the launcher's plan:\n{text}"
        path, kind, source, _step, global_step = resumed[0]
        assert (path, kind, source, global_step) == (
            str(ckpt / "rank_0" / f"ms-{ms_name(step)}_breakpoint.ckpt"), "breakpoint", "0", str(step)), resumed
        # The example checks the vendor variables against the launcher's choice (exit 2 otherwise).
        assert f'restore ranks 0 map {{"0,1":0}}: rank {rank} loads rank 0\'s breakpoint' in text, text
    assert final_hashes(second) == {r: reference_hash for r in range(NPROC)}
