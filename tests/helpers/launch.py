"""The one harness that runs the ``launcher`` command for the tests, as a user would run it.

- :func:`cli` runs one command to its end (``status``, ``prestop``, ``exit``, ``report``, ``run
  --dry-run`` ...) and returns the ``CompletedProcess`` (text output); a command that outlives its
  timeout fails the test, never stalls the suite.
- :class:`Launcher` is one ``launcher run`` in the background: its run dir, log dir and ready file
  under a directory of the test's, its output in files (never a pipe that could fill and stall it),
  the ready lines the tiny workers write (``tests/workers/fake_rank.py``), and the events it recorded,
  read by the launcher's own bounded reader (:func:`events_in`).
- Every ``Launcher`` started during a test is SIGKILLed when the test ends if it still runs (the
  autouse fixture in ``tests/conftest.py`` calls :func:`kill_started_since`); its ranks die with it
  (parent-death signal, orphan guard), and that fixture then checks nothing was left behind. One
  started while a module-scoped fixture is set up is the fixture's to stop (it is killed at exit).
"""

import atexit
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Union

import pytest

from tests.helpers.paths import REPO

#: The tiny rank most tests run: it writes a ready line, then does what its options say.
FAKE_RANK = str(REPO / "tests" / "workers" / "fake_rank.py")

PathLike = Union[str, os.PathLike]

#: Every Launcher started, in order (see :func:`kill_started_since`).
_started: List["Launcher"] = []


def launcher_command(*args: str) -> List[str]:
    """``launcher ARGS`` as a command line, run by the Python that runs the tests."""
    return [sys.executable, "-m", "launcher", *args]


def cli(*args: PathLike, timeout: float = 60, env: Optional[dict] = None, cwd: Optional[PathLike] = None,
        errors: Optional[str] = None) -> subprocess.CompletedProcess:
    """``launcher ARGS`` to its end (stdin ``/dev/null``, output captured as text).

    Args:
        timeout: Seconds it may take; longer is a failure (a hang), reported as such.
        env: Its whole environment (default: this process's).
        cwd: Its working directory (default: this process's).
        errors: How undecodable output is decoded (``"replace"`` for commands fed hostile input).
    """
    argv = launcher_command(*map(str, args))
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors=errors, timeout=timeout, env=env,
                              cwd=None if cwd is None else str(cwd), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"launcher {' '.join(argv[3:])} did not end within {timeout} s")


def events_in(run_dir: PathLike, name: Optional[str] = None, **match) -> List[dict]:
    """The events in ``run_dir/events.jsonl`` (every run's), read by the launcher's bounded reader;
    only those named ``name`` whose fields equal ``match`` when given. [] without the file.

    A line the reader cannot use fails the test: the launcher writes nothing but whole events.
    """
    from launcher.monitoring.eventsfile import read_events

    found = read_events(os.path.join(str(run_dir), "events.jsonl"))
    assert found.skipped == 0, f"{found.skipped} unusable line(s) in {run_dir}/events.jsonl"
    return [e for e in found.events
            if (name is None or e["event"] == name) and all(e.get(k) == v for k, v in match.items())]


class Launcher:
    """One ``launcher run`` process with its files under ``tmp`` (created at the start if missing).

    Args:
        tmp: The directory of this launcher's files: ``run/``, ``logs/``, ``ready``, its output.
        run_dir: ``--run-dir`` (default ``tmp/run``); None: the option is not given (a job dir of
            its own under the base dir, as a user who gives none gets).
        log_dir: ``--log-dir`` (default ``tmp/logs``); None: not given.
        env: The launcher's whole environment (default: this process's).
        cwd: Its working directory (default ``tmp``).
        name: Prefix of its output files (several launches sharing ``tmp``).
        merge_output: stderr into the stdout file (one stream, in the order written).
        wrap: Turns the launcher's command line into the one to start (run it in another network
            namespace, as PID 1 of a PID namespace, ...); ``pid`` is then the wrapper's.
    """

    def __init__(self, tmp: PathLike, run_dir: Optional[PathLike] = "run", log_dir: Optional[PathLike] = "logs",
                 env: Optional[dict] = None, cwd: Optional[PathLike] = None, name: str = "",
                 merge_output: bool = False, wrap: Callable[[List[str]], List[str]] = list):
        self.tmp = Path(tmp)
        self.run_dir = None if run_dir is None else self.tmp / run_dir
        self.log_dir = None if log_dir is None else self.tmp / log_dir
        self.ready = self.tmp / "ready"
        self.env = env
        self.wrap = wrap
        self.cwd = Path(cwd) if cwd is not None else self.tmp
        self.out_path = self.tmp / f"{name}stdout.txt"
        self.err_path = None if merge_output else self.tmp / f"{name}stderr.txt"
        self.proc: Optional[subprocess.Popen] = None
        self.argv: List[str] = []
        self.code: Optional[int] = None
        self.started = 0.0  # time.time() of the start

    # -- running -----------------------------------------------------------------------------------
    def command(self, options: Sequence[str], worker_args: Sequence[str] = (), worker: str = FAKE_RANK,
                command: Optional[Sequence[str]] = None) -> List[str]:
        """The full command line: launcher options, then ``command`` or ``python WORKER --ready-file
        READY WORKER_ARGS``."""
        dirs = [*(["--run-dir", str(self.run_dir)] if self.run_dir is not None else []),
                *(["--log-dir", str(self.log_dir)] if self.log_dir is not None else [])]
        if command is None:
            command = [sys.executable, worker, "--ready-file", str(self.ready), *worker_args]
        return launcher_command("run", *dirs, *map(str, options), "--", *map(str, command))

    def start(self, options: Sequence[str], worker_args: Sequence[str] = (), worker: str = FAKE_RANK,
              command: Optional[Sequence[str]] = None, preexec_fn=None, stdout: Optional[int] = None,
              stderr: Optional[int] = None) -> subprocess.Popen:
        """Start it in the background (stdin ``/dev/null``, output to files); see :meth:`command`.

        Args:
            preexec_fn: Runs in the child before the launcher (a ``ulimit``, say).
            stdout: A file descriptor for its stdout instead of the file (a pipe nobody reads ...).
            stderr: The same for its stderr.
        """
        self.argv = self.command(options, worker_args, worker, command)
        self.tmp.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as files:
            if stdout is None:
                stdout = files.enter_context(open(self.out_path, "wb")).fileno()
            if stderr is None:
                stderr = files.enter_context(open(self.err_path, "wb")).fileno() if self.err_path else subprocess.STDOUT
            self.proc = subprocess.Popen(self.wrap(self.argv), stdin=subprocess.DEVNULL, stdout=stdout,
                                         stderr=stderr, cwd=str(self.cwd), env=self.env, preexec_fn=preexec_fn)
        self.started, self.code = time.time(), None
        _started.append(self)
        return self.proc

    def run(self, options: Sequence[str], worker_args: Sequence[str] = (), timeout: float = 60, **kwargs) -> int:
        """Run it to its end; its exit code (see :meth:`start`, :meth:`wait`)."""
        self.start(options, worker_args, **kwargs)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> int:
        """Its exit code, once it ended; ``subprocess.TimeoutExpired`` if it runs past ``timeout``
        (it keeps running: the test may look at it, the end of the test kills it)."""
        self.code = self.proc.wait(timeout)
        return self.code

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> Optional[int]:
        """SIGKILL it (if it still runs) and reap it; its return code."""
        if self.running():
            self.proc.kill()
        if self.proc is not None:
            self.code = self.proc.wait()
        return self.code

    # -- what it wrote -----------------------------------------------------------------------------
    @property
    def stdout(self) -> str:
        return _text(self.out_path)

    @property
    def stderr(self) -> str:
        return _text(self.err_path) if self.err_path is not None else ""

    @property
    def output(self) -> str:
        """stdout then stderr (one stream with ``merge_output``)."""
        return self.stdout + self.stderr

    def ready_lines(self, suffix: str = "") -> List[List[str]]:
        """The ready file's lines (``ready<suffix>``), split into words: one per rank start."""
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
        raise AssertionError(f"only {self.ready_lines(suffix)} ready; output:\n{self.output[-4000:]}")

    def events(self, name: Optional[str] = None, **match) -> List[dict]:
        """Its run dir's events (see :func:`events_in`)."""
        return events_in(self.run_dir, name, **match)

    def wait_event(self, name: str, count: int = 1, timeout: float = 30, **match) -> List[dict]:
        """Wait until ``count`` events named ``name`` (fields ``match``) were recorded; all of them."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(name, **match)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline or not self.running():
                raise AssertionError(f"{len(found)} of {count} {name} events; output:\n{self.output[-4000:]}")
            time.sleep(0.02)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_all(launchers: Iterable[Launcher], timeout: float) -> List[Optional[int]]:
    """Each launcher's exit code, all within one ``timeout``; None for one still running then (the
    end of the test kills it)."""
    deadline = time.monotonic() + timeout
    codes = []
    for launcher in launchers:
        try:
            codes.append(launcher.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def started_count() -> int:
    """How many launchers were started so far (a mark for :func:`kill_started_since`)."""
    return len(_started)


def kill_started_since(mark: int) -> List[str]:
    """SIGKILL every launcher started after ``mark`` that still runs; their command lines."""
    left = [launcher for launcher in _started[mark:] if launcher.running()]
    del _started[mark:]
    for launcher in left:
        launcher.kill()
    return [" ".join(launcher.argv[3:])[:160] for launcher in left]


atexit.register(kill_started_since, 0)
