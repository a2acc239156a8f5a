"""Before each attempt: is this node fit to run it? (``--health-check CMD``, and built-in checks.)

``--health-check CMD`` runs a user's node check (as NVIDIA's node health checks or a Slurm health
script are used) through the shell, with ``LAUNCHER_DEVICES`` set to the devices this node's ranks
will use; a non-zero exit, or no exit within ``HEALTH_CHECK_TIMEOUT`` seconds, means the node is
faulty: the launcher ends its part with ``--node-fault-exit-code`` so that the cluster reschedules
the pod elsewhere. Its last output lines go into the launcher's line.

Built in, without options: with ``--checkpoint-dir``, the free space of its file system against
the size of the newest save there (the newest entry of the directory, measured with a bounded
walk); a warning when the next save may not fit. It never stops the job.
"""

import logging
import os
import shutil
import subprocess
import threading
from typing import Callable, Iterable, Mapping, Optional, Tuple

from launcher.common import envnames

log = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT = 120.0
#: Output lines of a failed check shown in the launcher's line.
OUTPUT_LINES = 5
#: Files a size walk of the newest save reads at most (a save with more is "at least" that big).
MAX_WALK_FILES = 100_000


class SpaceCheck:
    """:func:`checkpoint_space` of one directory, kept off the restart: the look before the first
    attempt is made then; each later one runs in a daemon thread beside the attempt before it
    (:meth:`start` when its ranks are spawned) and :meth:`take` hands its finding to the next
    attempt, without waiting for a look still running (its finding goes to the attempt after). The
    look stats every entry of the directory: 16,384 rank directories took 0.2-0.8 s of the restart ->
    restore_plan span (issue 29).
    """

    def __init__(self, directory: str):
        self.directory = directory
        self._thread: Optional[threading.Thread] = None
        self._found: Optional[Tuple[int, int, str]] = None
        self._looked = False  # a look ended whose finding was not taken yet
        self._lock = threading.Lock()  # the finding and its flag change together

    def start(self) -> None:
        """Look now, beside the running attempt (no-op while a look is still running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._look, name="ckpt-space", daemon=True)
        self._thread.start()

    def _look(self) -> None:
        found = checkpoint_space(self.directory)
        with self._lock:
            self._found, self._looked = found, True

    def take(self) -> Optional[Tuple[int, int, str]]:
        """The finding of the last look that ended since the last take; a look now when none was
        ever started (before the first attempt); None while the only look is still running."""
        if self._thread is None:
            return checkpoint_space(self.directory)
        with self._lock:  # a look ending between reading the flag and clearing it would be lost
            found, looked, self._looked = self._found, self._looked, False
        return found if looked else None


def node_health(health_check: Optional[str], checkpoint_dir: Optional[str], devices: Iterable[int],
                emit: Callable[..., object], space: Optional[SpaceCheck] = None) -> Optional[str]:
    """Before an attempt: warn when ``checkpoint_dir`` (``--checkpoint-dir``) may not hold the next save
    (``space``'s finding, else a look now), then run ``health_check`` (``--health-check``); None when
    the node is fit."""
    if checkpoint_dir:
        tight = space.take() if space is not None else checkpoint_space(checkpoint_dir)
        if tight is not None:
            free, size, newest = tight
            emit("checkpoint_space_low", free_bytes=free, last_save_bytes=size, last_save=newest)
            log.warning("%s has %d MiB free, less than the newest save there (%s, %d MiB): the next save may "
                        "not fit", checkpoint_dir, free >> 20, newest, size >> 20)
    if not health_check:
        return None
    return run_health_check(health_check, devices, os.environ)


def run_health_check(command: str, devices: Iterable[int], environ: Mapping[str, str],
                     timeout: float = HEALTH_CHECK_TIMEOUT) -> Optional[str]:
    """Run ``command``; None when it passed, else why it failed (exit status and its last lines)."""
    env = {**environ, envnames.LAUNCHER_DEVICES: ",".join(str(d) for d in devices)}
    try:
        done = subprocess.run(command, shell=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return f"cannot run it: {exc.strerror or exc}"
    if done.returncode == 0:
        return None
    tail = done.stdout[-8192:].decode("utf-8", "replace").strip().splitlines()[-OUTPUT_LINES:]
    code = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    return code + (": " + " | ".join(line.strip() for line in tail) if tail else "")


def _newest_entry(directory: str) -> Optional[str]:
    try:
        entries = [e for e in os.scandir(directory) if not e.name.startswith(".")]
    except OSError:
        return None
    if not entries:
        return None
    return max(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime).path


def tree_size(path: str, max_files: int = MAX_WALK_FILES) -> int:
    """Bytes under ``path`` (a file or a directory), counting at most ``max_files`` files."""
    if not os.path.isdir(path):
        try:
            return os.stat(path).st_size
        except OSError:
            return 0
    total, seen = 0, 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                continue
            seen += 1
            if seen >= max_files:
                return total
    return total


def checkpoint_space(directory: str) -> Optional[Tuple[int, int, str]]:
    """``(free bytes, newest save's bytes, its path)`` when the next save may not fit, else None."""
    newest = _newest_entry(directory)
    if newest is None:
        return None
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return None
    size = tree_size(newest)
    return (free, size, newest) if size > free else None
