"""Goodput: a run's wall time split into what it was spent on, from ``events.jsonl`` alone.

The run's wall time runs from its ``start`` event to its ``job_end`` (or ``stop``, or "now" for a live
run). Every instant of it belongs to exactly one part, so the parts always add up to the wall time. A
sweep over the events in file order moves one "current part" along (``startup`` until every rank of
attempt 0 is spawned; ``detection`` from a failed rank's exit until the launcher recorded it;
``stopping`` until ``attempt_end``; ``restarting`` until the next attempt's ranks are spawned;
``waiting`` during a cluster hold; ``device_wait`` while another process held one of this node's
devices before the ranks could start); the time the ranks then run is split afterwards by what the
launcher measured of them, never more:

* with step beats (``step_first``, ``heartbeat`` with a step): start-up / restarting until the
  attempt's first step, ``productive`` after it, ``recomputed`` while it re-ran the failed attempt's
  steps (``step_last`` - ``restore_plan.step``, until ``step_regained``);
* without them: start-up / restarting until the attempt's first output (``rank_output``), and
  ``unknown`` after it: training or still importing, rendezvousing or loading cannot be told apart;
* ``hung``: from a hung rank's last output or beat (``hang_detected.last_output`` / ``last_beat``, its
  spawn without either) until the detector found it.

Steps recomputed and their seconds stay ``None`` (unknown, never 0) without the events they need; the
ratio is ``None`` when some time is unknown, with its bounds in :attr:`Goodput.bounds`. docs/status.md
has the table of every part and where each number comes from.
"""

from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from launcher.common.inputrecords import INT, INTS, NUMBER, OR_NONE, TEXT, JsonLines, typed

PARTS = ("productive", "unknown", "startup", "detection", "hung", "stopping", "restarting", "recomputed", "waiting",
         "device_wait")
#: The parts during which the ranks may have been training: time lost ends where one begins.
RUNNING = ("productive", "unknown", "recomputed")


class Failure(NamedTuple):
    """One failed attempt and what it cost.

    NamedTuples, not dataclasses, here: ``launcher status`` imports this module and must answer in
    under 100 ms; the ``dataclasses`` module alone costs about 10 ms to import.

    Attributes:
        attempt: The attempt that failed.
        rank: The rank that failed.
        cause: ``exit code N`` / ``signal SIGX``.
        at: Wall-clock time of the failure.
        time_lost: Seconds of detection, stopping, restarting, waiting and recomputation it caused.
        steps_recomputed: Steps re-run after it (None: unknown, no step numbers).
        recompute_seconds: The time spent re-running them (None: unknown).
    """

    attempt: int
    rank: Optional[int]
    cause: str
    at: float
    time_lost: float = 0.0
    steps_recomputed: Optional[int] = None
    recompute_seconds: Optional[float] = None


class Goodput(NamedTuple):
    """A run's wall time by part (seconds) and its failures.

    Attributes:
        start: Wall-clock start.
        end: Wall-clock end (the time asked for, for a live run).
        parts: Seconds per part, every name in ``PARTS``; they add up to ``wall``.
        failures: The failures, in order.
        spans: ``(part, begin, end, attempt)`` intervals in order (for pictures).
        ended: The run recorded its end.
    """

    start: float
    end: float
    parts: Dict[str, float]
    failures: Tuple[Failure, ...] = ()
    spans: Tuple[Tuple[str, float, float, int], ...] = ()
    ended: bool = True

    @property
    def wall(self) -> float:
        """The run's wall time in seconds."""
        return self.end - self.start

    @property
    def ratio(self) -> Optional[float]:
        """Productive share of the wall time (None for an empty run, or when some time is ``unknown``)."""
        return self.parts["productive"] / self.wall if self.wall > 0 and not self.parts["unknown"] else None

    @property
    def bounds(self) -> Optional[Tuple[float, float]]:
        """The productive share's least and greatest value: without and with the ``unknown`` time."""
        if self.wall <= 0:
            return None
        return self.parts["productive"] / self.wall, (self.parts["productive"] + self.parts["unknown"]) / self.wall

    @property
    def steps_recomputed(self) -> Optional[int]:
        """Steps recomputed after all failures (0 without failures; None when any is unknown)."""
        steps = [f.steps_recomputed for f in self.failures]
        return None if None in steps else sum(steps)

    def to_json(self) -> dict:
        """The ``goodput`` object of ``launcher status --json``."""
        return {"wall": round(self.wall, 3), "ratio": None if self.ratio is None else round(self.ratio, 4),
                "ratio_bounds": None if self.bounds is None else [round(b, 4) for b in self.bounds],
                "ended": self.ended, "parts": {k: round(v, 3) for k, v in self.parts.items()},
                "steps_recomputed": self.steps_recomputed,
                "failures": [{"attempt": f.attempt, "rank": f.rank, "cause": f.cause, "at": f.at,
                              "time_lost": round(f.time_lost, 3), "steps_recomputed": f.steps_recomputed,
                              "recompute_seconds": _rounded(f.recompute_seconds)} for f in self.failures]}

    def summary(self) -> str:
        """One line: ``goodput 93.1% of 120.4 s: productive 112.1 s, startup 2.0 s, ...; 1 failure(s),
        30 steps recomputed`` (``steps recomputed unknown`` without step numbers)."""
        ratio = ratio_text(self.ratio, self.bounds)
        parts = ", ".join(f"{name} {self.parts[name]:.1f} s" for name in PARTS if self.parts[name] or name == "productive")
        return f"goodput {ratio} of {self.wall:.1f} s: {parts}; {len(self.failures)} failure(s){self._steps_note()}"

    def _steps_note(self) -> str:
        if not self.failures:
            return ""
        known = [f.steps_recomputed for f in self.failures if f.steps_recomputed is not None]
        if not known:
            return ", steps recomputed unknown"
        unknown = len(self.failures) - len(known)
        return f", {sum(known)} steps recomputed" + (f" (unknown for {unknown})" if unknown else "")


def ratio_text(ratio: Optional[float], bounds: Optional[Sequence[float]]) -> str:
    """``93.1%``; ``at most 85.2%`` (``10.0-85.2%``) when some time is unknown; ``?`` for an empty run."""
    if ratio is not None:
        return f"{100 * ratio:.1f}%"
    if not bounds:
        return "?"
    low, high = bounds
    return f"{100 * low:.1f}-{100 * high:.1f}%" if low else f"at most {100 * high:.1f}%"


def _rounded(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def last_run(events: Sequence[dict]) -> List[dict]:
    """The events of the newest run in an events file (runs append to the same file)."""
    starts = [i for i, ev in enumerate(events) if ev.get("event") == "start"]
    if not starts:
        return list(events)
    first = starts[-1]
    run_id = events[first].get("run_id")
    return [ev for ev in events[first:] if ev.get("run_id") == run_id]


#: How ``EventLog`` writes a ``start`` event (``json.dumps``' default separators): a hint where the
#: newest run begins, checked after parsing.
_START = b'"event": "start"'
#: The fields of an event that its readers (goodput, status, the timeline) convert or use as keys,
#: with their types; an event with any of them of another type is skipped (counted), never half-used.
EVENT_FIELDS = {"event": TEXT, "ts": NUMBER, "attempt": INT + OR_NONE, "rank": INT + OR_NONE, "ranks": None,
                "exited_at": NUMBER + OR_NONE, "at": NUMBER + OR_NONE, "after_rank": INT + OR_NONE,
                "exit_code": INT + OR_NONE, "state": TEXT + OR_NONE, "restarts_left": INT + OR_NONE,
                "max_restarts": INT + OR_NONE, "rss_bytes": INT + OR_NONE, "pid": INT + OR_NONE}
#: Per kind of event, fields whose type differs from :data:`EVENT_FIELDS`.
_KIND_FIELDS = {"attempt_start": {"ranks": INTS, "attempt": INT}}


class EventsRead(NamedTuple):
    """The events read from an events file and how many lines were skipped (not a usable event)."""

    events: List[dict]
    skipped: int


def usable(event: dict) -> bool:
    """Whether ``event`` has an ``event`` name, a ``ts``, and the types of :data:`EVENT_FIELDS`."""
    kind = event.get("event")
    if type(kind) is not str or "ts" not in event:
        return False
    return typed(event, _CHECKS.get(kind, _CHECKS[None])) is None


#: Per kind of event (None: any other), the checks :func:`usable` makes.
_CHECKS = {kind: {k: v for k, v in {**EVENT_FIELDS, **fields}.items() if v is not None}
           for kind, fields in {None: {}, **_KIND_FIELDS}.items()}


def read_events(path: str, newest_run: bool = False) -> EventsRead:
    """The usable events of the events file ``path`` ([] without one), in file order.

    Read by the one reader (``launcher.common.inputrecords.JsonLines``: a FIFO, a device or a symlink
    is refused, a line over 1 MiB is skipped while it is read, numbers are bounded). With
    ``newest_run`` only the newest run's events are kept, read fast: ``launcher status`` must answer
    in under 100 ms, so only the lines from the newest ``start`` on are parsed, in one ``json.loads`` per
    block (a per-line ``json.loads`` cost more than everything else ``status`` does).

    Raises:
        InputFileError: the file is not a regular file (or a symlink).
        OSError: it cannot be read.
    """
    lines = JsonLines(path, "events file")
    events: List[dict] = []
    try:
        blocks = lines.blocks()
    except FileNotFoundError:
        return EventsRead([], 0)
    for block in blocks:
        hint = block.rfind(_START) if newest_run else -1
        if hint >= 0:
            newest = lines.parse(block[block.rfind(b"\n", 0, hint) + 1:])
            if newest and newest[0].get("event") == "start":
                events = newest  # what came before belongs to older runs
                continue
            block = block[:block.rfind(b"\n", 0, hint) + 1]  # the hint missed: parse the rest too
            events += lines.parse(block) + newest
            continue
        events += lines.parse(block)
    kept = [ev for ev in events if usable(ev)]
    return EventsRead(last_run(kept) if newest_run else kept, lines.skipped + len(events) - len(kept))


def read_last_run(path: str) -> List[dict]:
    """The newest run's usable events in the events file ``path`` (see :func:`read_events`)."""
    return read_events(path, newest_run=True).events


class _Sweep:
    """Moves the current part along the events; closes a span at every change."""

    def __init__(self, start: float):
        self.part, self.since, self.attempt = "startup", start, 0
        self.spans: List[Tuple[str, float, float, int]] = []
        self.pending: set = set()
        self.held_from = "restarting"  # the part a cluster hold interrupted
        self.spawned: Dict[int, float] = {}       # rank -> when it was spawned in this attempt
        self.outputs: Dict[int, float] = {}       # attempt -> its first output (``rank_output.at``)
        self.hangs: List[Tuple[int, float, float]] = []  # (attempt, hung rank silent since, detected)

    def to(self, part: str, at: float) -> None:
        at = max(at, self.since)
        if at > self.since:
            self.spans.append((self.part, self.since, at, self.attempt))
        self.part, self.since = part, at


def compute(events: Iterable[dict], now: Optional[float] = None) -> Goodput:
    """The goodput of the newest run in ``events`` (``read_events`` output).

    Args:
        events: Events in file order.
        now: End of a run that has not recorded its end (default: its last event).
    """
    run = last_run(list(events))
    if not run:
        t = now or 0.0
        return Goodput(t, t, dict.fromkeys(PARTS, 0.0), ended=False)
    start = float(run[0].get("ts", 0.0))
    sweep, failures, steps = _Sweep(start), [], _StepLog()
    end, ended = None, False
    for ev in run:
        kind = ev.get("event")
        if kind not in _KINDS:
            continue  # notes that neither move the sweep nor carry steps: skipped before any work
        ts = max(float(ev.get("ts", sweep.since)), sweep.since)
        steps.see(ev, kind)
        if kind in ("job_end", "stop"):
            end, ended = ts, True
            break
        _step(sweep, failures, ev, kind, ts)
    if end is None:
        end = max(now if now is not None else 0.0, float(run[-1].get("ts", start)), sweep.since)
    sweep.to("end", end)
    spans = _carve_startup(sweep.spans, steps, sweep.outputs)
    for attempt, since, detected in sweep.hangs:
        spans, _ = _relabel(spans, attempt, since, detected, "hung", RUNNING + ("startup", "restarting"))
    spans, failures = _carve_recomputed(spans, failures, steps)
    parts = dict.fromkeys(PARTS, 0.0)
    for part, begin, stop, _ in spans:
        parts[part] += stop - begin
    return Goodput(start, end, parts, tuple(_charge(f, spans) for f in failures), tuple(spans), ended)


#: The events that move the sweep or carry steps.
_STEP_EVENTS = frozenset(("heartbeat", "rank_exited", "step_first", "step_regained", "step_last"))
_KINDS = _STEP_EVENTS | {"job_end", "stop", "attempt_start", "rank_spawned", "stop_group", "gasp", "attempt_end",
                         "restart", "cluster_hold", "cluster_hold_end", "restore_plan", "rank_output",
                         "hang_detected", "device_wait", "device_wait_end"}


def _step(sweep: _Sweep, failures: List[Failure], ev: dict, kind: str, ts: float) -> None:
    """Apply one event to the sweep."""
    if kind == "attempt_start":
        attempt = int(ev.get("attempt", sweep.attempt))
        if sweep.part not in ("startup", "waiting"):
            sweep.to("restarting" if attempt else "startup", ts)
        sweep.attempt, sweep.pending, sweep.spawned = attempt, set(ev.get("ranks") or ()), {}
    elif kind == "rank_spawned":
        sweep.pending.discard(ev.get("rank"))
        sweep.spawned[ev.get("rank")] = ts
        if not sweep.pending and sweep.part in ("startup", "restarting"):
            sweep.to("productive", ts)
    elif kind == "rank_exited" and ev.get("state") == "failed" and sweep.part == "productive":
        exited = float(ev.get("exited_at") or ts)
        sweep.to("detection", min(exited, ts))
        sweep.to("stopping", ts)
        cause = f"signal {ev['signal']}" if ev.get("signal") else f"exit code {ev.get('exit_code')}"
        failures.append(Failure(sweep.attempt, ev.get("rank"), cause, min(exited, ts)))
    elif kind == "rank_output" and isinstance(ev.get("at"), (int, float)):
        attempt = ev.get("attempt", sweep.attempt)
        sweep.outputs[attempt] = min(float(ev["at"]), sweep.outputs.get(attempt, float("inf")))
    elif kind == "hang_detected" and sweep.part == "productive":
        signs = [t for t in (ev.get("last_beat"), ev.get("last_output")) if isinstance(t, (int, float))]
        since = min(max(signs) if signs else sweep.spawned.get(ev.get("rank"), sweep.since), ts)
        sweep.hangs.append((sweep.attempt, since, ts))
        sweep.to("stopping", ts)
        failures.append(Failure(sweep.attempt, ev.get("rank"), f"hung ({ev.get('reason')})", since))
    elif kind in ("stop_group", "gasp") and sweep.part == "productive":
        sweep.to("stopping", ts)  # a signal or request (prestop, exit): stopping time, not a failure
    elif kind == "attempt_end":
        sweep.to("restarting" if ev.get("failed") else "stopping", ts)
    elif kind == "restart" and ev.get("scope") == "rank":
        sweep.pending = {ev.get("after_rank")}
        if sweep.part == "stopping":
            sweep.to("restarting", ts)
    elif kind == "cluster_hold" and sweep.part != "waiting":
        sweep.held_from = sweep.part
        sweep.to("waiting", ts)
    elif kind == "cluster_hold_end" and sweep.part == "waiting":
        sweep.to(sweep.held_from, ts)
    elif kind == "device_wait" and sweep.part not in ("waiting", "device_wait"):
        sweep.held_from = sweep.part
        sweep.to("device_wait", ts)
    elif kind == "device_wait_end" and sweep.part == "device_wait":
        sweep.to(sweep.held_from, ts)


class _StepLog:
    """Per attempt: its highest step, the step its restore plan resumes from, when it first beat with a
    step, and when it regained the attempt before it's highest step (wall-clock)."""

    def __init__(self) -> None:
        self.last: Dict[int, int] = {}
        self.plan: Dict[int, int] = {}
        self.first: Dict[int, Tuple[float, int]] = {}     # (when, step) of the first beat with a step
        self.regained: Dict[int, Tuple[float, int]] = {}  # (when, step) it was back at the last step
        self.attempt = 0

    def see(self, ev: dict, kind: str) -> None:
        if kind == "attempt_start":
            self.attempt = int(ev.get("attempt", self.attempt))
        step = ev.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        attempt = ev.get("attempt")
        attempt = attempt if isinstance(attempt, int) else self.attempt
        if kind == "restore_plan":
            self.plan[attempt] = step
        elif kind in _STEP_EVENTS:
            self.last[attempt] = max(step, self.last.get(attempt, step))
            at = ev.get("at") or ev.get("ts")
            if kind != "step_last" and isinstance(at, (int, float)):  # step_last: when it got there is unknown
                self._timed(attempt, step, float(at))

    def _timed(self, attempt: int, step: int, at: float) -> None:
        self.first[attempt] = min((at, step), self.first.get(attempt, (at, step)))
        before = self.last.get(attempt - 1)
        if before is not None and step >= before and attempt not in self.regained:
            self.regained[attempt] = (at, step)


def _carve_startup(spans: List[Tuple[str, float, float, int]], steps: _StepLog,
                   outputs: Dict[int, float]) -> List[Tuple[str, float, float, int]]:
    """Each attempt's productive time before it began training relabelled ``startup`` (attempt 0) or
    ``restarting``: a spawned rank is not training until it has started Python, imported its framework,
    joined the rendezvous and loaded its checkpoint. With step beats the boundary is the first step
    beat, or the earlier start of recomputation when that was estimated back from a later beat.
    Without them only the attempt's first output (``rank_output``) is known: before it is start-up,
    after it start-up and training cannot be told apart, so the rest is ``unknown``."""
    out = spans
    for attempt in sorted({span[3] for span in spans}):
        label = "startup" if attempt == 0 else "restarting"
        if attempt not in steps.first:
            if attempt in outputs:
                out, _ = _relabel(out, attempt, float("-inf"), outputs[attempt], label)
            out, _ = _relabel(out, attempt, float("-inf"), float("inf"), "unknown")
            continue
        at, resumed = steps.first[attempt][0], steps.plan.get(attempt)
        if resumed is not None:
            at = min(at, _recompute_start(steps, attempt, resumed))
            if at == float("-inf"):
                continue  # no usable estimate of when training resumed: left as it was
        out, _ = _relabel(out, attempt, float("-inf"), at, label)
    return out


def _carve_recomputed(spans: List[Tuple[str, float, float, int]], failures: List[Failure],
                      steps: _StepLog) -> Tuple[List[Tuple[str, float, float, int]], List[Failure]]:
    """Each failure's steps recomputed, and the next attempt's productive time spent on them relabelled
    ``recomputed`` (from its first step until it regained the failed attempt's last step)."""
    out, known = list(spans), []
    for failure in failures:
        after = failure.attempt + 1
        last, resumed = steps.last.get(failure.attempt), steps.plan.get(after)
        if last is None or resumed is None:
            known.append(failure)
            continue
        count, seconds = max(0, last - resumed), None
        if not count:
            seconds = 0.0
        elif after in steps.first or after in steps.regained:
            out, seconds = _relabel(out, after, _recompute_start(steps, after, resumed),
                                    steps.regained.get(after, (float("inf"), 0))[0])
        known.append(failure._replace(steps_recomputed=count, recompute_seconds=seconds))
    return out, known


def _recompute_start(steps: _StepLog, attempt: int, resumed: int) -> float:
    """When ``attempt`` started re-running steps: its first step beat; when that beat was already past
    the resume step (the launcher polls the slots every 0.2 s, so it may first see a later step), moved
    back by the steps it had made, at the rate it went on to regain the failed step. Without such a
    rate: -inf, i.e. from the attempt's productive start (its framework start-up counted too)."""
    at, step = steps.first.get(attempt, (float("-inf"), resumed))
    if step <= resumed:
        return at
    end_at, end_step = steps.regained.get(attempt, (at, step))
    if end_step > step and end_at > at:
        return at - (step - resumed) * (end_at - at) / (end_step - step)
    return float("-inf")


def _relabel(spans: List[Tuple[str, float, float, int]], attempt: int, lo: float, hi: float,
             label: str = "recomputed", source: Tuple[str, ...] = ("productive",),
             ) -> Tuple[List[Tuple[str, float, float, int]], float]:
    """``attempt``'s time in the ``source`` parts between ``lo`` and ``hi`` made ``label``; and how much
    it was."""
    out, moved = [], 0.0
    for part, begin, end, at in spans:
        if part not in source or at != attempt or end <= lo or begin >= hi:
            out.append((part, begin, end, at))
            continue
        cut, stop = max(begin, lo), min(end, hi)
        out += [s for s in ((part, begin, cut, at), (label, cut, stop, at), (part, stop, end, at))
                if s[2] > s[1]]
        moved += stop - cut
    return out, moved


def _charge(failure: Failure, spans: List[Tuple[str, float, float, int]]) -> Failure:
    """``failure`` with its time lost: the non-productive spans from it until productive time resumes,
    and the time spent recomputing its steps."""
    lost = failure.recompute_seconds or 0.0
    for part, begin, stop, _ in spans:
        if stop <= failure.at:
            continue
        if part in RUNNING or part == "end":
            break  # training again (recomputation is charged to the failure whose steps it re-ran, above)
        lost += stop - max(begin, failure.at)
    return failure._replace(time_lost=lost)
