"""Each rank's first output after its spawn (``rank_output``), for the goodput's start-up.

Without step heartbeats the launcher cannot see training begin, but it can see a rank start to talk:
the time from a spawn to the rank's first output is start-up (interpreter, imports), never training.
This :class:`Integration` looks at the size of each rank's log file (``<log-dir>/<session>/attempt_<n>/
rank_<r>.log``, which the console tee or the rank itself appends to) every 0.2 s, only for the ranks
of the current attempt that have not printed yet, and records ``rank_output`` (``attempt``, ``rank``,
``at``) once per rank and attempt. ``at`` is the log's modification time when the poll first sees it
grow: the wall-clock time of the last write by then, so at most one poll interval after the first.
Always on; the cost is one ``stat`` per silent local rank per tick, and nothing once every rank talked.
"""

import os
import time
from typing import Dict, Optional, Tuple

from launcher.supervision.integration import Host, Integration

#: Seconds between two looks at the silent ranks' logs: bounds how late a first output is dated.
TICK = 0.2


class OutputWatch(Integration):
    """Record ``rank_output`` at each rank's first output of an attempt."""

    name = "output watch"

    def __init__(self) -> None:
        self.host: Optional[Host] = None
        self.attempt: Optional[int] = None
        self.silent: Dict[int, Tuple[str, int]] = {}  # rank -> (log path, its size when spawned)
        self._timer: Optional[int] = None

    def start(self, host: Host) -> None:
        self.host = host

    def on_event(self, event: str, fields) -> None:
        if self.host is None:
            return
        if event == "attempt_start":
            self.attempt, self.silent = fields["attempt"], {}
        elif event == "rank_spawned":
            path = self.host.group.log_paths.get(fields["rank"])
            if path:
                self.silent[fields["rank"]] = (path, _size(path) or 0)  # what it held before is not output
                if self._timer is None:
                    self._timer = self.host.group.call_later(TICK, self._tick)
        elif event == "attempt_end":
            self._look()  # a rank that printed and died within one tick still counts
            self.silent = {}

    def _tick(self) -> None:
        self._timer = None
        self._look()
        if self.silent:
            self._timer = self.host.group.call_later(TICK, self._tick)

    def _look(self) -> None:
        for rank, (path, size) in list(self.silent.items()):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_size > size:
                del self.silent[rank]
                self.host.emit("rank_output", attempt=self.attempt, rank=rank,
                               at=round(min(st.st_mtime, time.time()), 3))

    def stop(self) -> None:
        if self._timer is not None:
            self.host.group.cancel(self._timer)
            self._timer = None


def _size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except OSError:
        return None
