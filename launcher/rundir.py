"""The run dir: the launcher's private state (pid, state, events, control socket).

It is created with mode 0700 and must stay owned by the launcher's user and closed to others: the
control socket in it lets whoever can open it stop the job. One launcher at a time holds its lock.
"""

import fcntl
import json
import logging
import os
import stat
from typing import Any, Dict, Optional

from launcher import envnames
from launcher.errors import LauncherError, UsageError
from launcher.warnonce import WarnOnce

log = logging.getLogger(__name__)
_write_failed = WarnOnce(log)  # one report per run-dir file that cannot be written

EVENTS = "events.jsonl"
STATE = "state.json"
LAUNCHER = "launcher.json"
LOCK = "lock"
CONTROL_SOCKET = "control.sock"


def default_run_dir(environ: Optional[Dict[str, str]] = None) -> str:
    """``$XDG_RUNTIME_DIR/launcher`` when set, else ``/tmp/launcher-<uid>``; ``LAUNCHER_RUN_DIR`` wins."""
    env = os.environ if environ is None else environ
    if env.get(envnames.LAUNCHER_RUN_DIR):
        return env[envnames.LAUNCHER_RUN_DIR]
    if env.get(envnames.XDG_RUNTIME_DIR):
        return os.path.join(env[envnames.XDG_RUNTIME_DIR], "launcher")
    return f"/tmp/launcher-{os.getuid()}"


def check_private(path: str) -> None:
    """Refuse a run dir that is not ours or that others can read, write or enter.

    Raises:
        UsageError: wrong owner or permissions, or not a directory.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UsageError(f"run dir {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"run dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UsageError(f"run dir {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})",
                         ["refusing to use it: pass --run-dir with a directory of your own"])
    if st.st_mode & 0o077:
        raise UsageError(f"run dir {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be private (0700)",
                         [f"fix it with: chmod 700 {path}"])


class RunDir:
    """An opened, locked run dir.

    Args:
        path: Directory (created 0700 if missing).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create run dir {self.path}: {exc.strerror}") from None
        check_private(self.path)
        self._lock_fd: Optional[int] = None

    def file(self, name: str) -> str:
        """Absolute path of ``name`` inside the run dir."""
        return os.path.join(self.path, name)

    def lock(self) -> None:
        """Take the run dir's exclusive lock for this launcher's lifetime.

        Raises:
            LauncherError: another live launcher holds it.
        """
        fd = os.open(self.file(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self.read_json(LAUNCHER) or {}
            raise LauncherError(f"another launcher (pid {owner.get('pid', '?')}) is running with run dir {self.path}",
                                ["pass --run-dir to give this job its own directory"]) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the lock (the kernel also releases it if the launcher dies)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def write_json(self, name: str, data: Any) -> bool:
        """Atomically replace ``name`` with ``data`` as JSON (temp file + rename).

        The run dir records the job; it must not stop it. A write that fails (full disk, I/O error)
        leaves the old file in place, is reported once per file, and returns False.
        """
        path = self.file(name)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh, default=str)
            os.replace(tmp, path)
        except BaseException as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if not isinstance(exc, OSError):
                raise
            _write_failed(name, "cannot write %s (%s): keeping its previous content, the job goes on", path,
                          exc.strerror or exc)
            return False
        return True

    def read_json(self, name: str) -> Optional[Any]:
        """Parsed content of ``name``, or None when missing or unreadable."""
        try:
            with open(self.file(name), encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None
