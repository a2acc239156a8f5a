"""Goodput: a run's wall time split into what it was spent on, from ``events.jsonl`` alone.

The run's wall time runs from its ``start`` event to its ``job_end`` (or ``stop``, or "now" for a live
run). Every instant of it belongs to exactly one part, so the parts always add up to the wall time.
A sweep over the events in file order moves one "current part" along; each part is defined by the
event that enters it:

* ``startup`` - from ``start`` until every rank of attempt 0 is spawned (``rank_spawned`` for each rank
  ``attempt_start`` named): reading the rank table, the integrations, spawning; with step events
  (below), until the attempt's first step: the ranks' interpreter start, imports and rendezvous too.
* ``productive`` - from there until a failure is detected or the attempt is stopped; the whole
  remaining run time of a successful attempt.
* ``detection`` - from a failed rank's exit (``rank_exited.exited_at``, its reaping time) until the
  launcher recorded it (the event's ``ts``). Hangs are not seen here: without rank heartbeats a hung
  rank counts as productive until it exits.
* ``stopping`` - from the failure (or a ``stop_group`` / ``gasp`` on a request or signal) until the
  attempt's ``attempt_end``: stopping the other ranks, the dying gasp; after a successful attempt,
  the launcher's own shutdown until ``job_end``.
* ``restarting`` - from a failed ``attempt_end`` until every rank of the next attempt is spawned:
  the restart decision, backoff, the restore plan, spawning (a ``scope: rank`` restart: until that
  rank is spawned again); with step events, until the attempt's first step: the ranks' start-up,
  imports, rendezvous and checkpoint load, which is most of a restart's cost (and what warm standbys
  save). Without them that time counts as productive.
* ``waiting`` - between ``cluster_hold`` and ``cluster_hold_end``: the cluster (reset.json) held the
  restart.
* ``device_wait`` - between ``device_wait`` and ``device_wait_end``: another process still held one
  of this node's devices before the ranks could start (``--device-wait-timeout``).
* ``recomputed`` - carved from the productive time after a restart: the time spent re-running steps
  the failed attempt had already done. The steps come from the ranks' heartbeat slots, which the hang
  detector records (``launcher.run.hangwatch``): ``step_last`` (an attempt's highest step, at its
  end), ``step_first`` (its first beat with a step) and ``step_regained`` (a restarted attempt reached
  the step before the failure again), each with the beat's time ``at``; ``heartbeat`` events with a
  ``step`` count the same way. Per failure, steps recomputed = the failed attempt's last step - the
  step the next attempt's ``restore_plan`` resumes from; their time = the next attempt's productive
  time from its first step until it regained that step (or until its productive time ended, when it
  never did). Without those events both stay ``None`` (unknown, never 0) and the time stays in
  ``productive``.
"""

import json
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

PARTS = ("productive", "startup", "detection", "stopping", "restarting", "recomputed", "waiting", "device_wait")


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
        """Productive share of the wall time (None for an empty run)."""
        return self.parts["productive"] / self.wall if self.wall > 0 else None

    @property
    def steps_recomputed(self) -> Optional[int]:
        """Steps recomputed after all failures (0 without failures; None when any is unknown)."""
        steps = [f.steps_recomputed for f in self.failures]
        return None if None in steps else sum(steps)

    def to_json(self) -> dict:
        """The ``goodput`` object of ``launcher status --json``."""
        return {"wall": round(self.wall, 3), "ratio": None if self.ratio is None else round(self.ratio, 4),
                "ended": self.ended, "parts": {k: round(v, 3) for k, v in self.parts.items()},
                "steps_recomputed": self.steps_recomputed,
                "failures": [{"attempt": f.attempt, "rank": f.rank, "cause": f.cause, "at": f.at,
                              "time_lost": round(f.time_lost, 3), "steps_recomputed": f.steps_recomputed,
                              "recompute_seconds": _rounded(f.recompute_seconds)} for f in self.failures]}

    def summary(self) -> str:
        """One line: ``goodput 93.1% of 120.4 s: productive 112.1 s, startup 2.0 s, ...; 1 failure(s),
        30 steps recomputed`` (``steps recomputed unknown`` without step numbers)."""
        ratio = "?" if self.ratio is None else f"{100 * self.ratio:.1f}%"
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


def read_last_run(path: str) -> List[dict]:
    """The newest run's events in the events file ``path`` ([] without one), read fast.

    An events file collects every run on its run dir and may be long; ``launcher status`` must answer
    in under 100 ms. So only the lines from the newest ``start`` on are parsed, all in one
    ``json.loads`` (a per-line ``json.loads`` cost more than everything else ``status`` does). A torn or
    foreign line makes it fall back to parsing line by line, skipping what is not a JSON object.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    begin = data.rfind(b"\n", 0, max(data.rfind(_START), 0)) + 1
    events = _parse_lines(data[begin:])
    if begin and (not events or events[0].get("event") != "start"):
        events = _parse_lines(data)  # the hint missed (a value held the text): read it all
    return last_run(events)


def _parse_lines(data: bytes) -> List[dict]:
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue
    return [ev for ev in parsed if isinstance(ev, dict)]


class _Sweep:
    """Moves the current part along the events; closes a span at every change."""

    def __init__(self, start: float):
        self.part, self.since, self.attempt = "startup", start, 0
        self.spans: List[Tuple[str, float, float, int]] = []
        self.pending: set = set()
        self.held_from = "restarting"  # the part a cluster hold interrupted

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
    spans, failures = _carve_recomputed(_carve_startup(sweep.spans, steps), failures, steps)
    parts = dict.fromkeys(PARTS, 0.0)
    for part, begin, stop, _ in spans:
        parts[part] += stop - begin
    return Goodput(start, end, parts, tuple(_charge(f, spans) for f in failures), tuple(spans), ended)


#: The events that move the sweep or carry steps.
_STEP_EVENTS = frozenset(("heartbeat", "rank_exited", "step_first", "step_regained", "step_last"))
_KINDS = _STEP_EVENTS | {"job_end", "stop", "attempt_start", "rank_spawned", "stop_group", "gasp", "attempt_end",
                         "restart", "cluster_hold", "cluster_hold_end", "restore_plan", "device_wait",
                         "device_wait_end"}


def _step(sweep: _Sweep, failures: List[Failure], ev: dict, kind: str, ts: float) -> None:
    """Apply one event to the sweep."""
    if kind == "attempt_start":
        attempt = int(ev.get("attempt", sweep.attempt))
        if sweep.part not in ("startup", "waiting"):
            sweep.to("restarting" if attempt else "startup", ts)
        sweep.attempt, sweep.pending = attempt, set(ev.get("ranks") or ())
    elif kind == "rank_spawned":
        sweep.pending.discard(ev.get("rank"))
        if not sweep.pending and sweep.part in ("startup", "restarting"):
            sweep.to("productive", ts)
    elif kind == "rank_exited" and ev.get("state") == "failed" and sweep.part == "productive":
        exited = float(ev.get("exited_at") or ts)
        sweep.to("detection", min(exited, ts))
        sweep.to("stopping", ts)
        cause = f"signal {ev['signal']}" if ev.get("signal") else f"exit code {ev.get('exit_code')}"
        failures.append(Failure(sweep.attempt, ev.get("rank"), cause, min(exited, ts)))
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


def _carve_startup(spans: List[Tuple[str, float, float, int]], steps: _StepLog) -> List[Tuple[str, float, float, int]]:
    """Each attempt's productive time before its first step relabelled ``startup`` (attempt 0) or
    ``restarting``: a spawned rank is not training until it has started Python, imported its framework,
    joined the rendezvous and loaded its checkpoint. The boundary is the first step beat, or the
    earlier start of recomputation when that was estimated back from a later beat."""
    out = spans
    for attempt, (at, _) in steps.first.items():
        resumed = steps.plan.get(attempt)
        if resumed is not None:
            at = min(at, _recompute_start(steps, attempt, resumed))
            if at == float("-inf"):
                continue  # no usable estimate of when training resumed: left as it was
        out, _ = _relabel(out, attempt, float("-inf"), at, "startup" if attempt == 0 else "restarting")
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
             label: str = "recomputed") -> Tuple[List[Tuple[str, float, float, int]], float]:
    """``attempt``'s productive time between ``lo`` and ``hi`` made ``label``; and how much it was."""
    out, moved = [], 0.0
    for part, begin, end, at in spans:
        if part != "productive" or at != attempt or end <= lo or begin >= hi:
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
        if part in ("productive", "recomputed", "end"):
            break  # training again (recomputation is charged to the failure whose steps it re-ran, above)
        lost += stop - max(begin, failure.at)
    return failure._replace(time_lost=lost)
