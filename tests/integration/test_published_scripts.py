"""Published training scripts, run side by side under torchrun / msrun and under ``launcher run``.

The scripts live in tests/data/published/ with their licences and CPU edits (README there). Each case
runs the published command line under the real tool and, with only the program name changed, under
the launcher, then compares what a user switching tools would check: the exit status, the ranks'
environment (the variables both tools give each rank; tests/integration/test_side_by_side.py lists
them and why the others differ) and the output (the scripts' own lines; MindSpore's losses).

The ranks' environment is caught without touching the scripts: a ``sitecustomize`` on ``PYTHONPATH``
(which all three tools pass on) writes each rank's ``os.environ`` at interpreter start.

Lines the tests change, the same way for both tools: 2 processes (2 cores here), a free port instead
of a fixed one (tests run side by side), fewer epochs for multigpu_torchrun.py (50 10 -> 4 2). The
module takes 4-6 minutes on 2 loaded cores (eleven real-framework launches).
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from tests.helpers.launch import launcher_command
from tests.helpers.procs import free_port
from tests.integration.test_side_by_side import MSRUN_WORKER_EQUAL, TORCHRUN_EQUAL

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "tests" / "data" / "published"
BIN = Path(sys.executable).parent
TIMEOUT = 300

# Each test runs two real-framework jobs (plus a module fixture's): above the suite's 300 s default on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SITECUSTOMIZE = """
import json, os
if os.environ.get("RANK") is not None or os.environ.get("MS_ROLE"):
    with open(os.path.join(os.environ["PUBLISHED_ENV_DUMP"], f"{os.getpid()}.json"), "w") as fh:
        json.dump(dict(os.environ), fh)
"""


@dataclass
class Outcome:
    """One tool's run: exit status, everything the user could read, and each rank's environment."""

    code: int
    text: str
    envs: List[dict]
    logs: str = ""

    @property
    def ranks_output(self) -> str:
        """The ranks' lines once: msrun's worker logs (its console repeats them), else the console."""
        return self.logs or self.text

    def env_of(self, name: str, value: str) -> dict:
        found = [e for e in self.envs if e.get(name) == value]
        assert len(found) == 1, f"{len(found)} processes with {name}={value}"
        return found[0]


#: torch's own finalization abort: a gloo worker thread releasing its last finished work (whose saved
#: thread-local state holds a Python object) while the main thread is already in ``Py_FinalizeEx``
#: after ``destroy_process_group()``: taking the GIL then ends the thread, through a destructor that
#: may not throw, and the process aborts (``terminate called without an active exception``, exit 134).
#: It is torch's, under either tool: measured on this machine with pytorch/examples' ddp/example.py
#: (docs/fidelity.md, "A rank lost at the very end").
TEARDOWN_ABORT = "terminate called without an active exception"
#: How many times a job that only lost a rank to that abort is run.
RUNS_ON_ABORT = 3


def run_tool(tool: str, args: Sequence[str], cwd: Path, env: Dict[str, str] = None) -> Outcome:
    """``tool`` (torchrun, msrun or launcher) with ``args`` in ``cwd``; once more (in a fresh directory)
    when a rank died of torch's teardown race (:data:`TEARDOWN_ABORT`), under either tool."""
    pristine = cwd.with_name(cwd.name + "-pristine")  # what the run starts from, for a second run
    if cwd.exists():
        shutil.copytree(cwd, pristine)
    outcome = _run_tool_once(tool, args, cwd, env)
    for again in range(1, RUNS_ON_ABORT):
        if outcome.code == 0 or TEARDOWN_ABORT not in outcome.text:
            break
        print(f"{tool}: a rank aborted in torch's finalization; running again ({again + 1} of {RUNS_ON_ABORT})")
        fresh = cwd.with_name(f"{cwd.name}-{again}")
        if pristine.exists():
            shutil.copytree(pristine, fresh)
        outcome = _run_tool_once(tool, args, fresh, env)
    return outcome


def _run_tool_once(tool: str, args: Sequence[str], cwd: Path, env: Dict[str, str] = None) -> Outcome:
    cwd.mkdir(parents=True, exist_ok=True)
    dumps = cwd / "envs"
    dumps.mkdir()
    (dumps / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(dumps)] + ([str(REPO)] if tool == "launcher" else []))
    # The command lines are the published ones, run with the launcher's defaults (warm standbys included).
    full_env = {**os.environ, **(env or {}), "PUBLISHED_ENV_DUMP": str(dumps), "PYTHONPATH": path,
                "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", "")}
    argv = launcher_command("run", *args) if tool == "launcher" else [str(BIN / tool), *args]
    proc = subprocess.run(argv, cwd=str(cwd), env=full_env, capture_output=True, text=True, timeout=TIMEOUT)
    logs = "".join(p.read_text(errors="replace") for p in sorted(cwd.glob("msrun_log/*.log")))
    envs = [json.loads(p.read_text()) for p in sorted(dumps.glob("*.json"))]
    return Outcome(proc.returncode, proc.stdout + proc.stderr, envs, logs)


def same_variables(ref: dict, ours: dict, names: Sequence[str]) -> None:
    for name in names:
        assert ours.get(name) == ref.get(name), f"{name}: {ref.get(name)!r} under the tool, {ours.get(name)!r} here"


def lines(text: str, pattern: str) -> List[str]:
    """The matches of ``pattern`` anywhere in ``text`` (the launcher prefixes lines with ``[rank N] ``)."""
    return sorted(m.group(0) for m in re.finditer(pattern, text))


# ----------------------------------------------------------------------------- pytorch/examples ddp
DDP_DIR = PUBLISHED / "pytorch" / "ddp"
#: What example.py prints, without its pid: the env it initialises from, its group, its devices.
DDP_LINES = r"(Initializing process group with: \{[^}]*\}|world_size = \d, rank = \d, backend=\w+|" \
            r"rank = \d, world_size = \d, n = \d, device_ids = \[\])"


def ddp_line(endpoint: str) -> List[str]:
    """run_example.sh's line for 2 processes, with the endpoint given."""
    return ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", f"--rdzv_endpoint={endpoint}", "example.py"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def ddp_torchrun(tmp_path_factory):
    cwd = _copy(DDP_DIR, tmp_path_factory.mktemp("ddp") / "torchrun")
    port = free_port()
    return run_tool("torchrun", ddp_line(f"localhost:{port}"), cwd), port


def _ddp_lines(text: str) -> List[str]:
    return [re.sub(r"'MASTER_PORT': '\d+'", "'MASTER_PORT': <port>", line) for line in lines(text, DDP_LINES)]


def _compare_ddp(reference: Outcome, ours: Outcome, port: Optional[int]) -> None:
    """``port``: the one both were given, or None when each chose its own."""
    assert reference.code == 0, reference.text[-3000:]
    assert ours.code == 0, ours.text[-3000:]
    assert _ddp_lines(ours.text) == _ddp_lines(reference.text)
    assert len(_ddp_lines(ours.text)) == 6
    for rank in ("0", "1"):
        same_variables(reference.env_of("RANK", rank), ours.env_of("RANK", rank), (*TORCHRUN_EQUAL, "MASTER_ADDR"))
        assert ours.env_of("RANK", rank)["MASTER_PORT"] == str(port or ours.env_of("RANK", "0")["MASTER_PORT"])


def test_ddp_example_run_example_sh(ddp_torchrun, tmp_path):
    """``torchrun --nnodes=1 --nproc_per_node=2 --rdzv_id=101 --rdzv_endpoint=localhost:PORT example.py``."""
    reference, port = ddp_torchrun
    ours = run_tool("launcher", ddp_line(f"localhost:{port}"), _copy(DDP_DIR, tmp_path / "launcher"))
    _compare_ddp(reference, ours, port)


def test_ddp_example_with_torchruns_free_port_idiom(ddp_torchrun, tmp_path):
    """``--rdzv_endpoint=localhost:0``: torchrun's single-node idiom for a free port."""
    reference, _port = ddp_torchrun
    ours = run_tool("launcher", ddp_line("localhost:0"), _copy(DDP_DIR, tmp_path / "launcher"))
    _compare_ddp(reference, ours, None)


# ----------------------------------------------------------------------------- ddp-tutorial-series
SERIES_DIR = PUBLISHED / "pytorch" / "ddp-tutorial-series"
#: run_multigpu_torchrun.sh with 2 processes instead of "gpu" (no GPU here) and 4 epochs, a snapshot every 2.
SERIES_LINE = ["--standalone", "--nproc_per_node=2", "multigpu_torchrun.py", "4", "2"]
#: The file name stops before a ``[``: under torchrun the two ranks share one stdout, and a line of one
#: can run into the other's ("...saved at snapshot.pt[GPU1] Epoch 1 | ...", seen in CI).
SERIES_LINES = r"(\[GPU\d\] Epoch \d+ \| Batchsize: \d+ \| Steps: \d+|Epoch \d+ \| Training snapshot saved at [^\s\[]+)"


def test_multigpu_torchrun_standalone(tmp_path):
    reference = run_tool("torchrun", SERIES_LINE, _copy(SERIES_DIR, tmp_path / "torchrun"))
    ours = run_tool("launcher", SERIES_LINE, _copy(SERIES_DIR, tmp_path / "launcher"))
    assert reference.code == ours.code == 0, ours.text[-3000:]
    assert lines(ours.text, SERIES_LINES) == lines(reference.text, SERIES_LINES)
    assert len(lines(ours.text, SERIES_LINES)) == 2 * 4 + 2  # 4 epochs on 2 ranks, snapshots after 0 and 2
    for rank in ("0", "1"):
        same_variables(reference.env_of("RANK", rank), ours.env_of("RANK", rank), TORCHRUN_EQUAL)
    import torch

    for tool in ("torchrun", "launcher"):
        assert torch.load(tmp_path / tool / "snapshot.pt")["EPOCHS_RUN"] == 2


def test_nproc_per_node_gpu_without_a_gpu(tmp_path):
    """The published ``--nproc_per_node=gpu`` on a machine without CUDA: both refuse it; the launcher
    with exit 2 and one line saying what to pass, torchrun with exit 1 and a traceback."""
    line = ["--standalone", "--nproc_per_node=gpu", "multigpu_torchrun.py", "4", "2"]
    reference = run_tool("torchrun", line, _copy(SERIES_DIR, tmp_path / "torchrun"))
    ours = run_tool("launcher", line, _copy(SERIES_DIR, tmp_path / "launcher"))
    assert reference.code == 1 and "Cuda is not available" in reference.text
    assert ours.code == 2 and "Traceback" not in ours.text and "pass their number" in ours.text
    assert not ours.envs and not reference.envs


# ----------------------------------------------------------------------------- FSDP2
FSDP2_DIR = PUBLISHED / "pytorch" / "FSDP2"


def _final_model(cwd: Path) -> dict:
    """The model state dict train.py saved (checkpoints/dtensor_api/<ms>/model_state_dict.pt)."""
    import torch

    (path,) = cwd.glob("checkpoints/dtensor_api/*/model_state_dict.pt")
    return torch.load(path, weights_only=True)


def test_fsdp2_train_py(tmp_path):
    """The README's ``torchrun --nproc_per_node 2 train.py``: both save the same checkpoint layout.

    Not the same values: ``Transformer.reset_parameters`` does not reset its layers, so their weights are
    whatever ``to_empty`` left in memory (NaN after training here, under either tool)."""
    line = ["--nproc_per_node", "2", "train.py"]
    reference = run_tool("torchrun", line, _copy(FSDP2_DIR, tmp_path / "torchrun"))
    ours = run_tool("launcher", line, _copy(FSDP2_DIR, tmp_path / "launcher"))
    assert reference.code == 0, reference.text[-3000:]
    assert ours.code == 0, ours.text[-3000:]
    model_print = r"Transformer\([^\n]*|\(\d+\): TransformerBlock\("
    assert lines(ours.text, model_print) == lines(reference.text, model_print) != []  # rank 0 prints the model
    for rank in ("0", "1"):
        same_variables(reference.env_of("RANK", rank), ours.env_of("RANK", rank), TORCHRUN_EQUAL)
    theirs, mine = _final_model(tmp_path / "torchrun"), _final_model(tmp_path / "launcher")
    assert {k: (v.shape, v.dtype) for k, v in mine.items()} == {k: (v.shape, v.dtype) for k, v in theirs.items()}


# ----------------------------------------------------------------------------- MindSpore startup_method
MS_DIR = PUBLISHED / "mindspore" / "startup_method"
LOSS = r"epoch: \d+, step: \d+, loss is [\d.]+"


def fake_mnist(directory: Path, count: int = 256) -> None:
    """A deterministic MNIST-format training set (idx files) for ``ds.MnistDataset``."""
    import numpy as np

    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    (directory / "train-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, count, 28, 28) + images.tobytes())
    (directory / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, count) + labels.tobytes())


def msrun_line(port: int) -> List[str]:
    """msrun_single.sh's line for 2 workers on this machine."""
    return ["--worker_num=2", "--local_worker_num=2", f"--master_port={port}", "--log_dir=msrun_log", "--join=True",
            "--cluster_time_out=300", "net.py"]


@pytest.fixture(scope="module")
def net_msrun(tmp_path_factory):
    pytest.importorskip("mindspore")
    root = tmp_path_factory.mktemp("net")
    fake_mnist(root / "MNIST_Data" / "train")
    env = {"DATA_PATH": str(root / "MNIST_Data" / "train") + "/"}
    port = free_port()  # the launcher's runs reuse it: msrun has ended by then
    return run_tool("msrun", msrun_line(port), _copy(MS_DIR, root / "msrun"), env), env, port


def _rank_losses(outcome: Outcome) -> Dict[str, List[str]]:
    """Per worker, its loss lines: msrun's worker_N.log, or the launcher's ``[rank N]`` lines."""
    found: Dict[str, List[str]] = {}
    for match in re.finditer(rf"(?:\[rank (\d)\] )?({LOSS})", outcome.ranks_output):
        found.setdefault(match.group(1) or "?", []).append(match.group(2))
    return found


def _compare_net(reference: Outcome, ours: Outcome) -> None:
    assert reference.code == 0, reference.text[-3000:] + reference.logs[-3000:]
    assert ours.code == 0, ours.text[-3000:]
    assert len(lines(reference.ranks_output, LOSS)) == 20  # 10 epochs x 2 workers, one line per epoch
    assert lines(ours.ranks_output, LOSS) == lines(reference.ranks_output, LOSS)  # identical losses
    for worker in ("0", "1"):
        same_variables(reference.env_of("MS_NODE_ID", worker), ours.env_of("MS_NODE_ID", worker), MSRUN_WORKER_EQUAL)
    assert ours.env_of("MS_ROLE", "MS_SCHED")["MS_SCHED_PORT"] == ours.env_of("MS_NODE_ID", "0")["MS_SCHED_PORT"]


def test_mindspore_net_py_in_the_launchers_spelling(net_msrun, tmp_path):
    """The same job in the launcher's own words while msrun's are refused: identical losses per worker."""
    reference, env, port = net_msrun
    ours = run_tool("launcher", ["--framework", "mindspore", "--nproc-per-node", "2", "--master-port",
                                 str(port), "--log-dir", "launcher_log", "net.py"],
                    _copy(MS_DIR, tmp_path / "launcher"), {**env, "MS_TOPO_TIMEOUT": "300"})  # --cluster_time_out=300
    _compare_net(reference, ours)
    assert set(_rank_losses(ours)) == {"0", "1"}


def test_mindspore_msrun_single_sh(net_msrun, tmp_path):
    """msrun_single.sh's line with ``msrun`` replaced by ``launcher run``."""
    reference, env, port = net_msrun
    ours = run_tool("launcher", msrun_line(port), _copy(MS_DIR, tmp_path / "launcher"), env)
    _compare_net(reference, ours)
