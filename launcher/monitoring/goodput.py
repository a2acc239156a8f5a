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

from launcher.monitoring import sweep as sweep_mod
from launcher.monitoring.eventsfile import last_run
from launcher.monitoring.sweep import Failure, Span, StepLog

PARTS = ("productive", "unknown", "startup", "detection", "hung", "stopping", "restarting", "recomputed", "waiting",
         "device_wait")
#: The parts during which the ranks may have been training: time lost ends where one begins.
RUNNING = ("productive", "unknown", "recomputed")


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
    sweep, steps, end = sweep_mod.run_sweep(run, start)
    ended = end is not None
    if end is None:
        end = max(now if now is not None else 0.0, float(run[-1].get("ts", start)), sweep.since)
    sweep.to("end", end)
    spans = _carve_startup(sweep.spans, steps, sweep.outputs)
    for attempt, since, detected in sweep.hangs:
        spans, _ = _relabel(spans, attempt, since, detected, "hung", RUNNING + ("startup", "restarting"))
    spans, failures = _carve_recomputed(spans, sweep.failures, steps)
    parts = dict.fromkeys(PARTS, 0.0)
    for part, begin, stop, _ in spans:
        parts[part] += stop - begin
    return Goodput(start, end, parts, tuple(_charge(f, spans) for f in failures), tuple(spans), ended)


def _carve_startup(spans: List[Span], steps: StepLog,
                   outputs: Dict[int, float]) -> List[Span]:
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


def _carve_recomputed(spans: List[Span], failures: List[Failure],
                      steps: StepLog) -> Tuple[List[Span], List[Failure]]:
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


def _recompute_start(steps: StepLog, attempt: int, resumed: int) -> float:
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


def _relabel(spans: List[Span], attempt: int, lo: float, hi: float,
             label: str = "recomputed", source: Tuple[str, ...] = ("productive",),
             ) -> Tuple[List[Span], float]:
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


def _charge(failure: Failure, spans: List[Span]) -> Failure:
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
