"""The job's whole process tree, including processes that left their rank's process group.

A rank's child that calls ``setsid()`` or ``setpgid(0, 0)`` is out of reach of ``killpg``. Two
mechanisms find such processes, so that "the job is over" means every descendant is gone:

- **cgroup v2**, where mounted and writable (a container usually has its own): the job gets a cgroup
  below the launcher's and each attempt one in it, where every rank is born (the launcher steps in
  while it spawns). Nothing started inside can leave without privileges; ``cgroup.kill`` (Linux
  5.14; older kernels: freeze, SIGKILL every member, thaw) ends an attempt, or the whole job, at once.
- **everywhere**: every process the job starts carries ``LAUNCHER_JOB_TOKEN=<job>.<leaf>`` (a leaf
  per spawn) in its environment, and the launcher is a child subreaper, so a process that left its
  group re-parents to the launcher when its parent dies. One pass over ``/proc`` finds both kinds.

Processes are only ever signalled after their pid and start time were checked (through a pidfd).
"""

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from launcher.common import envnames
from launcher.common.records import record
from launcher.supervision.cgroup import Cgroup, job_cgroup, not_used, read_file, remove_stale, write_file

log = logging.getLogger(__name__)

_POLL = 0.002  # seconds between checks while killed processes finish dying
#: Scans more, ``_POLL`` apart, while a process shows an empty environment: one in the middle of an
#: exec does (the new memory is in place before its environment is), one started with none always.
_EXEC_RECHECKS = 5
_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (no environment, never ours)


@record(frozen=True)
class Stray:
    """A process of the job found outside its rank's process group, and killed.

    Attributes:
        pid: Its pid.
        cmdline: Its command line (at most 200 characters).
        found: How it was found: ``cgroup``, ``token`` (environment) or ``reparented`` (to the launcher).
    """

    pid: int
    cmdline: str
    found: str

    def to_json(self) -> dict:
        """The event's form."""
        return dataclasses.asdict(self)


@record(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the sweep needs."""

    pid: int
    state: str
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, identifies the process
    flags: int = 0  # the kernel's PF_* flags

    @property
    def kernel_thread(self) -> bool:
        """A kernel thread: no environment to read, never a process of the job."""
        return bool(self.flags & _PF_KTHREAD)


def parse_stat(data: bytes) -> ProcStat:
    """Parse ``/proc/<pid>/stat`` (the command name may contain spaces and parentheses)."""
    head, _, rest = data.rpartition(b")")
    fields = rest.split()
    return ProcStat(int(head.split(b"(", 1)[0]), fields[0].decode(), int(fields[1]), int(fields[2]),
                    int(fields[19]), int(fields[6]))


def read_stat(pid: int) -> Optional[ProcStat]:
    """``/proc/<pid>/stat`` parsed, or None when the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return parse_stat(os.read(fd, 4096))
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def create_time(pid: int) -> Optional[float]:
    """``psutil.Process(pid).create_time()`` from /proc without importing psutil (30 ms): the start in
    clock ticks after boot (``/proc/<pid>/stat`` field 22) plus the boot time; None once it is gone."""
    stat = read_stat(pid)
    if stat is None:
        return None
    try:
        boot = next(float(line.split()[1]) for line in read_file("/proc/stat").splitlines()
                    if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return stat.start / os.sysconf("SC_CLK_TCK") + boot


def cmdline(pid: int) -> str:
    """The command line of ``pid`` for reports ('' once it is gone)."""
    try:
        return read_file(f"/proc/{pid}/cmdline", 4096).replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def kill_verified(pid: int, start: int) -> bool:
    """SIGKILL ``pid`` if it is still the process that started at ``start``; True when signalled."""
    try:
        pidfd = os.pidfd_open(pid)  # pins the process: the pid cannot be reused while we check
    except ProcessLookupError:
        return False
    except OSError:
        pidfd = -1
    try:
        now = read_stat(pid)
        if now is None or now.start != start:
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


@record(frozen=True)
class Leaf:
    """One spawn's share of the job: its environment token and, where cgroups are used, its cgroup.

    Attributes:
        token: ``<job token>.<leaf name>``.
        cgroup: The cgroup (its attempt's) the process was born in, or None.
    """

    token: str
    cgroup: Optional[Cgroup] = None

    @property
    def env(self) -> Dict[str, str]:
        """What the spawned process's environment gets."""
        return {envnames.LAUNCHER_JOB_TOKEN: self.token}


class JobTree:
    """Every process of one job: a cgroup (where usable), an environment token, re-parented orphans.

    Args:
        token: The job's random token.
        cgroup: The job's cgroup (created with the first spawn), or None.
        adopt_orphans: Whether children of this process it did not start belong to the job (the
            launcher: a subreaper whose other children are passed as ``exempt``).
    """

    def __init__(self, token: str, cgroup: Optional[Cgroup] = None, adopt_orphans: bool = False):
        self.token = token
        self.cgroup = cgroup
        self.contained = cgroup is not None  # every rank in a cgroup: attempt ends need no /proc scan
        self.adopt_orphans = adopt_orphans
        own = read_stat(os.getpid())
        self.started = own.start if own else 0  # no process of the job is older than its launcher
        self._created = False
        self._spent: List[Cgroup] = []  # cgroups of ended attempts, removed by tidy()
        self._pending: Optional[Tuple[str, threading.Thread, List[Optional[Cgroup]]]] = None  # prepare()

    @classmethod
    def create(cls, adopt_orphans: bool = False, environ: Optional[Mapping[str, str]] = None) -> "JobTree":
        """A new job with a fresh token; its cgroup where cgroup v2 is usable (see :func:`job_cgroup`)."""
        token = os.urandom(8).hex()  # as secrets.token_hex(8), without importing secrets (hmac, random)
        cgroup = job_cgroup(f"launcher-{os.getpid()}-{token}", os.environ if environ is None else environ)
        return cls(token, cgroup, adopt_orphans)

    def leaf(self, name: str, cgroup: Optional[Cgroup]) -> Leaf:
        """A new leaf ``name`` (unique in the job) for one spawn inside ``cgroup`` (see :meth:`inside`)."""
        return Leaf(f"{self.token}.{name}", cgroup)

    def prepare(self, cgroup_name: str) -> None:
        """Start moving this process into the job's cgroup ``cgroup_name`` now, in a thread, for the
        spawns of a later :meth:`inside` of that name.

        The move waits for the kernel (an RCU grace period: 5-20 ms measured, docs/benchmarks.md,
        launch) without using the CPU: begun before the work that precedes the spawns, it is done by
        the time the first rank starts. Any child started meanwhile is born inside too: call it only
        where the children started before the spawns end before them (a health check, ``npu-smi``), and
        :meth:`unprepare` if the spawns do not come.
        """
        if self._pending is None and self.contained:
            box: List[Optional[Cgroup]] = []
            thread = threading.Thread(target=lambda: box.append(self._enter(cgroup_name)), name="cgroup-move",
                                      daemon=True)
            self._pending = (cgroup_name, thread, box)
            thread.start()

    def unprepare(self) -> None:
        """Back out of a cgroup :meth:`prepare` moved this process into (no-op without one)."""
        cgroup = self._take_pending(None)
        if cgroup is not None:
            self._leave(cgroup)

    def _take_pending(self, cgroup_name: Optional[str]) -> Optional[Cgroup]:
        """Wait for the move :meth:`prepare` began; the cgroup it entered when that is ``cgroup_name``.
        Else this process is back where it was (None)."""
        if self._pending is None:
            return None
        name, thread, box = self._pending
        self._pending = None
        thread.join()
        cgroup = box[0] if box else None
        if cgroup is not None and name != cgroup_name:
            self._leave(cgroup)
            return None
        return cgroup

    @contextlib.contextmanager
    def inside(self, cgroup_name: str) -> Iterator[Optional[Cgroup]]:
        """While spawning: this process sits in the job's cgroup ``cgroup_name``, so children are born there.

        Yields the cgroup, or None without cgroups. Moving this process in and out around a burst of
        spawns cost nothing measurable, less than each child moving itself in before ``exec``
        (docs/process-tree.md); the move in, begun by :meth:`prepare`, is only waited for here. Never
        kill that cgroup from inside the block.
        """
        cgroup = self._take_pending(cgroup_name)
        if cgroup is None:
            cgroup = self._enter(cgroup_name)
        try:
            yield cgroup
        finally:
            if cgroup is not None:
                self._leave(cgroup)

    def _enter(self, cgroup_name: str) -> Optional[Cgroup]:
        """Move this process into the job's cgroup ``cgroup_name`` (created if needed); None without cgroups."""
        if not self.contained or not (self._created or self._create()):
            return None
        cgroup = Cgroup(os.path.join(self.cgroup.path, cgroup_name), self.cgroup.use_kill_file)
        try:
            os.makedirs(cgroup.path, exist_ok=True)
            write_file(cgroup.file("cgroup.procs"), "0")  # "0": this process
        except OSError as exc:
            self._uncontained(f"cannot move into {cgroup.path}: {exc.strerror}")
            cgroup.remove()
            return None
        return cgroup

    def _leave(self, cgroup: Cgroup) -> None:
        try:
            write_file(os.path.join(os.path.dirname(self.cgroup.path), "cgroup.procs"), "0")
        except OSError as exc:  # then kill_leaves spares it, and the /proc sweep does the work
            self._uncontained(f"cannot move back out of {cgroup.path}: {exc.strerror}")

    def _create(self) -> bool:
        self._created = self.contained = self.cgroup.create()
        return self._created

    def _uncontained(self, reason: str) -> None:
        if self.contained:
            self.contained = False
            not_used(reason)

    def kill_leaves(self, leaves: Iterable[Leaf], known_pgids: Iterable[int]) -> List[Stray]:
        """SIGKILL everything in the leaves' cgroups; returns the processes outside ``known_pgids``."""
        known, strays = set(known_pgids), []
        for cgroup in _cgroups(leaves):
            if not cgroup.populated():
                continue
            members = [pid for directory, _dirs, _files in os.walk(cgroup.path) for pid in Cgroup(directory).procs()]
            for pid in members:
                try:
                    if os.getpgid(pid) not in known:
                        strays.append(Stray(pid, cmdline(pid), "cgroup"))
                except ProcessLookupError:
                    continue
            if os.getpid() not in members:  # stuck inside after a failed move back: never kill ourselves
                cgroup.kill()
        return strays

    def settle_leaves(self, leaves: Iterable[Leaf], deadline: float, reap: Callable[[], None]) -> None:
        """Wait (up to ``deadline``) until the leaves' cgroups are empty; :meth:`tidy` removes them.

        Removing a cgroup slowed the spawns around it (measured): the launcher removes the spent
        cgroups a second after the next attempt started.
        """
        for cgroup in _cgroups(leaves):
            while cgroup.populated() and time.monotonic() < deadline:
                reap()
                time.sleep(_POLL)
            self._spent.append(cgroup)

    def tidy(self) -> None:
        """rmdir the cgroups of ended attempts (one still busy stays for :meth:`close`)."""
        self._spent = [cgroup for cgroup in self._spent if not cgroup.remove()]

    def sweep(self, deadline: float, reap: Callable[[], None], exempt: Iterable[int] = (),
              skip_pgids: Iterable[int] = (), leaf: Optional[Leaf] = None) -> List[Stray]:
        """Kill the job's processes found by a /proc scan, until none is left or ``deadline``.

        Found: every process carrying the job's token (only ``leaf``'s when given) and, with
        ``adopt_orphans`` and no ``leaf``, every child of this process; never those in ``exempt`` or
        whose process group is in ``skip_pgids``. Killed ones are reaped through ``reap``.
        """
        token = f"{leaf.token}\0" if leaf is not None else f"{self.token}."
        needle = f"\0{envnames.LAUNCHER_JOB_TOKEN}={token}".encode()
        orphans = self.adopt_orphans and leaf is None
        exempt, skip_pgids = frozenset(exempt), frozenset(skip_pgids)
        named: Dict[int, Stray] = {}
        rechecks = _EXEC_RECHECKS
        while True:
            reap()
            found, unsure = self._scan(needle, orphans, exempt, skip_pgids)
            for stat, how in found:
                if stat.pid not in named:
                    named[stat.pid] = Stray(stat.pid, cmdline(stat.pid), how)
                kill_verified(stat.pid, stat.start)
            rechecks = rechecks - 1 if unsure and not found else rechecks
            if (not found and (not unsure or rechecks < 0)) or time.monotonic() >= deadline:
                return list(named.values())
            time.sleep(_POLL)  # they may have forked (or be exec'ing) meanwhile: scan again

    def _scan(self, needle: bytes, orphans: bool, exempt: FrozenSet[int],
              skip_pgids: FrozenSet[int]) -> Tuple[List[Tuple[ProcStat, str]], bool]:
        """The job's processes found, and whether a process showed an empty environment (maybe one
        in the middle of an exec, whose token the next scan reads)."""
        me, found, unsure = os.getpid(), [], False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me or int(name) in exempt:
                continue
            stat = read_stat(int(name))
            if stat is None or stat.state in "ZX" or stat.pgid in skip_pgids:
                continue
            if orphans and stat.ppid == me:
                found.append((stat, "reparented"))
            elif stat.start >= self.started and not stat.kernel_thread:
                carries = _carries(stat.pid, needle)
                if carries:
                    found.append((stat, "token"))
                unsure = unsure or carries is None
        return found, unsure

    def kill_all(self, deadline: float) -> None:
        """The launcher is gone (orphan guard): kill the job's cgroup and every token carrier, clean up."""
        self.unprepare()  # never kill the cgroup this process is moving into
        if self.cgroup is not None and os.path.isdir(self.cgroup.path):
            self.cgroup.kill()
        self.sweep(deadline, lambda: None)  # in the guard, no child of ours is a job's orphan
        self.close(deadline)

    def remove_stale(self) -> None:
        """Remove the job cgroups killed launchers left beside this job's (the orphan guard does this at
        its start; see :func:`launcher.supervision.cgroup.remove_stale`). Never raises."""
        if self.cgroup is not None:
            try:
                remove_stale(self.cgroup.path)
            except Exception:  # pylint: disable=broad-except - a tidy-up must never cost the guard
                pass

    def close(self, deadline: float = 0.0) -> None:
        """Remove the job's cgroup, retrying until ``deadline`` while its last processes die."""
        self.unprepare()  # prepared for spawns that never came (the run ended before them)
        while self.cgroup is not None and not self.cgroup.remove() and time.monotonic() < deadline:
            time.sleep(_POLL)


def _cgroups(leaves: Iterable[Leaf]) -> List[Cgroup]:
    """The leaves' cgroups, each once (the ranks of an attempt share one)."""
    return list({leaf.cgroup.path: leaf.cgroup for leaf in leaves if leaf.cgroup is not None}.values())


def _carries(pid: int, needle: bytes) -> Optional[bool]:
    """Whether ``pid``'s environment holds ``needle``; None when it reads empty (see ``_EXEC_RECHECKS``)."""
    try:
        environ = read_file(f"/proc/{pid}/environ")
    except OSError:  # gone, or another user's
        return False
    return (needle in b"\0" + environ) if environ else None


def report_escaped(emit: Callable[..., object], strays: Sequence[Stray], **fields: object) -> None:
    """Log and emit ``escaped_processes`` for the processes killed outside their rank's group."""
    if not strays:
        return
    log.warning("killed %d process(es) that left their rank's process group: %s", len(strays),
                "; ".join(f"pid {s.pid} ({s.cmdline or '?'}; found by {s.found})" for s in strays))
    emit("escaped_processes", processes=[s.to_json() for s in strays], **fields)
