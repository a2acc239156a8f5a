"""Wait until the cluster has written a complete rank table.

The Ascend Operator first writes ``{"status": "initializing"}`` and later the full table, and it
rewrites the file in place (truncate, then write), so a reader can see a missing file, an empty or
half-written one, or a table that is not ``completed`` yet: all of these are retried, with a
progress line every 30 s. What will not repair itself fails at once (exit 2): a table that is
complete but invalid, a file that is not a regular file, too big, too deep or not UTF-8, and a path
whose directory does not exist (a mistyped ``--rank-table``: the cluster mounts the directory before
the container starts). The legacy scripts never noticed their own timeout (legacy defect 2); here
the deadline is a monotonic clock and is always enforced.
"""

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional, Union

from launcher.common.errors import LauncherError, UsageError
from launcher.common.inputfiles import INCOMPLETE, InputFileError
from launcher.jobspec.ranktable.files import read_rank_table_file
from launcher.jobspec.ranktable.model import RankTable
from launcher.jobspec.ranktable.parse import RankTableError, RankTableNotReady, parse_rank_table

log = logging.getLogger(__name__)


class _NotYet(Exception):
    """The table is not usable yet; tenacity retries on this and nothing else."""


class _Watch:
    """One wait: makes the attempts, remembers what it last saw, rate-limits progress lines."""

    def __init__(self, path: str, timeout: float, progress_interval: float):
        self.path = path
        self.timeout = timeout
        self.progress_interval = progress_interval
        self.start = time.monotonic()
        self.last_seen = "nothing yet"
        self.last_report: Optional[float] = None

    def attempt(self) -> RankTable:
        try:
            data, revision = read_rank_table_file(self.path)
        except FileNotFoundError:
            raise self._not_yet("file not found") from None
        except InputFileError as exc:
            # Empty, cut short inside JSON or inside a UTF-8 character: a truncate-and-write in progress.
            if exc.reason != INCOMPLETE:
                raise RankTableError(str(exc)) from None
            raise self._not_yet(f"{exc.what} {exc.problem}") from None
        except OSError as exc:
            raise self._not_yet(f"cannot read file: {exc.strerror or exc}") from None
        try:
            table = parse_rank_table(data, source=self.path, revision=revision)
        except RankTableNotReady as exc:
            raise self._not_yet(f'status "{exc.status}"') from None
        if self.last_report is not None:
            log.info("rank table %s is ready after %.0f s: %d servers, %d ranks", self.path,
                     time.monotonic() - self.start, table.server_count, table.world_size)
        return table

    def _not_yet(self, seen: str) -> _NotYet:
        self.last_seen = seen
        return _NotYet(seen)

    def report(self, retry_state: Any) -> None:
        """tenacity ``before_sleep`` hook: a progress line at most every ``progress_interval``."""
        now = time.monotonic()
        if self.last_report is None or now - self.last_report >= self.progress_interval:
            self.last_report = now
            log.info("waiting for rank table %s: %s (%.0f s of %g s)", self.path, self.last_seen,
                     now - self.start, self.timeout)


def _sleep(seconds: float) -> None:
    from launcher.common import signals

    signals.interruptible_sleep(seconds)
    if signals.has_pending():
        raise LauncherError("stopped by a signal while waiting for the rank table", exit_code=143)


#: Seconds between two "still waiting" lines (a 300 s wait prints ten, not sixty).
PROGRESS_INTERVAL = 30.0


def wait_for_rank_table(path: Union[str, Path], timeout: float = 300.0, poll_interval: float = 0.5,
                        progress_interval: float = PROGRESS_INTERVAL) -> RankTable:
    """Poll ``path`` until it holds a complete, valid rank table.

    Args:
        path: The rank table file (``RANK_TABLE_FILE``).
        timeout: Seconds to wait in total; 0 means a single attempt.
        poll_interval: Seconds between attempts.
        progress_interval: Minimum seconds between two progress log lines.

    Returns:
        The parsed table (with ``source`` and ``revision`` set).

    Raises:
        RankTableError: the table is complete (or has no status to wait for) but invalid; the file
            is not a regular file, too big, too deep or not UTF-8; or its directory does not exist.
        LauncherError: still missing, incomplete or not ``completed`` after ``timeout`` seconds;
            the message says what was seen last.
        UsageError: a negative timeout or a non-positive interval.
    """
    if timeout < 0 or poll_interval <= 0 or progress_interval <= 0:
        raise UsageError(f"invalid rank table wait: timeout={timeout!r} must be >= 0 and "
                         f"poll_interval={poll_interval!r}, progress_interval={progress_interval!r} > 0")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise RankTableError(f"rank table {path}: directory {directory} does not exist "
                             "(check --rank-table or RANK_TABLE_FILE)")
    import tenacity

    watch = _Watch(str(path), timeout, progress_interval)
    deadline = watch.start + timeout
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_NotYet),
        stop=tenacity.stop_after_delay(timeout),
        # Never sleep past the deadline: the last attempt happens at the deadline, not after it.
        wait=lambda _state: max(0.0, min(poll_interval, deadline - time.monotonic())),
        before_sleep=watch.report,
        # Wakes at once on SIGTERM/SIGINT (recorded by launcher.common.signals); the caller then stops.
        sleep=_sleep,
    )
    try:
        return retrying(watch.attempt)
    except tenacity.RetryError:
        raise LauncherError(f"rank table {path} not ready after {timeout:g} s: "
                            f"last saw {watch.last_seen}") from None
