"""cgroup v2 for the job: where this process's cgroup is, and one cgroup directory's operations.

Used by :mod:`launcher.supervision.jobtree`. The cgroup v2 mount is found in ``/proc/self/mountinfo`` (a hybrid
host mounts it at ``/sys/fs/cgroup/unified``, a container usually at ``/sys/fs/cgroup``), this
process's cgroup in ``/proc/self/cgroup`` (the ``0::`` line).
"""

import logging
import os
import signal
from typing import List, Mapping, Optional, Tuple

from launcher.common import envnames

log = logging.getLogger(__name__)


def read_file(path: str, limit: int = 1 << 20) -> bytes:
    """The content of a /proc or cgroup file (up to ``limit`` bytes: such files report size 0)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file(path: str, text: str) -> None:
    """One write: a cgroup interface file takes each write as one command."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup2_mount(mountinfo: str) -> Optional[Tuple[str, str]]:
    """``(root, mount point)`` of the first cgroup2 mount in ``/proc/self/mountinfo`` text, or None."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields = before.split()
        if sep and len(fields) >= 5 and after.split()[:1] == ["cgroup2"]:
            return _unescape(fields[3]), _unescape(fields[4])
    return None


def own_cgroup(proc_cgroup: str) -> Optional[str]:
    """This process's cgroup v2 path from ``/proc/self/cgroup`` text (the ``0::`` line), or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::/") and not line.endswith(" (deleted)"):
            return line[3:]
    return None


def cgroup_directory(root: str, mount_point: str, path: str) -> Optional[str]:
    """Where cgroup ``path`` is visible under a cgroup2 mount of ``root`` at ``mount_point``, or None."""
    root = root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None  # the mount shows another part of the hierarchy
    return (mount_point.rstrip("/") + path[len(root):].rstrip("/")) or "/"


class Cgroup:
    """One cgroup v2 directory.

    Args:
        path: The directory.
        use_kill_file: Use ``cgroup.kill``; False freezes and kills the members one by one instead.
    """

    def __init__(self, path: str, use_kill_file: bool = True):
        self.path = path
        self.use_kill_file = use_kill_file

    def file(self, name: str) -> str:
        """Path of one of its interface files."""
        return os.path.join(self.path, name)

    def procs(self) -> List[int]:
        """Pids of its members (not of its children cgroups); empty once it is gone."""
        try:
            return [int(pid) for pid in read_file(self.file("cgroup.procs")).split()]
        except OSError:
            return []

    def populated(self) -> bool:
        """Whether a live process is in it or below it (zombies do not count)."""
        try:
            return b"populated 1" in read_file(self.file("cgroup.events"))
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL every process in it and below it."""
        try:
            if self.use_kill_file and os.path.exists(self.file("cgroup.kill")):  # Linux 5.14
                write_file(self.file("cgroup.kill"), "1")
            else:
                self._freeze_and_kill()
        except OSError as exc:
            log.warning("cannot kill cgroup %s: %s", self.path, exc.strerror)

    def _freeze_and_kill(self) -> None:
        """Before ``cgroup.kill``: frozen members cannot fork while each gets its SIGKILL."""
        write_file(self.file("cgroup.freeze"), "1")
        try:
            for directory, _dirs, _files in os.walk(self.path):
                for pid in Cgroup(directory).procs():
                    try:
                        os.kill(pid, signal.SIGKILL)  # a member of our cgroup: no pid reuse possible
                    except ProcessLookupError:
                        pass
        finally:
            write_file(self.file("cgroup.freeze"), "0")

    def create(self) -> bool:
        """mkdir it; False (after one info line) when that fails or it cannot be killed."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            not_used(f"cannot create {self.path}: {exc.strerror}")
            return False
        self.use_kill_file = self.use_kill_file and os.path.exists(self.file("cgroup.kill"))  # Linux 5.14
        if not self.use_kill_file and not os.path.exists(self.file("cgroup.freeze")):  # Linux 5.2
            self.remove()
            not_used("neither cgroup.kill nor cgroup.freeze (Linux older than 5.2)")
            return False
        return True

    def remove(self) -> bool:
        """rmdir it and its (empty) children; False while a process is still in it."""
        for directory, _dirs, _files in os.walk(self.path, topdown=False):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True


def remove_stale(own: str) -> List[str]:
    """Remove the job cgroups that launchers killed together with their orphan guard left beside
    ``own`` (a SIGKILL of the launcher's whole tree: nothing was left to clean up after it).

    Such a cgroup is named ``launcher-<pid>-<token>`` and is stale when its pid is this launcher's own
    (the launcher that had it before ended) or belongs to no process, and no live process is in it or
    below it (the kernel refuses to remove one that has: a job still running keeps its cgroup).

    Returns:
        The paths removed.
    """
    parent, name = os.path.split(own)
    mine = name.split("-")[1]
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for entry in entries:
        parts = entry.split("-")
        if entry == name or len(parts) != 3 or parts[0] != "launcher" or not parts[1].isdigit():
            continue
        if parts[1] != mine and _exists(int(parts[1])):
            continue
        stale = Cgroup(os.path.join(parent, entry))
        if not stale.populated() and stale.remove():
            removed.append(stale.path)
    return removed


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it exists
        return True
    return True


def job_cgroup(name: str, environ: Mapping[str, str]) -> Optional[Cgroup]:
    """The (not yet created) cgroup ``name`` below this process's own, or None where unusable.

    Logs one info line saying why when cgroup v2 is absent, read-only or switched off.
    """
    if environ.get(envnames.LAUNCHER_CGROUP, "auto") == "off":
        reason = f"{envnames.LAUNCHER_CGROUP}=off"
    else:
        try:
            mount = cgroup2_mount(read_file("/proc/self/mountinfo").decode(errors="replace"))
            own = own_cgroup(read_file("/proc/self/cgroup").decode(errors="replace"))
        except OSError as exc:
            mount = own = None
            log.debug("cannot read /proc/self: %s", exc)
        parent = cgroup_directory(*mount, own) if mount and own else None
        if parent and os.access(parent, os.W_OK):
            return Cgroup(os.path.join(parent, name))
        reason = ("no cgroup v2 mount" if not mount else "this process's cgroup is not under the mount"
                  if not parent else f"{parent} is not writable")
    not_used(reason)
    return None


def not_used(reason: str) -> None:
    """The one info line saying why the job runs without a cgroup."""
    log.info("job cgroup not used (%s): processes that leave their rank's group are found by their "
             "environment token and as re-parented orphans instead", reason)
