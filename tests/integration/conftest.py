"""Helpers for integration tests that run the real ``launcher`` with real child processes."""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_RANK = str(REPO / "tests" / "workers" / "fake_rank.py")


class Launcher:
    """A ``launcher run`` subprocess with its run dir, log dir and captured output in ``tmp``."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.run_dir = tmp / "run"
        self.log_dir = tmp / "logs"
        self.ready = tmp / "ready"
        self.proc: Optional[subprocess.Popen] = None

    def argv(self, options: List[str], worker_args: List[str], worker: str = FAKE_RANK) -> List[str]:
        """Full command line: launcher options, then the worker with its arguments."""
        return [sys.executable, "-m", "launcher", "run", "--run-dir", str(self.run_dir),
                "--log-dir", str(self.log_dir), *options, "--", sys.executable, worker,
                "--ready-file", str(self.ready), *worker_args]

    def start(self, options: List[str], worker_args: List[str], **kwargs) -> subprocess.Popen:
        """Start the launcher in the background (output to files, never a pipe that could fill)."""
        self.out = open(self.tmp / "stdout.txt", "wb")
        self.err = open(self.tmp / "stderr.txt", "wb")
        self.proc = subprocess.Popen(self.argv(options, worker_args, **kwargs), stdout=self.out,
                                     stderr=self.err, cwd=str(self.tmp))
        return self.proc

    def run(self, options: List[str], worker_args: List[str], timeout: float = 60, **kwargs) -> int:
        """Run to completion; returns the exit code."""
        self.start(options, worker_args, **kwargs)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()
            self.err.close()

    @property
    def stdout(self) -> str:
        return (self.tmp / "stdout.txt").read_text()

    @property
    def stderr(self) -> str:
        return (self.tmp / "stderr.txt").read_text()

    def ready_lines(self, suffix: str = "") -> List[List[str]]:
        path = Path(str(self.ready) + suffix)
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def wait_ready(self, count: int, suffix: str = "", timeout: float = 30) -> List[List[str]]:
        """Wait until ``count`` ranks wrote their ready line (the test-side wait, no blind sleep)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.ready_lines(suffix)
            if len(lines) >= count:
                return lines
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"only {self.ready_lines(suffix)} ready; stderr:\n{self.stderr}")

    def events(self) -> List[dict]:
        from launcher.monitoring.events import read_events

        return read_events(str(self.run_dir / "events.jsonl"))


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    """A launcher runner whose files live in the test's tmp dir; killed if the test forgets it."""
    runner = Launcher(tmp_path)
    yield runner
    if runner.proc is not None and runner.proc.poll() is None:
        runner.proc.kill()
        runner.proc.wait()


os.environ.setdefault("PYTHONUNBUFFERED", "1")
