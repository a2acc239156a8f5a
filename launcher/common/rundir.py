"""The run dir: the launcher's private state (pid, state, events, control socket).

It is created with mode 0700 and must stay owned by the launcher's user and closed to others: the
control socket in it lets whoever can open it stop the job. One launcher at a time holds its lock.

Nobody else may be able to swap it either (issue #17.4: another uid, with write access to the parent,
replaced the run dir with a symlink and made a root launcher overwrite root's files). So every
directory on the way to it must belong to root or to us and be closed to writes by others (sticky
``/tmp`` aside), it is opened once with ``O_DIRECTORY | O_NOFOLLOW``, and the launcher's own files in
it are opened, renamed and removed relative to that directory fd with ``O_NOFOLLOW``.
"""

import errno
import fcntl
import json
import os
import stat
from typing import Any, Dict, Optional

from launcher.common import envnames, outputfiles
from launcher.common.errors import LauncherError, UsageError
from launcher.common.inputfiles import read_record
from launcher.common.warnonce import WarnOnce

# By name: importing logging is left to the first failure (launcher status / prestop start fast).
_write_failed = WarnOnce(__name__)  # one report per run-dir file that cannot be written

EVENTS = "events.jsonl"
STATE = "state.json"
LAUNCHER = "launcher.json"
LOCK = "lock"
CONTROL_SOCKET = "control.sock"

#: Longest unix socket path bind(2) and connect(2) take (``sun_path`` is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SYMLINKS = 40  # as the kernel's path walk


def base_dir(environ: Optional[Dict[str, str]] = None) -> str:
    """Where the jobs' run dirs live: ``$XDG_RUNTIME_DIR/launcher``, else ``/tmp/launcher-<uid>``."""
    env = os.environ if environ is None else environ
    if env.get(envnames.XDG_RUNTIME_DIR):
        return os.path.join(env[envnames.XDG_RUNTIME_DIR], "launcher")
    return f"/tmp/launcher-{os.getuid()}"


def check_base(path: str, create: bool = False) -> bool:
    """Refuse a base dir (:func:`base_dir`) planted by someone else, as ssh and tmux check theirs: it
    must be a directory itself (not a symlink), owned by this user and not writable by others. ``create``
    makes it (0700) when missing; otherwise a missing one gives False.

    Raises:
        UsageError: one line naming it and what is wrong.
    """
    return outputfiles.private_dir(path, "base dir", create)


def check_ancestors(path: str) -> None:
    """Refuse a run dir that another user could swap for a symlink of their choice.

    Walks every directory the kernel traverses to reach ``path``'s parent, following symlinks the
    way the kernel does; each must belong to root or to this user and, unless sticky, be closed to
    writes by its group and others. Components that do not exist yet are the launcher's to create.

    Raises:
        UsageError: one line naming the directory and why.
    """
    todo = [part for part in os.path.abspath(path).split("/")[1:-1] if part]
    current, hops = "/", 0
    _check_trusted(path, current, os.stat(current))
    while todo:
        name = todo.pop(0)
        if name in (".", ".."):
            current = current if name == "." else os.path.dirname(current)
            continue
        following = os.path.join(current, name)
        try:
            st = _lstat(path, following)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            target = os.readlink(following)
            if hops > _MAX_SYMLINKS:
                raise UsageError(f"run dir {path}: too many symlinks on the way (at {following})")
            todo[:0] = [part for part in target.split("/") if part]
            current = "/" if target.startswith("/") else current
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"run dir {path}: {following} is not a directory")
        _check_trusted(path, following, st)
        current = following


def _lstat(run_dir: str, path: str) -> os.stat_result:
    """``os.lstat(path)``; FileNotFoundError as is, other errors as a UsageError about ``run_dir``."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UsageError(f"run dir {run_dir}: cannot inspect {path}: {exc.strerror}") from None


def _check_trusted(run_dir: str, path: str, st: os.stat_result) -> None:
    if st.st_uid not in (0, os.geteuid()):
        raise UsageError(f"run dir {run_dir} refused: {path} belongs to uid {st.st_uid}, who could swap "
                         f"the run dir for a symlink")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = "others" if st.st_mode & 0o002 else "its group"
        raise UsageError(f"run dir {run_dir} refused: {path} is writable by {who} and not sticky "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}), so they could swap the run dir for a symlink")


def check_private(path: str, st: Optional[os.stat_result] = None) -> None:
    """Refuse a run dir that is not ours or that others can read, write or enter.

    Args:
        path: The run dir (for messages; inspected with ``lstat`` unless ``st`` is given).
        st: Its ``fstat`` through an open fd, when the caller holds one.

    Raises:
        UsageError: wrong owner or permissions, or not a directory.
    """
    st = _lstat(path, path) if st is None else st
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"run dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UsageError(f"run dir {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})",
                         ["refusing to use it: pass --run-dir with a directory of your own"])
    if st.st_mode & 0o077:
        raise UsageError(f"run dir {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be private (0700)",
                         [f"fix it with: chmod 700 {path}"])


def _open_dir(path: str) -> int:
    """An fd of the directory ``path`` itself, never of where a symlink in its place points."""
    try:
        return os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if os.path.islink(path) or exc.errno == errno.ENOTDIR:  # ELOOP on a symlink
            raise UsageError(f"run dir {path} is not a directory"
                             f"{' (a symlink: refused)' if os.path.islink(path) else ''}") from None
        raise UsageError(f"run dir {path}: {exc.strerror}") from None


class RunDir:
    """An opened run dir; ``lock()`` makes it this launcher's.

    Args:
        path: Directory (created 0700 if missing and ``create``).
        create: Create it (``launcher run``); otherwise a missing dir raises FileNotFoundError.

    Raises:
        UsageError: an ancestor others could use to swap it, not a directory, not private.
        FileNotFoundError: missing and not ``create``.
    """

    def __init__(self, path: str, create: bool = True):
        self.path = os.path.abspath(path)
        check_ancestors(self.path)
        if os.path.dirname(self.path) == os.path.abspath(base_dir()):  # a job's default home
            check_base(os.path.dirname(self.path), create)
        if create:
            self._create()
        self.fd = _open_dir(self.path)
        try:
            check_private(self.path, os.fstat(self.fd))
        except BaseException:
            os.close(self.fd)
            raise
        self._lock_fd: Optional[int] = None

    def _create(self) -> None:
        old_umask = os.umask(0o077)  # parents we create are ours and private, never open to others
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create run dir {self.path}: {exc.strerror}") from None
        finally:
            os.umask(old_umask)
        check_ancestors(self.path)  # what we just created, and what raced us to it

    def file(self, name: str) -> str:
        """Absolute path of ``name`` inside the run dir (for files others open by name, ranks included)."""
        return os.path.join(self.path, name)

    def socket_address(self, name: str = CONTROL_SOCKET) -> str:
        """A path for bind/connect of the unix socket ``name``, short whatever the run dir's length.

        ``/proc/self/fd/<fd>/<name>`` resolves through this process's directory fd, so it is short
        and cannot be redirected by a swapped path; without ``/proc`` the plain path must fit.

        Raises:
            UsageError: no ``/proc`` and a path longer than a unix socket takes.
        """
        via_fd = f"/proc/self/fd/{self.fd}/{name}"
        if os.path.isdir(f"/proc/self/fd/{self.fd}"):
            return via_fd
        path = self.file(name)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise UsageError(f"run dir {self.path} is too long for a unix socket ({len(os.fsencode(path))} > "
                             f"{MAX_SOCKET_PATH} bytes) and /proc is not mounted: pass a shorter --run-dir")
        return path

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """``os.open`` of ``name`` in the run dir, relative to its fd, never through a symlink."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, both in the run dir (relative to its fd)."""
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Unlink ``name`` in the run dir (a symlink itself, never its target); missing is fine."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def lock(self) -> None:
        """Take the run dir's exclusive lock for this launcher's lifetime.

        Raises:
            LauncherError: another live launcher holds it.
        """
        fd = self.open(LOCK, os.O_RDWR | os.O_CREAT)
        try:
            _flock(fd)
        except BlockingIOError:
            os.close(fd)
            owner = self.read_json(LAUNCHER) or {}
            raise LauncherError(f"another launcher (pid {owner.get('pid', '?')}) is running with run dir {self.path}",
                                ["pass --run-dir or --job-name to give this job its own directory"]) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the lock (the kernel also releases it if the launcher dies)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        """Release the lock and the directory fd."""
        self.unlock()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write_json(self, name: str, data: Any) -> bool:
        """Atomically replace ``name`` with ``data`` as JSON (temp file + rename, relative to the dir fd).

        The run dir records the job; it must not stop it. A write that fails (full disk, I/O error)
        leaves the old file in place, is reported once per file, and returns False.
        """
        tmp = f"{name}.{os.getpid()}.tmp"
        try:
            self.remove(tmp)  # a leftover of a dead launcher with our pid: O_EXCL below needs it gone
            with os.fdopen(self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w", encoding="utf-8") as fh:
                # dumps, not dump: json.dump always runs the pure-Python encoder; the C one encodes a
                # 16,384-rank restore plan in a third of the time, before every restart.
                fh.write(json.dumps(data, default=str))
            self.replace(tmp, name)
        except BaseException as exc:
            self.remove(tmp)
            if not isinstance(exc, OSError):
                raise
            _write_failed((self.path, name), "cannot write %s (%s): keeping its previous content, the job goes on",
                          self.file(name), exc.strerror or exc)
            return False
        return True

    def read_json(self, name: str) -> Optional[Any]:
        """Parsed content of ``name``, or None when missing or unusable (a FIFO, a symlink, too big,
        too deep, not JSON: :func:`launcher.common.inputfiles.read_record`, relative to the dir fd)."""
        try:
            return read_record(name, name, dir_fd=self.fd)
        except (OSError, ValueError):
            return None


def _flock(fd: int) -> None:
    """Take ``fd``'s exclusive flock; a held lock is retried briefly, as ``launcher jobs`` and
    ``launcher prestop`` probe it with a shared lock for microseconds.

    Raises:
        BlockingIOError: still held after the retries: a live launcher owns it.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    import logging  # not before: launcher prestop pays every import before its gasp

    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

    def reason(state) -> None:
        logging.getLogger(__name__).debug("run dir lock held (attempt %d): a probe, or another launcher", state.attempt_number)

    for attempt in Retrying(retry=retry_if_exception_type(BlockingIOError), stop=stop_after_attempt(5),
                            wait=wait_fixed(0.02), before_sleep=reason, reraise=True):
        with attempt:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
