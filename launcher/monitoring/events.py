"""``events.jsonl``: one JSON object per lifecycle event, with a wall-clock timestamp.

Each event is one ``write`` on an ``O_APPEND`` descriptor, so lines from a launcher and a later
``launcher prestop`` never interleave, and a crash never leaves half a line behind. A write that
fails (full disk, I/O error) is reported once and the run goes on; the next event that can be
written again starts on a fresh line.
"""

import errno
import json
import logging
import os
import time
from typing import Any, Optional

from launcher.common.warnonce import WarnOnce

log = logging.getLogger(__name__)


class EventLog:
    """Appends events to ``path``.

    Args:
        path: The events file (created if missing, appended to across runs).
        run_id: Stamped on every event so several runs in one file stay apart.
    """

    def __init__(self, path: str, run_id: str):
        self.path = path
        self.run_id = run_id
        self._warn = WarnOnce(log)
        self._torn = False  # a short write left part of a line: end it before the next event
        self._fd: Optional[int] = self._open(path)

    def _open(self, path: str) -> Optional[int]:
        """The events file for appending; None, with a warning, for a symlink (it would be followed)
        or a FIFO nobody reads (``O_NONBLOCK``: the open would block prestop in a preStop hook)."""
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                           0o600)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):  # ENXIO: a FIFO nobody reads
                raise
        self._warn("open", "%s is a symlink or a FIFO: events are not recorded, the job goes on", path)
        return None

    def emit(self, event: str, **fields: Any) -> dict:
        """Record ``event`` with ``fields``; returns the record (also when it could not be written)."""
        record = {"ts": round(time.time(), 6), "event": event, "run_id": self.run_id, "launcher_pid": os.getpid()}
        record.update(fields)
        if self._fd is not None:
            line = ("\n" if self._torn else "") + json.dumps(record, default=str) + "\n"
            data = line.encode()
            try:
                self._torn = 0 < os.write(self._fd, data) < len(data)
            except OSError as exc:
                self._warn("write", "cannot write events to %s (%s): events are lost until it can be written "
                           "again, the job goes on", self.path, exc.strerror or exc)
                return record
            if self._torn:
                self._warn("write", "events to %s cut short (the disk is full?): the job goes on", self.path)
        return record

    def close(self) -> None:
        """Close the file; later ``emit`` calls are dropped."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(path: str) -> list:
    """The usable events in ``path`` (all runs), through the one reader (``eventsfile.read_events``):
    lines that are not events are skipped; [] without the file.

    Raises:
        InputFileError: ``path`` is not a regular file (a FIFO, a device, a symlink).
    """
    from launcher.monitoring.eventsfile import read_events as read

    return read(path).events
