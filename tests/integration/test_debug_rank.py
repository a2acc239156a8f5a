"""Debugging a rank from the terminal: ``--debug-rank``, the ``breakpoint()`` hint, ``--pdb``.

The launcher runs on a pseudo-terminal (pexpect), as in a user's shell: the test types pdb commands
and Ctrl-C the way a user would.
"""

import os
from pathlib import Path

import pytest

from tests.helpers.launch import cli, launcher_command

pexpect = pytest.importorskip("pexpect")

REPO = Path(__file__).resolve().parents[2]
WORKER = str(REPO / "tests" / "workers" / "debug_rank.py")
GLOO_WORKER = str(REPO / "tests" / "workers" / "gloo_breakpoint.py")
PROMPT = r"\(Pdb\) "
BREAK_LINE = next(n for n, line in enumerate(Path(WORKER).read_text().splitlines(), 1) if line.strip() == "breakpoint()")


def launcher_argv(tmp: Path, options, worker=WORKER, worker_args=()):
    """torchrun's style: the script right after the options, without ``python`` nor ``--``."""
    return ["run", "--run-dir", str(tmp / "run"), "--log-dir", str(tmp / "logs"), *options, worker, *worker_args]


def spawn(tmp: Path, options, worker_args=(), worker=WORKER, timeout=60):
    """The launcher on a pseudo-terminal; everything it shows is kept in ``child.seen``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    program, *args = launcher_command(*launcher_argv(tmp, options, worker, worker_args))
    child = pexpect.spawn(program, args, cwd=str(tmp),
                          env=env, encoding="utf-8", timeout=timeout, dimensions=(50, 250))
    child.logfile_read = _Transcript()
    return child


class _Transcript:
    def __init__(self):
        self.text = ""

    def write(self, data):
        self.text += data

    def flush(self):
        pass


def run_without_terminal(tmp: Path, options, worker_args=(), worker=WORKER, timeout=60):
    """The launcher with stdin /dev/null and captured output, to its end."""
    return cli(*launcher_argv(tmp, options, worker, worker_args), cwd=tmp, env={**os.environ, "PYTHONPATH": str(REPO)},
               timeout=timeout)


def print_then(child, expression, value, command) -> int:
    """At the pdb prompt: ``p expression`` must show ``value``; then ``command``. Returns the job's exit status."""
    child.sendline(f"p {expression}")
    child.expect(rf"\r\n{value}\r\n")
    child.expect(PROMPT)
    child.sendline(command)
    return finish(child)


def finish(child) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def rank_logs(tmp: Path):
    attempt = next((tmp / "logs").glob("*/attempt_0"))
    return {int(p.stem.split("_")[1]): p.read_text() for p in attempt.glob("rank_*.log")}


def test_breakpoint_in_rank_1_of_4_step_print_continue(tmp_path):
    hold = tmp_path / "hold"
    child = spawn(tmp_path, ["--nproc-per-node", "4", "--debug-rank", "1"],
                  ["--break-rank", "1", "--hold", str(hold)])
    child.expect(PROMPT)
    child.sendline("n")
    child.expect(PROMPT)
    assert print_then(child, "x", 42, "c") == 0, child.logfile_read.text
    seen = child.logfile_read.text
    assert "rank 1 x is 42" in seen and "[rank 1]" not in seen  # unprefixed, on the terminal
    logs = rank_logs(tmp_path)
    for rank in (0, 2, 3):
        assert f"rank {rank} says hello" in logs[rank] and f"rank {rank} done" in logs[rank]
        assert f"[rank {rank}] rank {rank} done" in seen
    assert "has the launcher's terminal" in logs[1] and "says hello" not in logs[1]


def test_ctrl_c_at_the_prompt_goes_to_the_debugger_not_the_job(tmp_path):
    hold = tmp_path / "hold"
    child = spawn(tmp_path, ["--nproc-per-node", "2", "--debug-rank", "1"],
                  ["--break-rank", "1", "--hold", str(hold)])
    child.expect(PROMPT)
    child.sendintr()
    child.expect("--KeyboardInterrupt--")
    child.expect(PROMPT)
    assert print_then(child, "x", 41, "c") == 0, child.logfile_read.text
    assert "Ctrl-C passed to rank 1" in child.logfile_read.text
    assert "rank 0 done" in rank_logs(tmp_path)[0]  # the other rank was never stopped


def test_a_failure_elsewhere_does_not_stop_the_debugged_rank(tmp_path):
    trigger = tmp_path / "trigger"
    # --stop-timeout 0: any signal or deadline for rank 1 would end the pdb session at once.
    child = spawn(tmp_path, ["--nproc-per-node", "4", "--debug-rank", "1", "--stop-timeout", "0"],
                  ["--break-rank", "1", "--raise-rank", "3", "--raise-when", str(trigger),
                   "--hold", str(tmp_path / "never")])
    child.expect(PROMPT)
    trigger.touch()
    child.expect("rank 1 holds the terminal")
    assert print_then(child, "x", 41, "c") == 1, child.logfile_read.text
    seen = child.logfile_read.text
    assert "rank 1 x is 42" in seen
    assert "first failure of the last attempt was rank 3" in seen


def test_breakpoint_without_debug_rank_prints_a_hint_and_carries_on(tmp_path):
    result = run_without_terminal(tmp_path, ["--nproc-per-node", "2"], ["--break-rank", "1"])
    assert result.returncode == 0, result.stderr
    hints = [line for line in result.stdout.splitlines() if "breakpoint()" in line]
    assert hints == [f"[rank 1] breakpoint() at debug_rank.py:{BREAK_LINE} skipped: ranks have no terminal; run "
                     "the launcher with --debug-rank 1 to debug rank 1 here"]
    assert "BdbQuit" not in result.stdout + result.stderr and "rank 1 x is 42" in result.stdout


def test_pdb_post_mortem_of_the_rank_that_raises(tmp_path):
    # A run dir too long for a unix socket path: the rank connects through the directory's fd.
    run_dir = tmp_path / ("r" * 100)
    child = spawn(tmp_path, ["--nproc-per-node", "4", "--pdb", "--run-dir", str(run_dir)],
                  ["--raise-rank", "2", "--hold", str(tmp_path / "never")])
    child.expect("rank 2 raised; post-mortem debugger")
    child.expect(PROMPT)
    child.sendintr()  # goes to the rank in post-mortem, not to the job
    child.expect("--KeyboardInterrupt--")
    child.expect(PROMPT)
    assert print_then(child, "x", 7, "q") == 1, child.logfile_read.text
    seen = child.logfile_read.text
    assert "first failure of the last attempt was rank 2" in seen
    assert "ValueError: rank 2 broke with x=7" in rank_logs(tmp_path)[2]
    assert "launcher_rankhooks" not in rank_logs(tmp_path)[2]  # the wrapper's frames are not shown
    assert "runpy" not in rank_logs(tmp_path)[2]


@pytest.mark.slow
def test_torch_distributed_breakpoint_with_gloo(tmp_path):
    child = spawn(tmp_path, ["--nproc-per-node", "2", "--master-port", "29631", "--debug-rank", "1"],
                  worker=GLOO_WORKER, timeout=120)
    child.expect(PROMPT)
    child.sendline("up")
    child.expect(PROMPT)
    assert print_then(child, "secret", 1001, "c") == 0, child.logfile_read.text
    assert "rank 1 after the breakpoint: sum 1 secret 1001" in child.logfile_read.text
    assert "rank 0 after the breakpoint: sum 1" in rank_logs(tmp_path)[0]


@pytest.mark.slow
def test_torch_distributed_breakpoint_without_debug_rank_says_what_to_do(tmp_path):
    # torch's breakpoint opens /dev/stdin itself (no PYTHONBREAKPOINT): the rank without a terminal
    # reads end-of-file, and the root cause says how to give it one.
    result = run_without_terminal(tmp_path, ["--nproc-per-node", "2", "--master-port", "29632"], ["--rank", "1"],
                                  GLOO_WORKER, timeout=120)
    assert result.returncode == 1
    assert ("rank 1 stopped at a debugger without a terminal (bdb.BdbQuit): run with --debug-rank 1 to debug it "
            "here") in result.stderr


def test_pdb_without_a_terminal_says_so_and_the_failure_proceeds(tmp_path):
    result = run_without_terminal(tmp_path, ["--nproc-per-node", "2", "--pdb"], ["--raise-rank", "1"])
    assert result.returncode == 1
    assert "[rank 1] post-mortem debugger not started: the launcher has no terminal" in result.stdout
    assert "first failure of the last attempt was rank 1" in result.stderr


def test_terminal_modes_are_put_back_when_the_debugged_rank_dies_at_its_prompt(tmp_path):
    import json
    import signal
    import termios

    def line_mode():
        lflag = termios.tcgetattr(child.child_fd)[3]
        return bool(lflag & termios.ECHO), bool(lflag & termios.ICANON)

    child = spawn(tmp_path, ["--nproc-per-node", "2", "--debug-rank", "1"],
                  ["--break-rank", "1", "--hold", str(tmp_path / "never")])
    child.expect(PROMPT)
    assert line_mode() == (False, False)  # pdb's line editor (readline) has the terminal raw
    ranks = json.loads((tmp_path / "run" / "state.json").read_text())["ranks"]
    os.kill(next(r["pid"] for r in ranks if r["rank"] == 1), signal.SIGKILL)
    child.expect(pexpect.EOF)
    assert line_mode() == (True, True)
    child.close()
    assert child.exitstatus == 128 + signal.SIGKILL
