"""Shared fixtures. The autouse ``no_leftover_processes`` fails any test that leaves a process behind.

pytest makes itself a child subreaper, so a rank orphaned by a dead launcher is re-parented to
pytest and shows up among its descendants instead of escaping to init unseen. What a test starts
also inherits :data:`MARK` in its environment, so a process that left pytest's tree anyway (re-parented
to the init of a PID namespace, started through another program, a daemon of a test) is found
by a /proc scan. A launcher a test started through ``tests.helpers.launch`` and left running is
killed first (with its ranks).
"""

import os
import time

import psutil
import pytest

from launcher.supervision.guard import become_subreaper
from tests.helpers import launch

become_subreaper()

# The chaos suite's summary must run in the process that prints the terminal summary, which under
# pytest-xdist never loads tests/chaos/conftest.py (see tests/chaos/report.py).
pytest_plugins = ("tests.chaos.report",)

#: How long a test's processes get to finish exiting after the test body returns.
SETTLE_SECONDS = 5.0

#: Inherited by every process this pytest process starts (unless a test gives a whole environment of
#: its own): ``name=value`` with this process's pid, so two pytest processes never share it.
MARK_NAME = "PYTEST_LEFTOVER_MARK"
os.environ[MARK_NAME] = str(os.getpid())
MARK = f"\0{MARK_NAME}={os.getpid()}\0".encode()


def _carries_mark(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return MARK in b"\0" + fh.read() + b"\0"
    except OSError:  # gone, or not ours to read
        return False


def _descendants() -> dict:
    """(pid, create time) -> process: pytest's descendants and every process carrying MARK."""
    me = os.getpid()
    found = {}
    for proc in psutil.Process().children(recursive=True) + [pid for pid in psutil.pids() if pid != me and
                                                             _carries_mark(pid)]:
        try:
            proc = psutil.Process(proc) if isinstance(proc, int) else proc
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            found[(proc.pid, proc.create_time())] = proc
        except psutil.Error:
            continue
    return found


def _reap_orphans() -> None:
    """Reap zombies re-parented to pytest (subprocess.Popen reaps its own)."""
    for proc in psutil.Process().children():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(proc.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def _fail_if_left(before: set, what: str) -> None:
    """Wait up to SETTLE_SECONDS for the processes not in ``before`` to end; kill them and fail if not."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        _reap_orphans()
        left = {k: p for k, p in _descendants().items() if k not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        described = []
        for proc in left.values():
            try:
                described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
                proc.kill()
            except psutil.Error:
                continue
        _reap_orphans()
        if described:
            pytest.fail(f"{what} left processes behind:\n  " + "\n  ".join(described))


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail the test if it leaves any process running (and kill what it left)."""
    before = set(_descendants())
    mark = launch.started_count()
    yield
    launch.kill_started_since(mark)
    _fail_if_left(before, "test")


@pytest.fixture(scope="module", autouse=True)
def no_leftover_processes_of_the_module():
    """The same for the module's own fixtures (an etcd server, a reference run started in the
    background): what they started must be gone once the module's fixtures are torn down. The
    per-test check cannot see these (they were running before each test began)."""
    before = set(_descendants())
    yield
    _fail_if_left(before, "the module's fixtures")
