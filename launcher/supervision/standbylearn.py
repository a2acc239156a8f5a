"""What ``--preload auto`` learns: the modules the ranks import, and the memory left for standbys.

The ranks record the modules they import (``launcher/rankhooks/launcher_imports.py``, installed by the
hooks' ``sitecustomize``) into one file per launcher session; :class:`ImportsLog` reads what was
added since the last read, and whether anything was (the ranks still importing). :func:`memory_room` is the memory the standbys may take: the tightest
memory limit among this process's cgroups (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) minus
what the cgroup uses without its reclaimable page cache, or the machine's ``MemAvailable`` when no
limit is set, less a margin.
"""

import os
from typing import List, Optional, Tuple

from launcher.supervision.cgroup import cgroup2_mount, cgroup_directory, own_cgroup, read_file

#: Kept free besides the standbys: a tenth of the limit (or of the machine), at least this.
MIN_MARGIN = 256 << 20
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


class ImportsLog:
    """The module names the ranks recorded, read incrementally (complete lines only).

    Args:
        path: The file the ranks append to (``LAUNCHER_IMPORTS_FILE``).
    """

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = b""
        self.grew = False  # the last read found anything appended: names or the ranks' signs of life

    def read_new(self, limit: int = 1 << 20) -> List[str]:
        """Names appended since the last call, in order (duplicates included); [] when none or unreadable.
        Empty lines are the ranks' signs of life while they import (they set :attr:`grew` only)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            data = os.pread(fd, limit, self._offset)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        self._offset += len(data)
        self.grew = bool(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines if line]


def memory_room() -> Tuple[Optional[int], str]:
    """Bytes the standbys may still take, and where the figure comes from (None: not known)."""
    found = _cgroup_free() or _machine_free()
    if found is None:
        return None, "no memory figures (/proc/meminfo unreadable)"
    free, total, where = found
    margin = max(total // 10, MIN_MARGIN)
    return free - margin, f"{where}, less a margin of {margin >> 20} MiB"


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 when it is gone)."""
    try:
        return int(read_file(f"/proc/{pid}/statm").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _machine_free() -> Optional[Tuple[int, int, str]]:
    try:
        fields = {line.split(":")[0]: int(line.split()[1]) << 10
                  for line in read_file("/proc/meminfo").decode().splitlines() if line.endswith(" kB")}
        return fields["MemAvailable"], fields["MemTotal"], f"MemAvailable {fields['MemAvailable'] >> 20} MiB"
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _cgroup_free() -> Optional[Tuple[int, int, str]]:
    """``(free, limit, description)`` of the tightest limited cgroup above this process, or None."""
    try:
        mountinfo = read_file("/proc/self/mountinfo").decode(errors="replace")
        own = read_file("/proc/self/cgroup").decode(errors="replace")
    except OSError:
        return None
    best = None
    for directory, files in _memory_directories(mountinfo, own):
        while True:
            figures = _figures(directory, files)
            if figures is not None and (best is None or figures[0] < best[0]):
                best = figures
            parent = os.path.dirname(directory)
            if parent == directory or not os.path.exists(os.path.join(parent, files[0])):
                break
            directory = parent
    return best


def _memory_directories(mountinfo: str, own: str) -> List[Tuple[str, Tuple[str, str, str]]]:
    """This process's memory cgroup directories, each with its files (limit, usage, inactive-file key)."""
    found = []
    mount = cgroup2_mount(mountinfo)
    path = own_cgroup(own)
    if mount and path:
        directory = cgroup_directory(*mount, path)
        if directory:
            found.append((directory, ("memory.max", "memory.current", "inactive_file")))
    v1_path = next((line.split(":", 2)[2] for line in own.splitlines()
                    if line.count(":") >= 2 and "memory" in line.split(":")[1].split(",")), None)
    for line in mountinfo.splitlines():
        before, _sep, after = line.partition(" - ")
        fields = before.split()
        if v1_path and after.split()[:1] == ["cgroup"] and "memory" in after.split()[-1].split(","):
            directory = cgroup_directory(fields[3], fields[4], v1_path)
            if directory:
                found.append((directory, ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")))
    return found


def _figures(directory: str, files: Tuple[str, str, str]) -> Optional[Tuple[int, int, str]]:
    limit_file, usage_file, inactive_key = files
    try:
        text = read_file(os.path.join(directory, limit_file)).strip()
        if text == b"max" or int(text) >= _NO_LIMIT:
            return None
        limit = int(text)
        usage = int(read_file(os.path.join(directory, usage_file)))
        stat_text = read_file(os.path.join(directory, "memory.stat")).decode()
        stat = dict(line.split()[:2] for line in stat_text.splitlines())
        used = usage - int(stat.get(inactive_key, 0))
    except (OSError, ValueError):
        return None
    return limit - used, limit, (f"{os.path.join(directory, limit_file)} {limit >> 20} MiB, "
                                 f"in use {used >> 20} MiB")
