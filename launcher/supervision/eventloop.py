"""Mechanism: the launcher's single-threaded event loop, without the ranks.

One ``selectors`` loop woken by the signal wakeup pipe (SIGCHLD, SIGTERM, ...) and by the file
descriptors its users register (the ranks' output pipes, the control socket, inotify), with timers
and a queue of :mod:`loopevents <launcher.supervision.loopevents>` for the supervisor. Nothing polls:
a child's exit is reaped within milliseconds of its SIGCHLD. :class:`EventLoop` knows children only
by pid; which pid is a rank is :class:`~launcher.supervision.procgroup.LocalProcessGroup`'s business
(``_child_exited``).
"""

import collections
import heapq
import itertools
import os
import selectors
import time
from typing import Callable, Deque, Dict, List, Optional

from launcher.common import signals
from launcher.supervision.loopevents import Event, SignalReceived
from launcher.supervision.states import ExitInfo


class EventLoop:
    """Timers, readers and writers, reaping and the event queue; subclasses say what a child's exit means."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._selector.register(signals.wakeup_fd(), selectors.EVENT_READ, self._on_wakeup)
        self._queue: Deque[Event] = collections.deque()
        self._timers: List[tuple] = []  # heap of (due, seq, callback)
        self._timer_seq = itertools.count()
        self._cancelled: set = set()
        self._watched: Dict[int, Callable[[ExitInfo], None]] = {}
        self._soon: Deque[Callable[[], None]] = collections.deque()  # handed over by other threads

    def wait_event(self, timeout: Optional[float]) -> Optional[Event]:
        """The next event, or None when ``timeout`` seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._queue:
            now = time.monotonic()
            remaining = None if deadline is None else deadline - now
            if remaining is not None and remaining <= 0:
                return None
            if self._timers:
                until_timer = max(0.0, self._timers[0][0] - now)
                remaining = until_timer if remaining is None else min(remaining, until_timer)
            for key, _mask in self._selector.select(remaining):
                key.data()
            self._run_timers()
        return self._queue.popleft()

    def call_later(self, delay: float, callback: Callable[[], None]) -> int:
        """Run ``callback`` from the event loop after ``delay`` seconds; returns a handle."""
        handle = next(self._timer_seq)
        heapq.heappush(self._timers, (time.monotonic() + delay, handle, callback))
        return handle

    def cancel(self, handle: int) -> None:
        """Cancel a ``call_later`` handle (no effect once it ran)."""
        if any(entry[1] == handle for entry in self._timers):
            self._cancelled.add(handle)

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` from the event loop as soon as it wakes, which this makes it do: the one
        method another thread may call (the coordinator's etcd watch tells of a change this way)."""
        self._soon.append(callback)
        signals.wake()

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _due, handle, callback = heapq.heappop(self._timers)
            if handle in self._cancelled:
                self._cancelled.discard(handle)
                continue
            callback()

    def _on_wakeup(self) -> None:
        signals.drain_wakeup()
        while self._soon:
            self._soon.popleft()()
        self._reap()
        signum = signals.pop_pending()
        while signum is not None:
            self._queue.append(SignalReceived(signum))
            signum = signals.pop_pending()

    def _reap(self) -> None:
        """Collect every exited child: ours, and orphans re-parented to us (subreaper / PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            info = ExitInfo(os.waitstatus_to_exitcode(status), time.time())
            watcher = self._watched.pop(pid, None)
            if watcher is not None:
                watcher(info)
            self._child_exited(pid, info)

    def _child_exited(self, pid: int, info: ExitInfo) -> None:
        """A reaped child that may be a rank; the base loop has none."""

    def watch_pid(self, pid: int, callback: Callable[[ExitInfo], None]) -> None:
        """Call ``callback`` when child ``pid`` (not a rank: e.g. a sidecar) is reaped."""
        self._watched[pid] = callback

    def unwatch_pid(self, pid: int) -> None:
        """Forget a ``watch_pid`` (the process became a rank, or is reaped by its owner)."""
        self._watched.pop(pid, None)

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Watch ``fd`` in the event loop; ``callback`` runs when it is readable."""
        self._selector.register(fd, selectors.EVENT_READ, callback)

    def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
        """Watch ``fd`` in the event loop; ``callback`` runs when it is writable (a console backlog)."""
        self._selector.register(fd, selectors.EVENT_WRITE, callback)

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd`` (a reader or a writer)."""
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def post(self, event: Event) -> None:
        """Queue an event produced by a reader callback (e.g. a control request)."""
        self._queue.append(event)
