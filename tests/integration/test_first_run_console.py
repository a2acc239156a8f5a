"""What a new user sees on the launcher's stderr: the first start, a restart, Ctrl-C (real processes)."""

import signal


def _launcher_lines(err: str):
    return [line for line in err.splitlines() if line.startswith("[launcher")]


def test_first_start_without_checkpoints_is_said_calmly_and_a_restart_says_why_and_from_what(launcher):
    ckpt = launcher.tmp / "ckpt"  # not created: a job's first start
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1", "--checkpoint-dir", str(ckpt)],
                        ["--fail-rank", "1", "--exit-code", "3", "--run", "0.3"])
    assert code == 0, launcher.stderr
    lines = _launcher_lines(launcher.stderr)
    assert any(line.endswith(f" restore plan: starting from scratch (no checkpoints: {ckpt} does not exist yet)")
               for line in lines), lines
    warnings = [line for line in lines if line.startswith("[launcher WARNING]")]
    assert len(warnings) == 1 and "rank 1 failed (exit code 3)" in warnings[0], warnings
    assert [line.split(" ", 2)[2] for line in lines if " restarting (" in line] == [
        f"restarting (restart 1 of 1) after rank 1 failed (exit code 3); starting from scratch "
        f"(no checkpoints: {ckpt} does not exist yet)"]


def test_ctrl_c_says_a_second_one_kills_now(launcher):
    launcher.start(["--nproc-per-node", "2"], [])
    launcher.wait_ready(2)
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.wait(60) == 128 + signal.SIGINT
    assert any(line.endswith("Ctrl-C: stopping the ranks (up to 25 s to save and exit); Ctrl-C again to kill them "
                             "now") for line in _launcher_lines(launcher.stderr)), launcher.stderr
