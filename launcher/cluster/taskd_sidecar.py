"""The TaskD sidecar: runs the TaskD manager as its child and restarts it whenever it exits.

Started once per job by the launcher, before the ranks, on the server hosting global rank 0
(``python -m launcher.cluster.taskd_sidecar --config JSON --events PATH --run-id ID``); its stdout/stderr
are the manager's log file, which the manager's own output shares. It replaces the vendor's
unsupervised ``python manager.py &``.

- The manager is ``python -c`` code calling ``init_taskd_manager(config)`` then the blocking
  ``start_taskd_manager()``, in its own session, with ``PR_SET_PDEATHSIG`` (it dies with the sidecar).
- Any exit of the manager is unexpected: event ``taskd_manager_exited``, then a restart after an
  exponential backoff computed by tenacity (0.5 s, 1 s, 2 s ... 30 s; event
  ``taskd_manager_restart``). A manager that ran for ``STABLE_SECONDS`` starts the backoff afresh.
- SIGTERM / SIGINT / SIGHUP: stop the manager (SIGTERM to its process group, SIGKILL after
  ``STOP_TIMEOUT`` s), event ``taskd_manager_stopped``, exit 0.
- The sidecar sets ``PR_SET_PDEATHSIG`` on itself, so it (and then the manager) dies with the
  launcher; with ``--parent-pid`` it refuses to start when the launcher is already gone.

Exit status: 0 after a requested stop; 1 when the sidecar itself failed (one summary line, then the
traceback); 2 for bad arguments.
"""

import argparse
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback
import types
from typing import Any, List, Optional

from tenacity import Retrying, retry_if_result, wait_exponential

from launcher.common import envnames
from launcher.supervision import guard as guard_mod
from launcher.monitoring.events import EventLog

log = logging.getLogger("launcher.cluster.taskd_sidecar")

#: Seconds between the manager's SIGTERM and SIGKILL when the sidecar stops it.
STOP_TIMEOUT = 5.0
#: A manager that ran at least this long before exiting restarts with the shortest backoff again.
STABLE_SECONDS = 60.0
#: Backoff between restarts: 0.5 s doubling up to 30 s.
BACKOFF = wait_exponential(multiplier=0.5, max=30)

#: Exit codes of the manager code below (besides what ``start_taskd_manager`` returning gives).
EXIT_START_RETURNED_TRUE = 0
EXIT_START_RETURNED_FALSE = 1
EXIT_INIT_FAILED = 10
EXIT_IMPORT_FAILED = 11
EXIT_EXCEPTION = 12

_REASONS = {
    EXIT_START_RETURNED_TRUE: "start_taskd_manager() returned True",
    EXIT_START_RETURNED_FALSE: "start_taskd_manager() returned False",
    EXIT_INIT_FAILED: "init_taskd_manager() returned False",
    EXIT_IMPORT_FAILED: "cannot import taskd.api",
    EXIT_EXCEPTION: "init_taskd_manager/start_taskd_manager raised",
}

# Runs in the manager process: argv[1] is the config as JSON. Every failure prints one line first.
MANAGER_CODE = f"""\
import json, sys, traceback
def _fail(what, code):
    exc = sys.exc_info()[1]
    print("taskd manager: " + what + (": %s: %s" % (type(exc).__name__, exc) if exc else ""),
          file=sys.stderr, flush=True)
    if exc is not None:
        traceback.print_exc()
    sys.stderr.flush()
    sys.exit(code)
try:
    from taskd.api import init_taskd_manager, start_taskd_manager
except BaseException:
    _fail("cannot import taskd.api", {EXIT_IMPORT_FAILED})
config = json.loads(sys.argv[1])
try:
    if not init_taskd_manager(config):
        _fail("init_taskd_manager() returned False", {EXIT_INIT_FAILED})
    print("taskd manager: initialised, starting", file=sys.stderr, flush=True)
    ok = start_taskd_manager()
except SystemExit:
    raise
except BaseException:
    _fail("init_taskd_manager/start_taskd_manager raised", {EXIT_EXCEPTION})
print("taskd manager: start_taskd_manager() returned %r" % (ok,), file=sys.stderr, flush=True)
sys.exit({EXIT_START_RETURNED_TRUE} if ok else {EXIT_START_RETURNED_FALSE})
"""


def describe_exit(returncode: int) -> str:
    """A readable reason for the manager's exit status."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return _REASONS.get(returncode, f"exited with code {returncode}")


class Sidecar:
    """Runs and restarts the manager until a stop signal.

    Args:
        config: The ``init_taskd_manager`` config.
        events: Where lifecycle events go.
        pod_ip: ``POD_IP`` for the manager (the address it listens on), when given.
    """

    def __init__(self, config: dict, events: EventLog, pod_ip: Optional[str] = None):
        self.config = config
        self.events = events
        self.pod_ip = pod_ip
        self.stopping = False
        self.proc: Optional[subprocess.Popen] = None
        self._stable = False  # the last manager ran for STABLE_SECONDS or more
        self._stop_recorded = False
        self._streak_start = 0  # tenacity attempt number at which the current backoff streak began
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)

    # -- signals --------------------------------------------------------------------------------
    def install_signals(self) -> None:
        """Stop signals set a flag; SIGCHLD and they all wake :meth:`_wait` through a pipe."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wakeup fd is written

    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    def _wait(self, timeout: Optional[float]) -> None:
        """Block until a signal arrives (or ``timeout`` seconds pass)."""
        try:
            select.select([self._wake_r], [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
            pass
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _sleep(self, seconds: float) -> None:
        """tenacity's sleep: returns early when a stop is requested."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wait(remaining)

    # -- the manager ----------------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        env[envnames.TASKD_PROCESS_ENABLE] = "on"  # init_taskd_manager reads it (taskd_enable)
        if self.pod_ip:
            env[envnames.POD_IP] = self.pod_ip  # TaskD listens on $POD_IP:9601
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.Popen([sys.executable, "-c", MANAGER_CODE, json.dumps(self.config)], env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=guard_mod.child_setup, close_fds=True)

    def run_manager_once(self) -> Optional[int]:
        """Start the manager and wait for it; its exit status, or None once a stop was requested."""
        if self.stopping:
            return None
        started = time.monotonic()
        self.proc = proc = self._spawn()
        log.info("TaskD manager started (pid %d)", proc.pid)
        self.events.emit("taskd_manager_started", pid=proc.pid, config=self.config)
        while proc.poll() is None:
            if self.stopping:
                self._stop_manager(proc)
                return None
            self._wait(None)  # SIGCHLD or a stop signal
        runtime = time.monotonic() - started
        _killpg(proc.pid, signal.SIGKILL)  # anything the dead manager left in its group
        reason = describe_exit(proc.returncode)
        log.warning("TaskD manager (pid %d) exited after %.1f s: %s", proc.pid, runtime, reason)
        self.events.emit("taskd_manager_exited", pid=proc.pid, returncode=proc.returncode, reason=reason,
                         runtime=round(runtime, 3))
        self.proc = None
        self._stable = runtime >= STABLE_SECONDS
        return proc.returncode

    def _stop_manager(self, proc: subprocess.Popen) -> None:
        forced = False
        _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            self._wait(max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            forced = True
            log.warning("TaskD manager (pid %d) ignored SIGTERM for %.0f s: SIGKILL", proc.pid, STOP_TIMEOUT)
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # anything the manager left in its group
        log.info("TaskD manager (pid %d) stopped: %s", proc.pid, describe_exit(proc.returncode))
        self.events.emit("taskd_manager_stopped", pid=proc.pid, returncode=proc.returncode, forced=forced)
        self._stop_recorded = True
        self.proc = None

    # -- restart policy -------------------------------------------------------------------------
    def _backoff(self, retry_state: Any) -> float:
        """Exponential backoff counted from the start of the current streak of quick exits."""
        if self._stable:
            self._streak_start = retry_state.attempt_number - 1
            self._stable = False
        return BACKOFF(types.SimpleNamespace(attempt_number=retry_state.attempt_number - self._streak_start))

    def _before_sleep(self, retry_state: Any) -> None:
        delay = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.info("restarting the TaskD manager in %.1f s (restart %d)", delay, retry_state.attempt_number)
        self.events.emit("taskd_manager_restart", attempt=retry_state.attempt_number, delay=delay)

    def run(self) -> int:
        """Run until stopped; returns the sidecar's exit status."""
        retrying = Retrying(wait=self._backoff, retry=retry_if_result(lambda rc: rc is not None),
                            before_sleep=self._before_sleep, sleep=self._sleep, reraise=True)
        retrying(self.run_manager_once)  # returns once a stop was requested
        if not self._stop_recorded:  # the stop came while waiting to restart: nothing to stop
            log.info("stopped while waiting to restart the TaskD manager")
            self.events.emit("taskd_manager_stopped", pid=None, returncode=None, forced=False)
        return 0

    def shutdown(self) -> None:
        """Stop the manager if it still runs (on an error path)."""
        if self.proc is not None and self.proc.poll() is None:
            self._stop_manager(self.proc)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.cluster.taskd_sidecar",
                                     description="Run the TaskD manager and restart it when it exits.")
    parser.add_argument("--config", required=True, help="init_taskd_manager config, as JSON")
    parser.add_argument("--events", required=True, help="the run's events.jsonl")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--parent-pid", type=int, help="exit at once unless this process is our parent")
    parser.add_argument("--pod-ip", help="POD_IP for the manager (the address it listens on)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="[taskd-sidecar] %(asctime)s %(levelname)s %(message)s")
    guard_mod.child_setup()  # PR_SET_PDEATHSIG: die with the launcher
    args = _parse(argv)
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        log.error("the launcher (pid %d) is already gone: not starting the TaskD manager", args.parent_pid)
        return 1
    try:
        config = json.loads(args.config)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        log.error("--config is not a JSON object: %s", exc)
        return 2
    try:
        events = EventLog(args.events, args.run_id)
    except OSError as exc:
        log.error("cannot open %s: %s", args.events, exc.strerror or exc)
        return 2
    sidecar = Sidecar(config, events, args.pod_ip)
    sidecar.install_signals()
    try:
        return sidecar.run()
    except BaseException as exc:  # one line first, then the traceback
        log.error("TaskD sidecar failed: %s: %s", type(exc).__name__, exc)
        traceback.print_exc()
        try:
            events.emit("taskd_sidecar_failed", error=f"{type(exc).__name__}: {exc}")
        except OSError:
            pass
        sidecar.shutdown()
        return 1
    finally:
        events.close()


if __name__ == "__main__":
    sys.exit(main())
