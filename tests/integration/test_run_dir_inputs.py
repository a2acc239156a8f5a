"""What a run dir may hold, through the real ``launcher status``, ``report`` and ``prestop`` (issue #27.2,
#27.3, #27.5): never a hang, a traceback or an unbounded read; writing never follows a planted symlink.

Every command runs under a subprocess timeout, so a hang fails the test instead of stalling the suite.
The run dirs are made as ``launcher run`` leaves them (tests.unit.monitoring.test_status.write_run_dir), then one
file is replaced by what someone could put there: a FIFO (``open`` blocked until a writer came, and
prestop blew through a preStop hook's grace period), a symlink to ``/dev/zero`` (read until memory ran
out), 100,000 nested brackets (RecursionError), random bytes (UnicodeDecodeError in ``report``), a
``[1, 2]`` line (AttributeError in ``goodput``), a 200 MB line (795 MB of memory in ``status``).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.common import rundir as rundir_mod
from tests.helpers.launch import cli, launcher_command
from tests.unit.monitoring.test_status import EVENTS, write_run_dir

HANG = 60  # seconds: far beyond any honest answer on a loaded machine
FILES = (rundir_mod.EVENTS, rundir_mod.STATE, rundir_mod.LAUNCHER)
HOSTILE = ("fifo", "dev-zero", "deep", "random-bytes", "list-line")


def plant(path: Path, kind: str) -> None:
    """Replace the file ``path`` with one of the HOSTILE kinds."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "deep":
        path.write_bytes(b"[" * 100000)
    elif kind == "random-bytes":
        path.write_bytes(bytes(range(256)) * 4)
    else:
        path.write_bytes(json.dumps(EVENTS[0]).encode() + b'\n[1, 2]\n{"event": "x", "ts": [1]}\n')


def launcher(*args: str, env=None) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = cli(*args, errors="replace", timeout=HANG, env=env)
    done.seconds = time.monotonic() - started
    return done


def no_traceback(done: subprocess.CompletedProcess, codes=(0,)) -> None:
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr, done.stderr
    assert done.returncode in codes, done.stderr


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("name", FILES)
def test_status_and_prestop_answer_whatever_a_file_holds(tmp_path, name, kind):
    run_dir = write_run_dir(tmp_path / "run", 2, 2 ** 22 + 1, EVENTS)
    plant(Path(run_dir) / name, kind)
    done = launcher("status", "--run-dir", run_dir)
    no_traceback(done)
    assert done.stdout.startswith("job run  died")
    doc = json.loads(launcher("status", "--run-dir", run_dir, "--json").stdout)
    if name == rundir_mod.EVENTS and kind in ("fifo", "dev-zero"):
        assert "not a regular file" in doc["events_unreadable"] or "symlink" in doc["events_unreadable"]
    elif name == rundir_mod.EVENTS:
        assert doc["events_skipped"] >= 1
    # No live launcher: prestop falls back to the recorded ranks (none alive) and ends at once; its
    # budget is the recorded gasp timeout (25 s by default), and a FIFO used to hold it forever.
    done = launcher("prestop", "--run-dir", run_dir)
    no_traceback(done)
    assert done.seconds < 25, done.seconds


@pytest.mark.parametrize("kind", HOSTILE)
def test_report_refuses_or_warns_whatever_the_events_file_holds(tmp_path, kind):
    run_dir = write_run_dir(tmp_path / "run", 2, 2 ** 22 + 1, EVENTS)
    plant(Path(run_dir) / rundir_mod.EVENTS, kind)
    done = launcher("report", run_dir)
    no_traceback(done, codes=(0, 1, 2))
    lines = done.stderr.splitlines()
    if kind in ("fifo", "dev-zero"):
        assert done.returncode == 2 and len(lines) == 1 and rundir_mod.EVENTS in lines[0], done.stderr
    elif kind == "list-line":  # the start event is drawn; the two lines that are not events, one warning
        assert done.returncode == 0 and lines == [f"launcher: warning: skipped 2 line(s) of "
                                                  f"{run_dir}/{rundir_mod.EVENTS} that are not launcher events"]
    else:
        assert done.returncode == 1 and "no events" in done.stderr


def test_status_reads_a_200_mb_line_in_bounded_memory(tmp_path):
    """The line is skipped while it is read, 1 MiB at a time (main: 795 MB)."""
    run_dir = write_run_dir(tmp_path / "run", 2, 2 ** 22 + 1, EVENTS)
    events = Path(run_dir) / rundir_mod.EVENTS
    good = events.read_bytes()
    with open(events, "wb") as fh:
        fh.write(b'{"event": "padding", "ts": 1, "pad": "')
        fh.truncate(200 * 1024 * 1024)  # sparse: zeros that cost no disk
        fh.seek(0, os.SEEK_END)
        fh.write(b'"}\n' + good)
    peak = max_rss_of(launcher_command("status", "--run-dir", run_dir))
    assert peak < 100 * 1024 * 1024, f"status peaked at {peak >> 20} MiB"
    doc = json.loads(launcher("status", "--run-dir", run_dir, "--json").stdout)
    assert doc["events_skipped"] == 1 and doc["attempt"] == 1


#: Spawns ``argv`` and prints its peak RSS in KiB: the measured process must be forked from this small
#: interpreter, not from pytest's worker (Linux keeps a process's peak RSS across exec, so a child
#: forked from a worker holding torch would report the worker's size).
_MEASURE = ("import os, subprocess, sys\n"
            "proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,"
            " stdin=subprocess.DEVNULL)\n"
            "_, status, usage = os.wait4(proc.pid, 0)\n"
            "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")


def max_rss_of(argv) -> int:
    """Peak resident memory (bytes) of the process ``argv``, measured by ``os.wait4`` on it alone."""
    try:
        done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail("launcher status hung")
    code, kib = map(int, done.stdout.split())
    assert code == 0, done.stderr
    return kib * 1024  # KiB on Linux


def test_report_never_follows_a_planted_timeline_symlink(tmp_path):
    """The run dir's owner plants ``timeline.html -> <a file of root's>``; root runs ``launcher report``
    (here: whoever runs the tests; as root the run dir is also given to another uid). The target
    stays as it was and ``timeline.html`` becomes a file of its own."""
    run_dir = Path(write_run_dir(tmp_path / "run", 2, 2 ** 22 + 1, EVENTS))
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    (run_dir / "timeline.html").symlink_to(victim)
    if os.geteuid() == 0:
        os.chown(run_dir, 65534, 65534)
    done = launcher("report", str(run_dir))
    no_traceback(done)
    assert victim.read_text() == "root:secret\n" and victim.stat().st_mode & 0o777 == 0o600
    page = run_dir / "timeline.html"
    assert not page.is_symlink() and page.read_text().startswith("<!DOCTYPE html>")


def test_run_refuses_a_planted_base_dir(tmp_path):
    """``$XDG_RUNTIME_DIR/launcher`` is a symlink someone else put there: refused with one line, never
    followed (main created the job's run dir where it pointed)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    (runtime / "launcher").symlink_to(elsewhere)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("LAUNCHER_RUN_DIR", None)
    done = launcher("run", "--job-name", "j", "--nproc-per-node", "1", "--", sys.executable, "-c", "pass", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"base dir {runtime}/launcher is a symlink: refused" in done.stderr
    assert list(elsewhere.iterdir()) == []
    for command in (["status"], ["prestop"], ["jobs"]):
        done = launcher(*command, env=env)
        assert done.returncode == 2 and "is a symlink: refused" in done.stderr, (command, done.stderr)
