"""Watch one file path from the supervisor's event loop, without busy polling.

The path is followed, not the file: Kubernetes updates a ConfigMap volume by an atomic symlink swap
(``reset.json -> ..data/reset.json``, ``..data -> ..<timestamp>``; an update writes a new timestamped
directory and renames a new ``..data`` symlink over the old one), so the inode behind the path changes
on every update and a watch on the file itself would miss all but the first. :class:`PathWatcher`
therefore watches the *directory* containing the path with Linux inotify (through ctypes, no extra
dependency), which sees the rename of ``..data`` as well as in-place writes, deletes and re-creates.

Bursts of events are coalesced (``debounce``); a slow ``stat()`` poll runs as a safety net because
inotify can overflow or miss a change behind a symlink that points elsewhere; where inotify is not
available at all (not Linux, no libc symbol, out of inotify instances or watches) the watcher polls
``stat()`` of the path every ``poll_interval`` instead. ``on_change`` means "the content visible at
the path *may* have changed": it can be called when nothing changed, and callers compare contents.

:func:`shared_file_system` says where inotify cannot see every write (other machines write there).
"""

import errno
import logging
import os
import struct
import sys
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

log = logging.getLogger(__name__)

# inotify(7) event bits.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000  # set in an event about a subdirectory

#: What is watched on the directory: every way an entry's content or identity can change.
WATCH_MASK = (IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM
              | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#: Events after which the directory watch is gone or stale and must be set again.
LOST_MASK = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then ``len`` bytes of NUL-padded name
_READ_SIZE = 64 * 1024

#: Interval of the safety-net poll while inotify is active.
SAFETY_INTERVAL = 10.0

Signature = Optional[Tuple[Any, ...]]


class _Inotify:
    """The three inotify system calls through libc (ctypes)."""

    def __init__(self, libc: Any, get_errno: Callable[[], int]):
        self._libc, self._get_errno = libc, get_errno

    def _check(self, result: int, what: str) -> int:
        if result < 0:
            code = self._get_errno()
            raise OSError(code, os.strerror(code), what)
        return result

    def init(self) -> int:
        """A new non-blocking, close-on-exec inotify descriptor."""
        return self._check(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1")

    def add_watch(self, fd: int, path: str, mask: int) -> int:
        """Watch descriptor of ``path`` (the same one again if it is already watched)."""
        return self._check(self._libc.inotify_add_watch(fd, os.fsencode(path), mask), path)

    def rm_watch(self, fd: int, wd: int) -> None:
        """Stop a watch (the kernel then queues IN_IGNORED for it)."""
        self._libc.inotify_rm_watch(fd, wd)


def _load_inotify() -> _Inotify:
    """The inotify calls of this system's libc.

    Raises:
        OSError: not Linux, or libc has no inotify (AttributeError and ImportError are also possible).
    """
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "inotify is Linux-only")
    import ctypes  # pylint: disable=import-outside-toplevel

    libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc: no ldconfig subprocess
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_init1.restype = ctypes.c_int
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_add_watch.restype = ctypes.c_int
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.inotify_rm_watch.restype = ctypes.c_int
    return _Inotify(libc, ctypes.get_errno)


def parse_events(data: bytes) -> Iterator[Tuple[int, int, str]]:
    """``(wd, mask, name)`` of each ``struct inotify_event`` in ``data`` (name is '' for the dir)."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        start = offset + _EVENT.size
        name = data[start:start + length].split(b"\0", 1)[0]
        yield wd, mask, os.fsdecode(name)
        offset = start + length


def signature(path: str) -> Signature:
    """What identifies the content visible at ``path`` (symlinks followed); None if it is missing."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return ("error", exc.errno)
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


class PathWatcher:
    """Calls ``on_change()`` from the event loop after the content visible at ``path`` may have changed.

    Args:
        path: The file to follow (through any symlinks, re-resolved on every change).
        on_change: Called without arguments from the event loop; may be called when nothing changed.
            Exceptions it raises propagate to the event loop.
        add_reader, remove_reader, call_later, cancel: The event loop's primitives
            (:class:`launcher.supervision.procgroup.LocalProcessGroup` provides them).
        poll_interval: Seconds between ``stat()`` polls when inotify is unavailable, and between
            attempts to watch a directory that does not exist (yet).
        debounce: Seconds to wait after the first event of a burst before calling ``on_change``
            (events arriving meanwhile are coalesced into that one call).
        safety_interval: Seconds between safety-net ``stat()`` polls while inotify is active.
    """

    def __init__(self, path: str, on_change: Callable[[], None],
                 add_reader: Callable[[int, Callable[[], None]], None], remove_reader: Callable[[int], None],
                 call_later: Callable[[float, Callable[[], None]], Any], cancel: Callable[[Any], None],
                 poll_interval: float = 1.0, debounce: float = 0.05, safety_interval: float = SAFETY_INTERVAL):
        self.path = os.path.abspath(path)
        self._dir = os.path.dirname(self.path)
        self._on_change = on_change
        self._add_reader, self._remove_reader = add_reader, remove_reader
        self._call_later, self._cancel = call_later, cancel
        self._poll_interval, self._debounce, self._safety_interval = poll_interval, debounce, safety_interval
        self._timers: Dict[str, Tuple[object, Any]] = {}  # name -> (token, handle) while pending
        self._inotify: Optional[_Inotify] = None
        self._fd: Optional[int] = None
        self._wd: Optional[int] = None
        self._closed = False
        self._signature = signature(self.path)
        self._start_inotify()
        self._schedule("poll", self._poll_delay(), self._poll)

    @property
    def mode(self) -> str:
        """``"inotify"`` or ``"poll"`` (the fallback)."""
        return "inotify" if self._fd is not None else "poll"

    def close(self) -> None:
        """Release the inotify descriptor and cancel every timer (idempotent)."""
        self._closed = True
        for _token, handle in self._timers.values():
            self._cancel(handle)
        self._timers.clear()
        self._stop_inotify()

    # -- timers ---------------------------------------------------------------------------------
    def _schedule(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` after ``delay`` unless a timer of that name is already pending."""
        if self._closed or name in self._timers:
            return
        token = object()

        def run() -> None:
            if self._closed or self._timers.get(name, (None,))[0] is not token:
                return  # closed, or cancelled and replaced
            del self._timers[name]
            callback()

        self._timers[name] = (token, self._call_later(delay, run))

    def _poll_delay(self) -> float:
        return self._safety_interval if self.mode == "inotify" else self._poll_interval

    # -- inotify --------------------------------------------------------------------------------
    def _start_inotify(self) -> None:
        try:
            inotify = _load_inotify()
            fd = inotify.init()
        except (ImportError, AttributeError, OSError) as exc:
            log.info("inotify unavailable (%s); polling %s every %.1f s", exc, self.path, self._poll_interval)
            return
        self._inotify, self._fd = inotify, fd
        self._add_reader(fd, self._on_readable)
        self._arm(initial=True)

    def _stop_inotify(self) -> None:
        if self._fd is not None:
            self._remove_reader(self._fd)
            os.close(self._fd)
        self._fd = self._wd = None

    def _arm(self, initial: bool = False) -> None:
        """Watch the directory; retry later if it is missing; fall back to polling on other errors."""
        if self._fd is None or self._closed:
            return
        try:
            self._wd = self._inotify.add_watch(self._fd, self._dir, WATCH_MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                log.debug("%s does not exist yet; watching again in %.1f s", self._dir, self._poll_interval)
                self._schedule("arm", self._poll_interval, self._arm)
                return
            log.warning("cannot watch %s (%s); polling %s every %.1f s", self._dir, exc, self.path,
                        self._poll_interval)
            self._fall_back()
            return
        if not initial:
            self._changed()  # the directory (re)appeared: its content may be new

    def _fall_back(self) -> None:
        """Give up inotify for polling at ``poll_interval``."""
        self._stop_inotify()
        pending = self._timers.pop("poll", None)
        if pending is not None:
            self._cancel(pending[1])
        self._schedule("poll", self._poll_interval, self._poll)

    def _on_readable(self) -> None:
        """Drain the inotify queue; any event in the directory counts as a possible change."""
        changed = lost = False
        while self._fd is not None:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            for wd, mask, _name in parse_events(data):
                if mask & IN_Q_OVERFLOW:
                    log.debug("inotify queue overflowed; treating %s as changed", self.path)
                    changed = True
                elif wd == self._wd:
                    changed = True
                    lost = lost or bool(mask & LOST_MASK)
        if lost:
            self._rearm()
        if changed:
            self._changed()

    def _rearm(self) -> None:
        """The directory was deleted, moved or unmounted: drop the stale watch and watch the path again."""
        if self._wd is not None and self._fd is not None:
            self._inotify.rm_watch(self._fd, self._wd)  # no-op if the kernel already dropped it
        self._wd = None
        self._arm()

    # -- change detection -----------------------------------------------------------------------
    def _poll(self) -> None:
        """Periodic ``stat()``: the fallback, or the safety net behind inotify."""
        if signature(self.path) != self._signature:
            self._changed()
        self._schedule("poll", self._poll_delay(), self._poll)

    def _changed(self) -> None:
        self._schedule("debounce", self._debounce, self._fire)

    def _fire(self) -> None:
        self._signature = signature(self.path)
        self._on_change()


#: File system types on which inotify sees every write (all writers are on this machine).
LOCAL_FS_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs"})


def shared_file_system(path: str) -> bool:
    """Whether ``path`` may be written by other machines: any file system type not known to be
    local (NFS, CIFS, Lustre, GPFS, CephFS, FUSE mounts of object stores, ...), or unknown."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                mount = fields[4].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[fields.index("-") + 1]
    except (OSError, ValueError, IndexError):
        return True
    return fstype not in LOCAL_FS_TYPES
