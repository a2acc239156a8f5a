"""A torchrun command line works after changing the program name: the real torchrun and
``launcher run`` on the same gloo script, same arguments, compared line by line.

torchrun shows rank output as is; the launcher prefixes it with ``[rank N]``. torch itself prefixes an
uncaught exception's traceback with ``[rankN]:`` (its excepthook); under the launcher that prefix is
said once, not twice.
"""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import launcher_command

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "gloo_rank.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
_OURS = re.compile(r"^\[rank (\d+)\] (.*)$")
_TORCHS = re.compile(r"^\[rank(\d+)\]: (.*)$")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TORCHELASTIC_", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(tmp_path: Path, program, *script_args, options=("--standalone", "--nproc_per_node=2")):
    """Run ``program OPTIONS gloo_rank.py --lr 1 ARGS`` in a directory holding a copy of the script."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / SCRIPT).write_text((REPO / "tests" / "workers" / SCRIPT).read_text())
    argv = [*program, *options, SCRIPT, "--lr", "1", *script_args]
    return subprocess.run(argv, cwd=str(work), env=_env(), capture_output=True, text=True, timeout=120)


def launcher(tmp_path):
    return launcher_command("run", "--run-dir", str(tmp_path / "run"))


def rank_lines(text: str, prefix: re.Pattern):
    """``{rank: [line, ...]}`` of the prefixed lines, in order."""
    found = {}
    for line in text.splitlines():
        match = prefix.match(line)
        if match:
            found.setdefault(int(match.group(1)), []).append(match.group(2))
    return found


@pytest.fixture(scope="module", autouse=True)
def _needs_torchrun():
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed next to this interpreter")


def test_same_command_line_same_ranks(tmp_path):
    theirs = run(tmp_path, [str(TORCHRUN)])
    ours = run(tmp_path, launcher(tmp_path))
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    expected = sorted(line for line in theirs.stdout.splitlines() if line.startswith("rank "))
    assert expected == [f"rank {r}/2 sum 1 argv ['--lr', '1'] local_rank {r}" for r in range(2)]
    shown = rank_lines(ours.stdout, _OURS)
    assert sorted(line for lines in shown.values() for line in lines) == expected


def test_a_rank_traceback_is_prefixed_once(tmp_path):
    theirs = run(tmp_path, [str(TORCHRUN)], "--raise-on", "1")
    ours = run(tmp_path, launcher(tmp_path), "--raise-on", "1")
    assert theirs.returncode == ours.returncode == 1
    their_traceback = rank_lines(theirs.stderr + theirs.stdout, _TORCHS)[1]
    our_lines = rank_lines(ours.stdout, _OURS)[1]
    assert their_traceback[-1] == "RuntimeError: injected failure on rank 1"
    assert our_lines[-len(their_traceback):] == their_traceback  # same text, one prefix
    assert "[rank1]:" not in ours.stdout


def test_static_rendezvous_options_give_the_ranks_the_same_variables(tmp_path):
    """--rdzv-endpoint / --rdzv-id / --max_restarts as torchrun's static setup hands them to the ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = ("--rdzv-backend", "static", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job7",
               "--max_restarts", "2", "--nproc_per_node", "2")
    shown = ("--print-env", "MASTER_ADDR,MASTER_PORT,TORCHELASTIC_RUN_ID,TORCHELASTIC_MAX_RESTARTS,WORLD_SIZE")
    theirs = run(tmp_path, [str(TORCHRUN)], *shown, options=options)
    ours = run(tmp_path, launcher(tmp_path), *shown, options=options)
    assert theirs.returncode == ours.returncode == 0, theirs.stderr + ours.stderr
    expected = sorted(line for line in theirs.stdout.splitlines() if line.startswith("env "))
    assert expected == [f"env {r} 127.0.0.1 {port} job7 2 2" for r in range(2)]
    assert sorted(line for lines in rank_lines(ours.stdout, _OURS).values() for line in lines
                  if line.startswith("env ")) == expected


def test_published_single_node_line_with_logging_options(tmp_path):
    """A line from published scripts: c10d on ``localhost:0`` (a free port), a role, tee and a console
    filter, a monitor interval and start method. Both tools run it; rank 0 alone on the console, the
    role in ROLE_NAME, and each rank's output in a file."""
    options = ("--rdzv-backend=c10d", "--rdzv_endpoint=localhost:0", "--nproc_per_node=2", "--role", "trainer",
               "--tee", "3", "--local-ranks-filter", "0", "--monitor_interval", "1", "--start-method", "spawn",
               "--log-dir", "LOGS")
    shown = ("--print-env", "MASTER_ADDR,ROLE_NAME,ROLE_RANK,WORLD_SIZE")
    theirs = run(tmp_path / "t", [str(TORCHRUN)], *shown, options=options)
    ours = run(tmp_path / "o", launcher(tmp_path), *shown, options=options)
    assert theirs.returncode == ours.returncode == 0, theirs.stderr + ours.stderr
    # torchrun prefixes teed lines with [trainer0]:; only local rank 0's reach the console
    their_lines = sorted(re.sub(r"^\[trainer0\]:", "", line) for line in theirs.stdout.splitlines()
                         if line.startswith("[trainer"))
    assert their_lines == ["env 0 localhost trainer 0 2", "rank 0/2 sum 1 argv ['--lr', '1', '--print-env', "
                           "'MASTER_ADDR,ROLE_NAME,ROLE_RANK,WORLD_SIZE'] local_rank 0"]
    assert sorted(line for lines in rank_lines(ours.stdout, _OURS).values() for line in lines) == their_lines
    assert set(rank_lines(ours.stdout, _OURS)) == {0}
    # every rank's output is in a file under both (torchrun: LOGS/<run>/attempt_0/<local>/stdout.log)
    their_files = sorted((tmp_path / "t" / "work" / "LOGS").rglob("stdout.log"))
    # (the warm standbys' own logs, standby/rank_N.log, are not the ranks' output)
    our_files = sorted(p for p in (tmp_path / "o" / "work" / "LOGS").rglob("rank_*.log") if p.parent.name != "standby")
    assert len(their_files) == len(our_files) == 2
    assert "rank 1/2 sum 1" in their_files[1].read_text() and "rank 1/2 sum 1" in our_files[1].read_text()
    assert "--monitor-interval is torchrun's" in ours.stderr and "--start-method is torchrun's" in ours.stderr


def test_ranks_get_the_signals_the_launcher_handles(tmp_path):
    """torchrun exports TORCHELASTIC_SIGNALS_TO_HANDLE into its agent's environment, which ranks inherit;
    the launcher names the signals it stops the job on (torchrun's without SIGQUIT)."""
    options = ("--standalone", "--nproc_per_node=1")
    shown = ("--print-env", "TORCHELASTIC_SIGNALS_TO_HANDLE")
    theirs = run(tmp_path / "t", [str(TORCHRUN)], *shown, options=options)
    ours = run(tmp_path / "o", launcher(tmp_path), *shown, options=options)
    assert "env 0 SIGTERM,SIGINT,SIGHUP,SIGQUIT" in theirs.stdout
    assert "[rank 0] env 0 SIGTERM,SIGINT,SIGHUP" in ours.stdout.splitlines()


def test_the_ddp_example_line_runs_unchanged(tmp_path):
    """pytorch/examples distributed/ddp/run_example.sh: ``torchrun --nnodes=1 --nproc_per_node=N --rdzv_id=101
    --rdzv_endpoint="localhost:5972" example.py`` (default backend: static), on a free port instead of 5972."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = ("--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", f"--rdzv_endpoint=localhost:{port}")
    shown = ("--print-env", "MASTER_ADDR,MASTER_PORT,TORCHELASTIC_RUN_ID")
    theirs = run(tmp_path / "t", [str(TORCHRUN)], *shown, options=options)
    ours = run(tmp_path / "o", launcher(tmp_path), *shown, options=options)
    assert theirs.returncode == ours.returncode == 0, theirs.stderr + ours.stderr
    expected = sorted(line for line in theirs.stdout.splitlines() if line.startswith(("env ", "rank ")))
    assert expected[0] == f"env 0 localhost {port} 101"
    assert sorted(line for lines in rank_lines(ours.stdout, _OURS).values() for line in lines) == expected
