"""The inotify half of the checkpoint index (:mod:`launcher.restore.ckptindex`): its watches, the
events that mark rank directories for re-listing, files as complete, and ``.saves/`` changes, and
the background thread that applies them as they come.

Split out of the index for size; :class:`IndexWatches` is a base of
:class:`launcher.restore.ckptindex.CheckpointIndex` and works on that object's state.
:class:`Indexer` is the thread (``ckpt-index``) that keeps that index up to date off the
supervisor's event loop: the loop never reads an event, lists a directory or parses a name.
"""

import errno
import functools
import logging
import math
import os
import select
import threading
import time
from typing import Any, Callable, List, Optional, Set

from launcher.common.filewatch import (IN_CLOSE_WRITE, IN_CREATE, IN_DELETE, IN_IGNORED, IN_ISDIR, IN_MOVED_FROM,
                                       IN_MOVED_TO, IN_Q_OVERFLOW, LOST_MASK, WATCH_MASK, parse_events)
from launcher.common.gcpause import freeze_survivors

logger = logging.getLogger(__name__)

#: Seconds from a burst of inotify events to the update that absorbs it. Short: a reporting rank's
#: save costs the update no listing (``ckptsaves``), and whatever a round leaves unabsorbed when a
#: failure ends it is the plan's to read.
UPDATE_DELAY = 0.05
#: Seconds between the indexer's looks at the reports directory where inotify does not see every
#: save (a shared file system, or no inotify): one ``stat`` each when nothing changed. Short, so that
#: a round is absorbed while the ranks are being stopped; it runs in the indexer's thread.
POLL_SECONDS = 0.25
#: Seconds without a step that absorbed anything before the collect-and-freeze pass (once per round).
REFREEZE_QUIET = 1.0
#: Seconds between tries of a collect-and-freeze pass that a plan in progress put off.
REFREEZE_RETRY = 0.5
_ROOT, _REPORTS = -1, -2  # watch descriptor owners besides the ranks
#: A touched name's state after its last event (:meth:`IndexWatches._rank_event`).
WRITTEN, WRITING, GONE = "written", "writing", "gone"
_READ_SIZE = 64 * 1024


def locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the index's lock: the indexer thread and the plan's scan take turns,
    so the plan waits only for the step the indexer is in (and then reads what is left itself)."""
    @functools.wraps(method)
    def holding(self: Any, *args: Any) -> Any:
        with self._lock:  # pylint: disable=protected-access
            return method(self, *args)
    return holding


class IndexWatches:  # pylint: disable=too-few-public-methods
    """inotify for :class:`launcher.restore.ckptindex.CheckpointIndex` (its attributes, its ``update``)."""

    def fileno(self) -> Optional[int]:
        """The inotify descriptor the index thread waits on (:meth:`drain`), None without inotify."""
        return self._fd

    @locked
    def refreeze(self) -> bool:
        """Once a save round was absorbed, take what it added out of the garbage collector's passes
        (:func:`launcher.common.gcpause.freeze_survivors`). Returns False when that was put off (a
        plan is running)."""
        if not self._freeze_due:
            return True
        self._freeze_due = not freeze_survivors()
        return not self._freeze_due

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

    @locked
    def drain(self) -> None:
        """Read the queued inotify events: mark changed rank directories, note completed files."""
        while self._fd is not None:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            for wd, mask, name in parse_events(data):
                self._event(wd, mask, name)

    def pending(self) -> bool:
        """Whether drained events left directories to list or reports to apply (an update is due)."""
        return bool(self._dirty) or bool(self._touched) or (self._reports is not None and self._reports.pending())

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:  # events lost: trust nothing that came from them
            self._overflowed()
            return
        rank = self._wds.get(wd)
        if rank is None:
            return
        self._events += 1  # one queue for every watch: this orders a file's events and its report's
        if rank == _REPORTS and not mask & LOST_MASK:
            if name and mask & (IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM):
                self._reports.event(name, bool(mask & (IN_CREATE | IN_MOVED_TO)), self._events)
        elif rank < 0 or mask & LOST_MASK:
            self._watch_lost(wd, rank, mask)
        else:
            self._rank_event(rank, mask, name)

    def _overflowed(self) -> None:
        """The event queue overflowed: every directory is listed again, no file counts as complete."""
        self._dirty.update(self._ranks)
        self._touched.clear()
        self._complete.clear()
        self._root_stamp = None
        if self._reports is not None:
            self._reports.lost()

    def _watch_lost(self, wd: int, rank: int, mask: int) -> None:
        """An event of the root or ``.saves/`` (other than a report's), or a watched directory gone."""
        self._root_stamp = None  # list the root again (re-watches a re-created rank directory)
        if rank == _REPORTS:
            self._reports.follow(False)  # listed from now on, until the root's listing re-watches it
        if mask & IN_IGNORED:
            del self._wds[wd]

    def _rank_event(self, rank: int, mask: int, name: str) -> None:
        """A change in ``rank``'s directory: the name is noted as touched (the rank's reports may
        account for it: :meth:`launcher.restore.ckptsaves.ReportedSaves._explain`), else the directory
        is listed again; a file closed after writing or renamed in is complete until it is touched again."""
        entry = self._ranks.get(rank)
        if not name or entry is None or mask & IN_ISDIR:
            self._dirty.add(rank)
            return
        path = os.path.join(entry.path, name)
        if mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
            self._complete.add(path)
            state = WRITTEN
        else:
            self._complete.discard(path)
            state = GONE if mask & (IN_DELETE | IN_MOVED_FROM) else WRITING
        self._touched.setdefault(rank, {})[name] = (self._events, state)


class Indexer:
    """The thread that keeps a checkpoint index up to date (issue #19): it waits on the index's
    inotify descriptor, drains the events as they come, runs the index's ``update`` ``UPDATE_DELAY``
    after a burst (one listing per burst, not per event) and its ``poll`` every ``POLL_SECONDS``.
    Once a round has been quiet for ``REFREEZE_QUIET``, whether this thread or a plan's scan absorbed
    it (the first plan's full listing included), it runs the index's ``refreeze``. Each step holds the
    index's lock; an error is logged and the thread goes on (the plan's scan reads whatever a failed
    step left).

    Args:
        index: the :class:`launcher.restore.ckptindex.CheckpointIndex` (``fileno``, ``drain``,
            ``pending``, ``update``, ``poll``, ``polls``).
    """

    def __init__(self, index: Any):
        self._index = index
        self._wake_read, self._wake_write = os.pipe()  # stop() and nudge() wake the thread from its wait
        os.set_blocking(self._wake_write, False)
        self._stopped = threading.Event()
        self.absorbed = threading.Condition()  # notified after every update and poll
        self.steps = 0  # updates and polls run (under ``absorbed``)
        self.busy_seconds = 0.0  # the last update's or poll's duration
        self._busy, self._update_at, self._refreeze_at = False, math.inf, math.inf
        self._next_poll = math.inf
        self._absorbed = 0  # the index's absorbed_steps when the thread last looked
        self._thread = threading.Thread(target=self._run, name="ckpt-index", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after the step it is in and wait for it (idempotent)."""
        if not self._stopped.is_set():
            self._stopped.set()
            try:
                os.write(self._wake_write, b"x")
            except BlockingIOError:  # full of unread nudges: it wakes anyway
                pass
        self._thread.join(timeout)
        if not self._thread.is_alive() and self._wake_read >= 0:
            fds = (self._wake_read, self._wake_write)
            self._wake_read = self._wake_write = -1  # before the close: nudge() never writes to a reused number
            for fd in fds:
                os.close(fd)

    def wait_steps(self, steps: int, timeout: Optional[float] = None) -> bool:
        """Wait until ``steps`` updates and polls ran in all (benchmarks, tests); whether they did."""
        with self.absorbed:
            return self.absorbed.wait_for(lambda: self.steps >= steps, timeout)

    def idle(self) -> bool:
        """Whether the thread waits with nothing to do: no step running or due, no unread event
        (benchmarks, tests)."""
        if self._busy or self._update_at != math.inf:
            return False
        fd = self._index.fileno()
        return fd is None or not _ready([fd], 0.0)

    def nudge(self) -> None:
        """Wake the thread to look at the index again (a plan's scan absorbed changes itself: their
        collect-and-freeze pass is due once the job runs quietly)."""
        fd = self._wake_write
        if fd < 0 or self._stopped.is_set():
            return
        try:
            os.write(fd, b"n")
        except OSError:  # full of unread nudges (it wakes anyway), or closed by a stop meanwhile
            pass

    def _run(self) -> None:
        index = self._index
        self._next_poll = time.monotonic() + POLL_SECONDS if index.polls() else math.inf
        while not self._stopped.is_set():
            ready = self._wait()
            if ready is None or self._stopped.is_set():
                return
            try:
                self._due(ready)
            except Exception:  # pylint: disable=broad-except  # the thread must outlive one bad step
                logger.warning("checkpoint index: updating failed; the plan's scan reads it instead", exc_info=True)

    def _wait(self) -> Optional[Set[int]]:
        """Wait for an event, a nudge or the next step due; the ready descriptors, None when one was
        closed under us (close() gave up waiting for a long step)."""
        fd = self._index.fileno()
        watched = [self._wake_read] if fd is None else [self._wake_read, fd]
        due = min(self._update_at, self._next_poll, self._refreeze_at)
        self._busy = False
        ready = _ready(watched, None if due == math.inf else max(0.0, due - time.monotonic()))
        if ready is None and not self._stopped.is_set():
            logger.warning("checkpoint index: its descriptor was closed; the thread stops and the "
                           "plan's scan reads what changed instead")
        self._busy = True
        return ready

    def _due(self, ready: Set[int]) -> None:
        """Whatever is due after the wait: drain the events, the update after a burst, the poll, and
        the collect-and-freeze pass once a round (absorbed here or by a plan) has been quiet."""
        index = self._index
        fd = index.fileno()
        if self._wake_read in ready:
            os.read(self._wake_read, _READ_SIZE)  # nudges (a stop returns before this)
        if fd is not None and fd in ready:
            index.drain()
            if self._update_at == math.inf and index.pending():
                self._update_at = time.monotonic() + UPDATE_DELAY  # the rest of the burst comes meanwhile
        now = time.monotonic()
        if now >= self._update_at:
            self._update_at = math.inf
            self._step(index.update)
        if now >= self._next_poll:
            self._next_poll = now + POLL_SECONDS
            self._step(index.poll)
        if index.absorbed_steps != self._absorbed:  # once the round is over, not after each of its steps
            self._absorbed = index.absorbed_steps
            self._refreeze_at = time.monotonic() + REFREEZE_QUIET
        elif now >= self._refreeze_at:
            self._refreeze_at = math.inf if index.refreeze() else now + REFREEZE_RETRY

    def _step(self, method: Callable[[], None]) -> None:
        """Run one update or poll and count it."""
        start = time.perf_counter()
        try:
            method()
        finally:
            with self.absorbed:
                self.busy_seconds = time.perf_counter() - start
                self.steps += 1
                self.absorbed.notify_all()


def _ready(fds: List[int], timeout: Optional[float]) -> Optional[Set[int]]:
    """The ``fds`` readable within ``timeout`` seconds (None: no limit); None when one is closed.

    ``poll``, not ``select``: ``select`` cannot take a descriptor numbered 1024 or more (a launcher
    with many ranks' pipes and log files open reaches that), and raised then, ending the thread."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        events = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    except OSError:
        return None
    if any(mask & select.POLLNVAL for _, mask in events):
        return None
    return {fd for fd, mask in events if mask & (select.POLLIN | select.POLLERR | select.POLLHUP)}
