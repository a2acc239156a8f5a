"""Digest checks of checkpoint files, remembered between restarts and run off the critical path (issue #19).

The planner checks every file its plan picks against the ``<file>.sha256`` sidecar
(:func:`launcher.restore.ckptnames.verify_digest`), which reads the whole file: with multi-GB
checkpoints and 2,048 picks, minutes before every restart, from every node's launcher.
:class:`DigestCache` remembers each result under the ``(st_dev, st_ino, st_size, st_mtime_ns)`` of
both the file and its sidecar at the check, so a file is hashed once; a file or sidecar rewritten,
replaced or resized since has another key and is hashed again. :class:`DigestWorker`, owned by the
checkpoint index, hashes files as they complete in one daemon thread at the lowest priority: the
index only queues batches of paths (never blocks: a full queue drops them, the planner then hashes them).
"""

import logging
import os
import queue
import threading
import time
from typing import Dict, Optional, Sequence, Tuple

from launcher.restore.ckptnames import DIGEST_SUFFIX, verify_digest

logger = logging.getLogger(__name__)

#: Batches of paths waiting for the worker; beyond it new ones are dropped (checked by the planner
#: instead).
QUEUE_SIZE = 4096
#: A file modified this recently (ns) before its hash began could be rewritten within the same
#: timestamp tick (Linux stamps files with a coarse clock) without changing its key: not kept.
RACY_NS = 50_000_000
_StatKey = Optional[Tuple[int, int, int, int]]
_Key = Tuple[_StatKey, _StatKey]


def _stat_key(path: str) -> _StatKey:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class DigestCache:
    """:func:`verify_digest` results per path, valid while the file and its sidecar are unchanged.
    Safe to share between threads: the lock guards only the dict, never a hash."""

    def __init__(self) -> None:
        self._results: Dict[str, Tuple[_Key, Optional[bool]]] = {}
        self._lock = threading.Lock()

    def check(self, path: str) -> Optional[bool]:
        """What ``verify_digest(path)`` returns now, hashing only when the cache lacks it.

        The key is taken before the hash and again after it; only a result both agree on is kept
        (a file written meanwhile is checked again next time), and only for a file older than
        ``RACY_NS`` when its hash began."""
        key = (_stat_key(path + DIGEST_SUFFIX), _stat_key(path))
        if key[0] is None:
            return None  # no sidecar: nothing to check, no file opened
        with self._lock:
            hit = self._results.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        began = time.time_ns()
        result = verify_digest(path)
        settled = all(part is None or part[3] < began - RACY_NS for part in key)
        if settled and (_stat_key(path + DIGEST_SUFFIX), _stat_key(path)) == key:
            with self._lock:
                self._results[path] = (key, result)
        return result

    def forget(self, path: str) -> None:
        """Drop ``path``'s result (the file was deleted): the cache stays as big as the tree."""
        with self._lock:
            self._results.pop(path, None)


class DigestWorker:
    """One daemon thread that fills a :class:`DigestCache` with the files queued by :meth:`submit`
    (a batch per call: one queue operation for a save round, not one per file),
    started at the first one, at the lowest CPU priority (``nice`` 19 for that thread on Linux).

    Args:
        cache: where the results go.
    """

    def __init__(self, cache: DigestCache):
        self.cache = cache
        self._queue: "queue.Queue[Optional[Sequence[str]]]" = queue.Queue(QUEUE_SIZE)
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def submit(self, paths: Sequence[str]) -> None:
        """Queue ``paths`` for a check; never blocks (a full queue or a stopped worker drops them)."""
        if self._stopped.is_set() or not paths:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ckpt-digest", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(paths)
        except queue.Full:
            pass  # the planner checks what the worker did not

    def stop(self) -> None:
        """Ask the thread to finish after the file it is hashing (idempotent, does not wait)."""
        self._stopped.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread sees the event before its next file

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the thread to finish the queue (tests); returns at once when never started."""
        if self._thread is None:
            return
        if self._stopped.is_set():
            self._thread.join(timeout)
        else:
            self._queue.join()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass  # elsewhere it runs at the process's priority; the GIL is released while it hashes
        while not self._stopped.is_set():
            paths = self._queue.get()
            try:
                for path in paths or ():
                    if self._stopped.is_set():
                        break
                    self._check(path)
            finally:
                self._queue.task_done()

    def _check(self, path: str) -> None:
        try:
            self.cache.check(path)
        except Exception:  # pylint: disable=broad-except  # a worker must not die on one file
            logger.debug("digest check of %s failed", path, exc_info=True)
