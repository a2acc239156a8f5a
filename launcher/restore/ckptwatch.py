"""The inotify half of the checkpoint index (:mod:`launcher.restore.ckptindex`): its watches, and
the events that mark rank directories for re-listing, files as complete, and ``.saves/`` changes.

Split out of the index for size; :class:`IndexWatches` is a base of
:class:`launcher.restore.ckptindex.CheckpointIndex` and works on that object's state.
"""

import errno
import logging
import os
from typing import Optional

from launcher.common.filewatch import (IN_CLOSE_WRITE, IN_CREATE, IN_DELETE, IN_IGNORED, IN_MOVED_FROM, IN_MOVED_TO,
                                       IN_Q_OVERFLOW, LOST_MASK, WATCH_MASK, parse_events)

logger = logging.getLogger(__name__)

#: Seconds from a burst of inotify events to the listing of the directories they changed.
UPDATE_DELAY = 0.2
_ROOT, _REPORTS = -1, -2  # watch descriptor owners besides the ranks
_READ_SIZE = 64 * 1024


class IndexWatches:  # pylint: disable=too-few-public-methods
    """inotify for :class:`launcher.restore.ckptindex.CheckpointIndex` (its attributes, its ``update``)."""

    def fileno(self) -> Optional[int]:
        """The inotify descriptor to drain from an event loop (:meth:`drain`), None without inotify."""
        return self._fd

    def _start_inotify(self) -> None:
        from launcher.common.filewatch import _load_inotify  # pylint: disable=import-outside-toplevel

        try:
            self._inotify = _load_inotify()
            self._fd = self._inotify.init()
        except (ImportError, AttributeError, OSError) as exc:
            logger.info("inotify unavailable (%s); checkpoint index follows directory mtimes only", exc)
            self._inotify = self._fd = None

    def _watch(self, path: str, rank: int) -> bool:
        """Watch ``path`` for ``rank`` (or ``_ROOT``, ``_REPORTS``); returns whether it is watched."""
        if self._fd is None:
            return False
        try:
            self._wds[self._inotify.add_watch(self._fd, path, WATCH_MASK)] = rank
        except OSError as exc:
            if rank == _REPORTS:
                return False  # .saves/ not made yet (the root's event says when) or gone: listed instead
            if exc.errno == errno.ENOSPC and self._all_watched:  # fs.inotify.max_user_watches
                logger.warning("checkpoint index: out of inotify watches at %s; following directory mtimes", path)
            self._all_watched = False  # unwatched directories: their mtimes tell
            return False
        return True

    def drain(self) -> None:
        """Read the queued inotify events: mark changed rank directories, note completed files."""
        while self._fd is not None:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            for wd, mask, name in parse_events(data):
                self._event(wd, mask, name)
            pending = self._dirty or (self._reports is not None and self._reports.pending())
            if self._call_later is not None and pending and not self._update_pending:
                self._update_pending = True  # one listing per burst of events, not one per event
                self._call_later(UPDATE_DELAY, self.update)

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:  # events lost: trust nothing that came from them
            self._dirty.update(self._ranks)
            self._complete.clear()
            self._root_stamp = None
            if self._reports is not None:
                self._reports.lost()
            return
        rank = self._wds.get(wd)
        if rank is None:
            return
        if rank == _REPORTS and not mask & LOST_MASK:
            if name and mask & (IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM):
                self._reports.event(name, bool(mask & (IN_CREATE | IN_MOVED_TO)))
            return
        if rank < 0 or mask & LOST_MASK:
            self._root_stamp = None  # list the root again (re-watches a re-created rank directory)
            if rank == _REPORTS:
                self._reports.follow(False)  # listed from now on, until the root's listing re-watches it
            if mask & IN_IGNORED:
                del self._wds[wd]
            return
        self._dirty.add(rank)
        if name:
            path = os.path.join(self._ranks[rank].path, name) if rank in self._ranks else None
            if path is not None and mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
                self._complete.add(path)
            elif path is not None:
                self._complete.discard(path)
