"""The hang detector: an :class:`Integration` that watches heartbeats and output, and fails hung ranks.

Off unless ``--heartbeat-timeout``, ``--heartbeat-initial-timeout`` or ``--section-timeout`` is given.
On a timer in the supervisor's event loop it reads each local rank's heartbeat slot (written by
``launcher_heartbeat``) and the size of its log (output is progress too, for scripts that never beat),
and judges each rank still running with :func:`launcher.monitoring.heartbeats.judge`: a rank that has
exited (even with 0, long before the others) or that the launcher is stopping is never hung. A hung
rank is reported (``hang_detected``), every local rank's stacks are dumped (``stacks_dumped``,
:class:`launcher.run.stackdump.StackDump`), and only then is a ``RankHung`` posted to the loop: the
supervisor kills that rank, and its failure is handled like a crash (restart within the budget, the
rank planned as faulty). Each rank is reported at most once per spawn, and every hang of an attempt
is reported, not only its first: a rank respawned in place, or a second rank that hangs while the
first one's failure is handled in place, is watched again. Policy stays in the supervisor; this
module only observes and reports.

It also records the steps the slots show, for the goodput's recomputed steps
(``launcher.monitoring.goodput``): ``step_first`` (an attempt's first beat with a step), ``step_regained``
(a restarted attempt reached again the highest step of the attempt before it) and ``step_last`` (an
attempt's highest step, at its end); ``at`` is the beat's own wall-clock time.
"""

import glob
import logging
import os
import time
from collections import deque
from typing import Deque, Dict, Optional, Set, Tuple

from launcher.jobspec.runspec import HangRules
from launcher.monitoring.heartbeats import (HEARTBEAT_DIR, RATE_WINDOW, Beat, judge, read_slot, slot_path, step_rate,
                                            stragglers)
from launcher.supervision.integration import Host, Integration
from launcher.supervision.loopevents import RankHung

log = logging.getLogger(__name__)

#: Seconds between two looks at the slots: bounds the detection latency past a timeout.
TICK = 0.2
#: Seconds the stack dump of every local rank may take before the hung rank is killed anyway.
DUMP_TIMEOUT = 3.0


class HangWatch(Integration):
    """Detect hung ranks; dump every local rank's stacks; ask the supervisor to fail the hung one."""

    name = "hang detector"

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.rules = HangRules()
        self.host: Optional[Host] = None
        self.directory = ""
        self.attempt: Optional[int] = None
        self.spawned: Dict[int, float] = {}      # rank -> when spawned (monotonic)
        self.output: Dict[int, tuple] = {}       # rank -> (log size, when it last grew)
        self.settled: Set[int] = set()           # ranks exited or being stopped: never hung
        self.reported: Set[int] = set()          # ranks reported hung since their spawn
        self.dumping = False                     # a hang's stack dump is running
        self.steps: Dict[int, int] = {}          # attempt -> highest step a rank reported
        self.history: Dict[int, Deque[Tuple[float, int]]] = {}  # rank -> recent (time, step)
        self.named: Set[int] = set()             # ranks already named stragglers this attempt
        self.first_step = False                  # this attempt's step_first is recorded
        self.regain: Optional[int] = None        # the step whose step_regained this attempt awaits
        self._timer: Optional[int] = None

    def start(self, host: Host) -> None:
        self.rules = host.spec.hangs
        if not self.rules.enabled:
            return
        self.host = host
        self.directory = os.path.join(host.ctx.run_dir, HEARTBEAT_DIR)
        os.makedirs(self.directory, exist_ok=True)
        self._timer = host.group.call_later(TICK, self._tick)

    def on_event(self, event: str, fields) -> None:
        if self.host is None:
            return
        if event == "attempt_start":
            self.attempt, self.spawned, self.output = fields["attempt"], {}, {}
            self.settled, self.reported, self.dumping = set(), set(), False
            self.history, self.named = {}, set()
            self.first_step, self.regain = False, self.steps.get(self.attempt - 1)
            for path in glob.glob(os.path.join(self.directory, "rank_*")):  # the last attempt's slots
                os.unlink(path)
        elif event == "rank_spawned":
            rank = fields["rank"]
            self.spawned[rank] = self.clock()
            self.output[rank] = (self._log_size(rank), 0.0)  # what the log held before is not progress
            self.settled.discard(rank)  # respawned in place: watched afresh
            self.reported.discard(rank)
        elif event == "rank_exited":
            self.settled.add(fields["rank"])
        elif event == "stop_group":  # stopping has its own deadline (then SIGKILL): not a hang
            self.settled.update(fields["ranks"])
        elif event == "attempt_end":
            beats = self._read_steps()
            self._record_steps(beats)
            steps = {str(r): b.step for r, b in sorted(beats.items()) if b is not None and b.step >= 0}
            if steps:
                self.host.emit("step_last", attempt=self.attempt, step=max(steps.values()), ranks=steps)
            self.attempt, self.spawned = None, {}

    def status(self) -> dict:
        """For the control socket's ``status`` answer: this attempt's stragglers (empty when off)."""
        return {"stragglers": sorted(self.named)} if self.rules.straggler else {}

    def progress(self, attempt: int) -> Optional[int]:
        """The highest heartbeat step a rank of ``attempt`` reached (None: none reported a step)."""
        return self.steps.get(attempt)

    def _read_steps(self) -> Dict[int, Optional[Beat]]:
        beats = {rank: read_slot(slot_path(self.directory, rank)) for rank in self.spawned}
        steps = [b.step for b in beats.values() if b is not None and b.step >= 0]
        if steps and self.attempt is not None:
            self.steps[self.attempt] = max(steps + [self.steps.get(self.attempt, -1)])
        return beats

    def stop(self) -> None:
        if self._timer is not None:
            self.host.group.cancel(self._timer)
            self._timer = None

    def _tick(self) -> None:
        self._timer = self.host.group.call_later(TICK, self._tick)
        if self.attempt is None or self.dumping:
            return
        now = self.clock()
        beats = self._read_steps()
        self._record_steps(beats)
        hung = {}
        for rank, spawned in self.spawned.items():
            if rank in self.settled or rank in self.reported:
                continue
            why = judge(self.rules, spawned, beats[rank], self._output_at(rank, now), now)
            if why is not None:
                hung[rank] = why
        if hung:
            self._report(hung, beats)
        elif self.rules.straggler:
            self._stragglers(beats, now)

    def _record_steps(self, beats: Dict[int, Optional[Beat]]) -> None:
        """``step_first`` once a rank beat with a step; ``step_regained`` once one reached ``regain``."""
        stepped = [b for b in beats.values() if b is not None and b.step >= 0]
        if stepped and not self.first_step:
            self.first_step = True
            first = min(stepped, key=lambda b: b.at)
            self.host.emit("step_first", attempt=self.attempt, step=first.step, at=self._wall(first.at))
        reached = [b for b in stepped if self.regain is not None and b.step >= self.regain]
        if reached:
            self.host.emit("step_regained", attempt=self.attempt, step=self.regain,
                           at=self._wall(min(b.at for b in reached)))
            self.regain = None

    def _wall(self, at: float) -> float:
        """The wall-clock time of a beat stamped ``at`` on the slots' monotonic clock."""
        return round(time.time() - max(0.0, self.clock() - at), 3)

    def _stragglers(self, beats: Dict[int, Optional[Beat]], now: float) -> None:
        """Per-rank step rates over the last ``RATE_WINDOW`` s; name each new straggler once."""
        for rank, beat in beats.items():
            history = self.history.setdefault(rank, deque())
            if beat is not None and beat.step >= 0 and (not history or history[-1][1] != beat.step):
                history.append((beat.at, beat.step))
            while history and history[0][0] < now - RATE_WINDOW:
                history.popleft()
        rates = {rank: step_rate(history) for rank, history in self.history.items()}
        for rank in stragglers(rates, self.rules.straggler):
            from statistics import median  # with its decimal and fractions: only once a rank straggles

            if rank in self.named:
                continue
            self.named.add(rank)
            peers = median(v for r, v in rates.items() if r != rank and v is not None)
            self.host.emit("straggler", attempt=self.attempt, rank=rank, steps_per_s=round(rates[rank], 3),
                           peers_median=round(peers, 3), threshold=self.rules.straggler)
            log.warning("rank %d is a straggler: %.2f steps/s, its peers' median %.2f", rank, rates[rank], peers)

    def _log_size(self, rank: int) -> int:
        path = self.host.group.log_paths.get(rank)
        try:
            return os.stat(path).st_size if path else 0
        except OSError:
            return 0

    def _output_at(self, rank: int, now: float) -> float:
        """When the rank's log last grew since it was spawned (0: never)."""
        size, at = self.output.get(rank, (0, 0.0))
        grown = self._log_size(rank)
        if grown != size:
            size, at = grown, now
            self.output[rank] = (size, at)
        return at

    def _last_output(self, rank: int) -> Optional[float]:
        """Wall-clock time of the rank's last output since its spawn (its log's mtime; None: it printed
        nothing), for the goodput: from then until now the silent rank was not training."""
        if not self.output.get(rank, (0, 0.0))[1]:
            return None
        try:
            return round(os.stat(self.host.group.log_paths[rank]).st_mtime, 3)
        except (KeyError, OSError):
            return None

    def _report(self, hung: Dict[int, str], beats: Dict[int, Optional[Beat]]) -> None:
        self.dumping = True
        rank = min(hung)
        beat = beats.get(rank)
        attempt = self.attempt
        self.host.emit("hang_detected", attempt=attempt, rank=rank, reason=hung[rank], hung_ranks=sorted(hung),
                       step=beat.step if beat else None, section=beat.section if beat else None,
                       last_beat=self._wall(beat.at) if beat and beat.at else None,
                       last_output=self._last_output(rank))
        log.warning("%s hung (rank %d: %s); dumping the stacks of every local rank before stopping it",
                    f"ranks {','.join(map(str, sorted(hung)))} look" if len(hung) > 1 else f"rank {rank} looks",
                    rank, hung[rank])
        main = self.host.group.pids()
        pids = {r: (beats[r].pid if beats.get(r) and beats[r].pid else main[r]) for r in self.spawned if r in main}
        handlers = {r for r, b in beats.items() if b is not None and b.faulthandler}
        started = self.clock()
        out = os.path.join(self.directory, f"attempt_{attempt}")
        from launcher.monitoring import stacks  # on a hang only: not on the way to the first rank
        from launcher.run.stackdump import StackDump

        def dumped(texts, sources):
            where = {r: stacks.innermost_frame(text, pids[r]) if text else None for r, text in texts.items()}
            diagnosis = stacks.diagnose(where, sorted(hung)) + [f"stacks in {out}"]
            odd = stacks.odd_one_out(where)
            culprit = odd if odd in hung else rank  # the rank holding the others up, if it is silent too
            self.host.emit("stacks_dumped", attempt=attempt, directory=out, sources=sources,
                           seconds=round(self.clock() - started, 3), diagnosis=diagnosis, failing_rank=culprit)
            for line in diagnosis:
                log.warning("  %s", line)
            if attempt != self.attempt:  # the attempt ended during the dump: its ranks are gone
                return
            self.dumping = False
            self.reported.add(culprit)
            self.host.group.post(RankHung(culprit, hung[culprit], tuple(diagnosis)))

        StackDump(self.host.group, pids, handlers, out, self.directory, DUMP_TIMEOUT, dumped)
