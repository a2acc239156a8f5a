"""Process helpers shared by unit and integration tests: polling, liveness, and tiny signal-aware ranks."""

import os
import signal
import socket
import subprocess
import sys
import time
from typing import List

#: The job token of tests that build a ``JobTree`` by hand. A sweep kills every process carrying its
#: token anywhere in /proc, and pytest-xdist runs test files side by side: a token shared between
#: files let one file's sweep kill another's process (seen in CI). One per test process.
TOKEN = f"t0k3n{os.getpid()}"

# argv: <on-signal: exit|ignore> <ready file> [<signal name> [child]]; "exit" exits with code 7 on the
# signal. With "child" it first starts a `sleep` (in the rank's process group) and writes its pid to the
# ready file. The ready file appears only once the handler is in place.
RANK = """
import os, signal, subprocess, sys
mode, ready = sys.argv[1], sys.argv[2]
signum = getattr(signal, sys.argv[3] if len(sys.argv) > 3 else "SIGTERM")
child = subprocess.Popen(["sleep", "60"]).pid if sys.argv[4:] == ["child"] else ""
signal.signal(signum, (lambda *_: os._exit(7)) if mode == "exit" else signal.SIG_IGN)
with open(ready + ".tmp", "w") as fh:
    fh.write(str(child))
os.replace(ready + ".tmp", ready)
while True:
    signal.pause()
"""


def wait_until(predicate, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until true or timeout (test side only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def free_port() -> int:
    """A port nobody listens on right now (bind to port 0 and let the kernel choose)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class RankSpawner:
    """Starts ``RANK`` processes, each in its own session, and kills their groups at :meth:`close`.

    Args:
        directory: Where the ready files go.
    """

    def __init__(self, directory):
        self.directory = directory
        self.procs: List[subprocess.Popen] = []

    def start(self, mode: str = "exit", *extra: str) -> subprocess.Popen:
        """A rank that exits 7 (``exit``) or ignores (``ignore``) the signal; returned once ready.

        ``proc.child`` is the pid of its ``sleep`` child when ``extra`` ends with ``child``.
        """
        ready = os.path.join(str(self.directory), f"ready-{len(self.procs)}")
        proc = subprocess.Popen([sys.executable, "-c", RANK, mode, ready, *extra], start_new_session=True)
        self.procs.append(proc)
        assert wait_until(lambda: os.path.exists(ready)), "the rank never became ready"
        with open(ready) as fh:
            proc.child = int(fh.read() or 0) or None
        return proc

    def close(self) -> None:
        """SIGKILL every rank's group (the rank and whatever it left in it) and reap the ranks."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
