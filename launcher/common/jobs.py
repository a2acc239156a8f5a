"""The jobs of this user on this machine: one run dir per job under the base dir, found again by name.

``launcher run`` without ``--run-dir`` uses ``<base>/<job name>`` (``rundir.base_dir``), so two local
jobs never share a run dir; ``launcher prestop``, ``exit`` and ``jobs`` find them here. A job is
*live* while its launcher holds the run dir's lock: ``scan`` tells that with one shared, non-blocking
``flock`` probe per directory, which is all a preStop hook pays before its gasp (plus a directory
listing). Run dirs of ended jobs are kept for their events and logs, the newest ``KEEP_DEAD`` of them.
"""

import fcntl
import os
import re
import time
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

from launcher.common import envnames
from launcher.common import rundir as rundir_mod
from launcher.common.errors import UsageError
from launcher.common.inputfiles import read_record

#: Run dirs of jobs no launcher holds any more that ``launcher run`` keeps under the base dir.
KEEP_DEAD = 10
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


class Job(NamedTuple):
    """One run dir under the base dir.

    Attributes:
        name: The job name (the directory's name).
        run_dir: Its path.
        live: A launcher holds its lock.
        pid: The launcher's pid (``launcher.json``), when read.
        started: Wall-clock start, when read.
        ended: Wall-clock end of a launcher that exited cleanly, when read.
    """

    name: str
    run_dir: str
    live: bool
    pid: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None

    @property
    def status(self) -> str:
        """``running``, ``ended``, or ``died`` (its launcher never reached its end)."""
        return "running" if self.live else "ended" if self.ended else "died"

    def to_json(self) -> Dict[str, object]:
        """The row of ``launcher jobs --json``."""
        return {"name": self.name, "status": self.status, "pid": self.pid, "started": self.started,
                "ended": self.ended, "run_dir": self.run_dir}

    def describe(self) -> str:
        """One line for listings: name, status, pid, start time, run dir."""
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)) if self.started else "?"
        return f"{self.name}  {self.status}  pid {self.pid or '?'}  started {started}  {self.run_dir}"


def job_name(chosen: Optional[str], run_id: Optional[str] = None) -> str:
    """The job's name: ``--job-name``, else the run id the user or the cluster chose, else
    ``<YYYYmmdd-HHMMSS>-<pid>``; characters that are not safe in a file name become ``_``.

    Raises:
        UsageError: an explicit ``--job-name`` that cannot name a directory.
    """
    if chosen is not None:
        check_name(chosen, "--job-name")
        return chosen
    if run_id:
        return _UNSAFE.sub("_", run_id).lstrip(".") or "job"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def check_name(name: str, option: str = "--job") -> None:
    """Refuse a job name that is not a plain directory name (``/``, ``..``, a leading dot)."""
    if not name or _UNSAFE.search(name) or name.startswith("."):
        raise UsageError(f"{option} {name!r}: use letters, digits and . _ + - (not starting with a dot)")


def scan(base: str, details: bool = True) -> List[Job]:
    """Every job's run dir under ``base``, oldest first when ``details``; [] without a base.

    Args:
        base: The base dir.
        details: Also read each ``launcher.json`` (pid, start and end times).

    Raises:
        UsageError: ``base`` is a symlink, not ours, or open to others (:func:`rundir.check_base`).
    """
    if not rundir_mod.check_base(base):  # a planted base dir is refused, never listed or followed
        return []
    try:
        entries = [e for e in os.scandir(base) if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [job for job in (_job(entry.name, entry.path, details) for entry in entries) if job is not None]
    return sorted(found, key=lambda j: (j.started or 0, j.name)) if details else found


def _job(name: str, path: str, details: bool) -> Optional[Job]:
    """The job in ``path``, or None for a directory no launcher ever locked (not a run dir)."""
    live = _locked(path)
    if live is None:
        return None
    if not details:
        return Job(name, path, live)
    record = _launcher_record(path)
    return Job(name, path, live, _number(record.get("pid"), int), _number(record.get("started"), float),
               _number(record.get("ended"), float))


def is_live(path: str) -> bool:
    """Whether a launcher holds the run dir ``path`` now (``launcher status``)."""
    return bool(_locked(path))


def _locked(path: str) -> Optional[bool]:
    """Whether a launcher holds ``path``'s lock (a shared probe, released at once); None: no lock file."""
    try:
        fd = os.open(os.path.join(path, rundir_mod.LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _launcher_record(path: str) -> dict:
    try:
        record = read_record(os.path.join(path, rundir_mod.LAUNCHER), rundir_mod.LAUNCHER)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _number(value: object, kind: type) -> Optional[float]:
    try:
        return kind(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def resolve(run_dir: Optional[str], job: Optional[str], environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The run dir ``launcher prestop`` / ``exit`` address, or None when no job is running.

    ``--run-dir`` (or ``LAUNCHER_RUN_DIR``), else ``--job NAME`` under the base dir, else the one live
    job under the base dir.

    Raises:
        UsageError: several live jobs (listed, with how to pick one), or a bad ``--job``.
    """
    env = os.environ if environ is None else environ
    explicit = run_dir or env.get(envnames.LAUNCHER_RUN_DIR)
    if explicit:
        return os.path.abspath(explicit)
    base = rundir_mod.base_dir(dict(env))
    if job is not None:
        check_name(job)
        return os.path.join(base, job)
    live = [j for j in scan(base, details=False) if j.live]
    if len(live) > 1:
        raise UsageError(f"{len(live)} jobs are running under {base}; pick one with --job NAME or --run-dir DIR",
                         [j.describe() for j in sorted(_described(live), key=lambda j: j.name)])
    return live[0].run_dir if live else None


def _described(jobs: Sequence[Job]) -> List[Job]:
    return [described for described in (_job(j.name, j.run_dir, True) for j in jobs) if described is not None]


def orphaned(base: str) -> List[Job]:
    """Jobs whose launcher died (no lock, no clean end), newest first: prestop's fallback candidates."""
    return sorted((j for j in scan(base) if j.status == "died"), key=lambda j: -(j.started or 0))


def prune(base: str, keep: int = KEEP_DEAD, exclude: Sequence[str] = ()) -> List[str]:
    """Remove the run dirs of all but the newest ``keep`` jobs that no launcher holds.

    Each is locked first (a launcher starting on it meanwhile keeps it), renamed to a hidden name
    relative to the base dir's fd, then removed (``shutil.rmtree`` never follows symlinks). The base
    dir must pass the run dir checks (ours, private, safe ancestors); otherwise nothing is removed.

    Returns:
        The names removed.
    """
    try:
        home = rundir_mod.RunDir(base, create=False)
    except (FileNotFoundError, UsageError):
        return []
    try:
        dead = [j for j in scan(base) if not j.live and j.name not in exclude]
        return [j.name for j in dead[:max(0, len(dead) - keep)] if _remove(home, j.name)]
    finally:
        home.close()


def _remove(home: "rundir_mod.RunDir", name: str) -> bool:
    hidden = f".{name}.removing-{os.getpid()}"
    try:
        lock = os.open(os.path.join(name, rundir_mod.LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=home.fd)
    except OSError:  # gone meanwhile
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        home.replace(name, hidden)
    except OSError:  # held by a launcher that just started on it
        return False
    finally:
        os.close(lock)
    import shutil

    # By path (rmtree's dir_fd is Python 3.11+): the base dir passed the checks, so nobody else can
    # swap it, and rmtree itself never follows a symlink.
    shutil.rmtree(os.path.join(home.path, hidden), ignore_errors=True)
    return True
