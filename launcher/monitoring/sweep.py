"""The goodput's sweep (see :mod:`launcher.monitoring.goodput`): the events of a run, in file order,
move one current part along; each kind of event has one handler over the sweep's explicit state, and
the table :data:`HANDLERS` says which parts each acts in. The steps each attempt reached are logged on
the way (:class:`StepLog`) for the recomputation carved out afterwards.
"""

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

#: ``(part, begin, end, attempt)``: one interval of the wall time.
Span = Tuple[str, float, float, int]


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


class Sweep:
    """The sweep's state: the current part, since when, in which attempt; a span closed at every change.

    Attributes:
        pending: Ranks of the attempt not spawned yet (the part turns ``productive`` when none is left).
        held_from: The part a cluster hold or a device wait interrupted (resumed when it ends).
        spawned: rank -> when it was spawned in this attempt.
        outputs: attempt -> its first output (``rank_output.at``).
        hangs: ``(attempt, hung rank silent since, detected)``.
        failures: The failures so far.
    """

    def __init__(self, start: float):
        self.part, self.since, self.attempt = "startup", start, 0
        self.spans: List[Span] = []
        self.pending: set = set()
        self.held_from = "restarting"
        self.spawned: Dict[int, float] = {}
        self.outputs: Dict[int, float] = {}
        self.hangs: List[Tuple[int, float, float]] = []
        self.failures: List[Failure] = []

    def to(self, part: str, at: float) -> None:
        at = max(at, self.since)
        if at > self.since:
            self.spans.append((self.part, self.since, at, self.attempt))
        self.part, self.since = part, at


class StepLog:
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


def _attempt_start(sweep: Sweep, ev: dict, ts: float) -> None:
    attempt = int(ev.get("attempt", sweep.attempt))
    if sweep.part not in ("startup", "waiting"):
        sweep.to("restarting" if attempt else "startup", ts)
    sweep.attempt, sweep.pending, sweep.spawned = attempt, set(ev.get("ranks") or ()), {}


def _rank_spawned(sweep: Sweep, ev: dict, ts: float) -> None:
    sweep.pending.discard(ev.get("rank"))
    sweep.spawned[ev.get("rank")] = ts
    if not sweep.pending and sweep.part in ("startup", "restarting"):
        sweep.to("productive", ts)


def _rank_exited(sweep: Sweep, ev: dict, ts: float) -> None:
    """A failed rank: detection from its exit until the launcher recorded it, then stopping."""
    if ev.get("state") != "failed":
        return
    exited = min(float(ev.get("exited_at") or ts), ts)
    sweep.to("detection", exited)
    sweep.to("stopping", ts)
    cause = f"signal {ev['signal']}" if ev.get("signal") else f"exit code {ev.get('exit_code')}"
    sweep.failures.append(Failure(sweep.attempt, ev.get("rank"), cause, exited))


def _rank_output(sweep: Sweep, ev: dict, ts: float) -> None:
    if isinstance(ev.get("at"), (int, float)):
        attempt = ev.get("attempt", sweep.attempt)
        sweep.outputs[attempt] = min(float(ev["at"]), sweep.outputs.get(attempt, float("inf")))


def _hang_detected(sweep: Sweep, ev: dict, ts: float) -> None:
    """Hung from the rank's last output or beat (its spawn without either) until it was found."""
    signs = [t for t in (ev.get("last_beat"), ev.get("last_output")) if isinstance(t, (int, float))]
    since = min(max(signs) if signs else sweep.spawned.get(ev.get("rank"), sweep.since), ts)
    sweep.hangs.append((sweep.attempt, since, ts))
    sweep.to("stopping", ts)
    sweep.failures.append(Failure(sweep.attempt, ev.get("rank"), f"hung ({ev.get('reason')})", since))


def _stop_requested(sweep: Sweep, ev: dict, ts: float) -> None:
    sweep.to("stopping", ts)  # a signal or request (prestop, exit): stopping time, not a failure


def _attempt_end(sweep: Sweep, ev: dict, ts: float) -> None:
    sweep.to("restarting" if ev.get("failed") else "stopping", ts)


def _restart(sweep: Sweep, ev: dict, ts: float) -> None:
    if ev.get("scope") == "rank":  # one rank restarted in place: productive again once it is spawned
        sweep.pending = {ev.get("after_rank")}
        if sweep.part == "stopping":
            sweep.to("restarting", ts)


def _hold(part: str) -> Callable[[Sweep, dict, float], None]:
    def held(sweep: Sweep, ev: dict, ts: float) -> None:
        sweep.held_from = sweep.part
        sweep.to(part, ts)
    return held


def _resume(sweep: Sweep, ev: dict, ts: float) -> None:
    sweep.to(sweep.held_from, ts)


#: The parts the sweep moves through (the others are carved out of ``productive`` afterwards).
_SWEPT = ("startup", "productive", "detection", "stopping", "restarting", "waiting", "device_wait")
_ANY = frozenset(_SWEPT)
_PRODUCTIVE = frozenset(("productive",))
#: What each kind of event does to the sweep: (the parts it acts in, handler(sweep, event, ts)).
HANDLERS: Dict[str, Tuple[frozenset, Callable[[Sweep, dict, float], None]]] = {
    "attempt_start": (_ANY, _attempt_start),
    "rank_spawned": (_ANY, _rank_spawned),
    "rank_exited": (_PRODUCTIVE, _rank_exited),
    "rank_output": (_ANY, _rank_output),
    "hang_detected": (_PRODUCTIVE, _hang_detected),
    "stop_group": (_PRODUCTIVE, _stop_requested),
    "gasp": (_PRODUCTIVE, _stop_requested),
    "attempt_end": (_ANY, _attempt_end),
    "restart": (_ANY, _restart),
    "cluster_hold": (_ANY - {"waiting"}, _hold("waiting")),
    "cluster_hold_end": (frozenset(("waiting",)), _resume),
    "device_wait": (_ANY - {"waiting", "device_wait"}, _hold("device_wait")),
    "device_wait_end": (frozenset(("device_wait",)), _resume),
}


#: The events that carry steps.
_STEP_EVENTS = frozenset(("heartbeat", "rank_exited", "step_first", "step_regained", "step_last"))
#: The events that move the sweep, end the run or carry steps (the others are skipped unread).
_KINDS = _STEP_EVENTS | {"job_end", "stop", "restore_plan"} | set(HANDLERS)


def run_sweep(run: List[dict], start: float) -> Tuple[Sweep, StepLog, Optional[float]]:
    """The sweep over one run's events from ``start``, the steps they carried, and when the run recorded
    its end (None: it has not)."""
    state, steps = Sweep(start), StepLog()
    for ev in run:
        kind = ev.get("event")
        if kind not in _KINDS:
            continue  # notes that neither move the sweep nor carry steps: skipped before any work
        ts = max(float(ev.get("ts", state.since)), state.since)
        steps.see(ev, kind)
        if kind in ("job_end", "stop"):
            return state, steps, ts
        parts, handler = HANDLERS.get(kind, (frozenset(), None))
        if state.part in parts:
            handler(state, ev, ts)  # type: ignore[misc]
    return state, steps, None
