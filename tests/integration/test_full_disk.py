"""A full disk never kills a healthy job (issue 17, item 2).

Real small filesystems: a tmpfs of a few dozen KiB mounted for the test (needs mount privileges;
skipped with the reason where the sandbox refuses to mount). The ranks checkpoint to a different,
non-full directory, so the dying gasp can be checked end to end.
"""

import errno
import json
import os
import signal
import subprocess

import pytest

from tests.helpers.procs import wait_until

TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture
def small_fs(tmp_path):
    """``make(name, kib)``: a tmpfs of ``kib`` KiB at ``tmp_path/name``, unmounted after the test."""
    mounted = []

    def make(name: str, kib: int):
        path = tmp_path / name
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k,mode=0700", "tmpfs", str(path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.strip() or result.returncode}): "
                        "the full-disk tests need mount privileges (root or CAP_SYS_ADMIN)")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory):
    """Fill the filesystem of ``directory`` to the last byte (a filler file written until ENOSPC)."""
    fd = os.open(os.path.join(str(directory), "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    os.write(fd, b"x" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)


def assert_saved(launcher, ckpt, ranks):
    """Each rank of the last attempt (1) got the save signal once and wrote a complete checkpoint."""
    assert sorted(int(t[0]) for t in launcher.ready_lines(".term") if t[1] == "1") == ranks
    for rank in ranks:
        data = (ckpt / f"rank_{rank}.ckpt").read_bytes()
        assert data.endswith(b"END") and len(data) == 10 * 100000 + 3  # complete, loadable


def test_full_log_filesystem_restart_then_sigterm_saves_every_rank(launcher, small_fs, tmp_path):
    """Ranks print until the log fs is full, one fails and the group restarts, then SIGTERM: every rank
    saves, the exit code is the gasp's, one warning per rank's log file and no traceback."""
    launcher.log_dir = small_fs("logs", 128)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    lines = 20000  # ~0.7 MB per rank and attempt: far more than the 128 KiB log filesystem holds
    launcher.start(["--nproc-per-node", "2", "--max-restarts", "1", "--termination-grace-period", "30"],
                   ["--print-lines", str(lines), "--fail-rank", "1", "--exit-code", "3", "--term-delay", "0.5",
                    "--ckpt-dir", str(ckpt)])
    ready = launcher.wait_ready(4, timeout=60)  # attempt 0 (rank 1 fails) and attempt 1
    assert sorted((r[0], r[1]) for r in ready) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(30) == 143, launcher.stderr
    assert_saved(launcher, ckpt, [0, 1])
    err = launcher.stderr
    assert TRACEBACK not in err, err
    for rank in (0, 1):
        assert err.count(f"rank {rank}: cannot write its log file") == 1, err
    # The console kept everything the files could not take.
    out = launcher.stdout
    for rank in (0, 1):
        assert f"[rank {rank}] line {lines - 1} from rank {rank} attempt 1" in out
    assert any(e["event"] == "restart" for e in launcher.events())
    assert "ended" in json.loads((launcher.run_dir / "launcher.json").read_text())


def test_full_run_dir_filesystem_restart_then_sigterm_saves_every_rank(launcher, small_fs, tmp_path):
    """The run dir's filesystem fills up: the restart (state.json), the events, the gasp record and the
    final launcher.json cannot be written; each is reported once and the job still restarts, saves and
    ends with the gasp's exit code."""
    launcher.run_dir = small_fs("rundisk", 64) / "run"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    trigger = tmp_path / "fail-now"
    launcher.start(["--nproc-per-node", "2", "--max-restarts", "3", "--termination-grace-period", "30"],
                   ["--fail-rank", "1", "--exit-code", "3", "--fail-when", str(trigger), "--term-delay", "0.5",
                    "--ckpt-dir", str(ckpt)])
    launcher.wait_ready(2)
    assert wait_until(lambda: (launcher.run_dir / "state.json").exists(), 10)
    fill(launcher.run_dir)
    trigger.touch()
    launcher.wait_ready(4)  # restarted although state.json cannot be written
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(30) == 143, launcher.stderr
    assert_saved(launcher, ckpt, [0, 1])
    err = launcher.stderr
    assert TRACEBACK not in err, err
    assert err.count("cannot write") + err.count("cut short") >= 3, err  # state.json, events, launcher.json
    for what in ("state.json", "launcher.json", "events to"):
        assert err.count(what) == 1, (what, err)
    assert "cannot record the dying gasp" in err


def test_full_log_filesystem_failure_beyond_budget_exits_with_the_ranks_code(launcher, small_fs):
    launcher.log_dir = small_fs("logs", 64)
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "0"],
                        ["--print-lines", "20000", "--fail-rank", "1", "--exit-code", "3"], timeout=60)
    assert code == 3, launcher.stderr
    assert TRACEBACK not in launcher.stderr
    assert "[rank 1] rank 1 failing now" in launcher.stdout
    assert "ended" in json.loads((launcher.run_dir / "launcher.json").read_text())


@pytest.mark.parametrize("console_ranks", ["none", "0"])
def test_files_only_ranks_survive_a_full_log_filesystem(launcher, small_fs, console_ranks):
    """Ranks whose output goes only to their files (every rank with --console-ranks none, rank 1 with
    --console-ranks 0) print far more than the 64 KiB log filesystem holds: every rank lives on and
    exits 0, one warning per rank (issue 27, item 6). Before, such a rank wrote its file itself and
    died of ENOSPC in its own print (exit 1, a traceback in its log) while the console rank lived."""
    launcher.log_dir = small_fs("logs", 64)
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "0", "--console-ranks", console_ranks],
                        ["--print-lines", "20000", "--run", "0.2"], timeout=60)
    assert code == 0, launcher.stderr
    assert sorted(int(line[0]) for line in launcher.ready_lines()) == [0, 1]  # both printed it all
    err = launcher.stderr
    assert TRACEBACK not in err, err
    for rank in (0, 1):
        assert err.count(f"rank {rank}: cannot write its log file") == 1, err
    assert ("[rank 0] line 19999 from rank 0 attempt 0" in launcher.stdout) == (console_ranks == "0")
