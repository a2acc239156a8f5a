"""Goodput from events.jsonl: every second of the wall time in exactly one part."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.monitoring import goodput


def ev(ts, event, **fields):
    return {"ts": ts, "event": event, "run_id": "r", **fields}


def one_failure_run(steps=False):
    """A 2-rank run: attempt 0 fails at t=50, restarts, attempt 1 succeeds at t=100."""
    log = [ev(0.0, "start", max_restarts=3),
           ev(1.0, "attempt_start", attempt=0, ranks=[0, 1]),
           ev(2.0, "rank_spawned", attempt=0, rank=0), ev(3.0, "rank_spawned", attempt=0, rank=1)]
    if steps:
        log += [ev(4.0, "restore_plan", attempt=0, step=0),
                ev(45.0, "heartbeat", rank=0, step=40)]
    log += [ev(50.5, "rank_exited", attempt=0, rank=1, state="failed", exit_code=3, signal=None, exited_at=50.0),
            ev(51.0, "stop_group", attempt=0, reason="rank 1 failed"),
            ev(55.0, "rank_exited", attempt=0, rank=0, state="stopped", exited_at=55.0),
            ev(56.0, "attempt_end", attempt=0, failed=True),
            ev(57.0, "restart", attempt=1, scope="group", restarts_left=2),
            ev(58.0, "cluster_hold", reason="FaultFlushing"),
            ev(68.0, "cluster_hold_end", waited_for=True),
            ev(69.0, "attempt_start", attempt=1, ranks=[0, 1])]
    if steps:
        log += [ev(69.5, "restore_plan", attempt=1, step=20)]
    log += [ev(70.0, "rank_spawned", attempt=1, rank=0), ev(71.0, "rank_spawned", attempt=1, rank=1),
            ev(99.0, "attempt_end", attempt=1, failed=False),
            ev(100.0, "job_end", reason="succeeded"), ev(100.0, "stop", reason="succeeded")]
    return log


def with_outputs(log, *outputs):
    """``log`` with ``rank_output`` events ``(ts, attempt, rank, at)`` put in time order."""
    return sorted(log + [ev(ts, "rank_output", attempt=a, rank=r, at=at) for ts, a, r, at in outputs],
                  key=lambda e: e["ts"])


def test_without_step_beats_nothing_is_called_productive():
    """No step beats and no output: the launcher saw the ranks spawned and exit, nothing about training
    in between: that time is unknown, and the goodput a bound, not a number."""
    g = goodput.compute(one_failure_run())
    assert g.wall == 100.0 and g.ended
    assert g.parts == {"startup": 3.0, "productive": 0.0, "unknown": 47.0 + 28.0, "detection": 0.5, "hung": 0.0,
                       "stopping": 5.5 + 1.0, "restarting": 2.0 + 3.0, "waiting": 10.0, "recomputed": 0.0,
                       "device_wait": 0.0}
    [failure] = g.failures
    assert (failure.attempt, failure.rank, failure.cause) == (0, 1, "exit code 3")
    assert failure.time_lost == 0.5 + 5.5 + 2.0 + 10.0 + 3.0  # up to attempt 1's ranks running again
    assert failure.steps_recomputed is None  # no step numbers in the events: not guessed
    assert g.ratio is None and g.bounds == (0.0, 0.75)
    assert g.summary().startswith("goodput at most 75.0% of 100.0 s: productive 0.0 s, unknown 75.0 s,")
    assert g.to_json()["ratio"] is None and g.to_json()["ratio_bounds"] == [0.0, 0.75]


def test_spawn_to_first_output_is_startup_or_restarting():
    """Attempt 0's first output at t=10 (rank 1; rank 0 at 12), attempt 1's at t=76: from the spawns
    until then is start-up / restart; the failure costs the restart's ranks' silence too."""
    log = with_outputs(one_failure_run(), (10.2, 0, 1, 10.0), (12.2, 0, 0, 12.0), (76.1, 1, 0, 76.0))
    g = goodput.compute(log)
    assert g.parts["startup"] == 10.0 and g.parts["unknown"] == 40.0 + 23.0
    assert g.parts["restarting"] == 2.0 + 3.0 + 5.0
    assert g.failures[0].time_lost == 0.5 + 5.5 + 2.0 + 10.0 + 8.0
    assert math.isclose(sum(g.parts.values()), g.wall)


def hung_run(last_output=30.0, last_beat=None):
    """2 ranks, no step beats: rank 0 prints from t=5, goes silent at ``last_output``, is found hung at
    t=40 (stopping until 43); attempt 1 prints at t=50 and succeeds at t=90."""
    return [ev(0.0, "start"), ev(1.0, "attempt_start", attempt=0, ranks=[0, 1]),
            ev(2.0, "rank_spawned", attempt=0, rank=0), ev(2.0, "rank_spawned", attempt=0, rank=1),
            ev(5.1, "rank_output", attempt=0, rank=0, at=5.0),
            ev(40.0, "hang_detected", attempt=0, rank=0, reason="no heartbeat or output for 10.0 s",
               hung_ranks=[0], last_output=last_output, last_beat=last_beat),
            ev(42.0, "rank_exited", attempt=0, rank=0, state="failed", signal="SIGKILL", exited_at=41.9),
            ev(43.0, "attempt_end", attempt=0, failed=True), ev(44.0, "restart", attempt=1, scope="group"),
            ev(45.0, "attempt_start", attempt=1, ranks=[0, 1]),
            ev(46.0, "rank_spawned", attempt=1, rank=0), ev(46.0, "rank_spawned", attempt=1, rank=1),
            ev(50.1, "rank_output", attempt=1, rank=1, at=50.0),
            ev(89.0, "attempt_end", attempt=1, failed=False), ev(90.0, "job_end", reason="succeeded")]


def test_after_a_hung_ranks_last_output_the_time_is_lost():
    g = goodput.compute(hung_run())
    assert g.parts["hung"] == 10.0 and g.parts["unknown"] == 25.0 + 39.0
    assert g.parts["startup"] == 5.0 and g.parts["restarting"] == 2.0 + 1.0 + 4.0
    assert g.parts["stopping"] == 3.0 + 1.0 and g.parts["detection"] == 0.0 and g.parts["productive"] == 0.0
    [failure] = g.failures
    assert (failure.rank, failure.cause, failure.at) == (0, "hung (no heartbeat or output for 10.0 s)", 30.0)
    assert failure.time_lost == 10.0 + 3.0 + 7.0
    assert math.isclose(sum(g.parts.values()), g.wall)


def test_a_hung_rank_silent_since_its_last_beat_or_its_spawn():
    assert goodput.compute(hung_run(last_output=20.0, last_beat=33.0)).parts["hung"] == 7.0
    g = goodput.compute(hung_run(last_output=None))  # it never printed: lost from its spawn
    assert g.parts["hung"] == 38.0 and g.parts["startup"] == 2.0 and g.failures[0].at == 2.0


def test_recomputed_steps_from_step_events_and_the_restore_plan():
    """Attempt 0 reached step 40 (heartbeat); attempt 1 resumes at step 20, beats its first step at
    t=72 and is back at step 40 at t=80: 20 steps recomputed in 8 s, charged to the failure; its ranks'
    second from spawned (t=71) to that first step is restarting, not productive."""
    log = one_failure_run(steps=True)
    at = next(i for i, e in enumerate(log) if e["event"] == "attempt_end" and e["attempt"] == 1)
    log[at:at] = [ev(72.0, "heartbeat", rank=0, step=20), ev(80.0, "heartbeat", rank=1, step=40)]
    g = goodput.compute(log)
    [failure] = g.failures
    assert (failure.steps_recomputed, failure.recompute_seconds) == (20, 8.0)
    assert g.parts["recomputed"] == 8.0 and g.parts["productive"] == 47.0 + 28.0 - 8.0 - 1.0
    assert g.parts["restarting"] == 2.0 + 3.0 + 1.0
    assert failure.time_lost == 0.5 + 5.5 + 2.0 + 10.0 + 3.0 + 1.0 + 8.0
    assert math.isclose(sum(g.parts.values()), g.wall)
    ran = [s[:3] for s in g.spans if s[3] == 1 and s[0] in ("productive", "recomputed")]
    assert ran == [("recomputed", 72.0, 80.0), ("productive", 80.0, 99.0)]
    assert g.summary().endswith("; 1 failure(s), 20 steps recomputed")
    assert g.to_json()["steps_recomputed"] == 20 and g.to_json()["failures"][0]["recompute_seconds"] == 8.0


def hangwatch_run():
    """Two failures, steps as the hang detector records them (step_first / step_regained at the beat's
    time ``at``, step_last at each attempt's end): attempt 0 reaches 70 and fails; attempt 1 resumes
    at 60, regains 70 at t=130 and fails at step 85; attempt 2 resumes at 80 and never gets to 85."""
    return [ev(0.0, "start"), ev(1.0, "attempt_start", attempt=0, ranks=[0]),
            ev(2.0, "rank_spawned", attempt=0, rank=0), ev(2.5, "restore_plan", attempt=0, step=None),
            ev(6.0, "step_first", attempt=0, step=1, at=5.0),
            ev(100.0, "rank_exited", attempt=0, rank=0, state="failed", exit_code=1, exited_at=100.0),
            ev(101.0, "attempt_end", attempt=0, failed=True), ev(101.0, "step_last", attempt=0, step=70,
                                                                 ranks={"0": 70}),
            ev(102.0, "restart", attempt=1, scope="group"), ev(103.0, "restore_plan", attempt=1, step=60),
            ev(104.0, "attempt_start", attempt=1, ranks=[0]), ev(110.0, "rank_spawned", attempt=1, rank=0),
            ev(121.0, "step_first", attempt=1, step=60, at=120.0),
            ev(131.0, "step_regained", attempt=1, step=70, at=130.0),
            ev(200.0, "rank_exited", attempt=1, rank=0, state="failed", signal="SIGKILL", exited_at=200.0),
            ev(201.0, "attempt_end", attempt=1, failed=True), ev(201.0, "step_last", attempt=1, step=85),
            ev(202.0, "restore_plan", attempt=2, step=80), ev(203.0, "attempt_start", attempt=2, ranks=[0]),
            ev(204.0, "rank_spawned", attempt=2, rank=0), ev(211.0, "step_first", attempt=2, step=80, at=210.0),
            ev(230.0, "stop_group", reason="SIGTERM"), ev(231.0, "attempt_end", attempt=2, failed=False),
            ev(232.0, "step_last", attempt=2, step=84), ev(233.0, "job_end"), ev(233.0, "stop")]


def test_steps_recomputed_per_failure_from_the_hang_detectors_events():
    g = goodput.compute(hangwatch_run())
    first, second = g.failures
    assert (first.steps_recomputed, first.recompute_seconds) == (10, 10.0)    # 120 -> 130
    assert (second.steps_recomputed, second.recompute_seconds) == (5, 20.0)   # 210 -> 230, never regained
    assert g.parts["recomputed"] == 30.0
    assert math.isclose(sum(g.parts.values()), g.wall)
    # stopping, restarting (spawning, then the rank's start-up until its first step), recomputed; not
    # the job's own shutdown after the recomputation (no productive time follows it)
    assert second.time_lost == (201.0 - 200.0) + (204.0 - 201.0) + (210.0 - 204.0) + 20.0
    assert g.parts["startup"] == 5.0  # start -> attempt 0's first step at t=5 (spawned at t=2)
    assert "15 steps recomputed" in g.summary()


def with_first_beat(attempt, step, at):
    log = hangwatch_run()
    [first] = [e for e in log if e["event"] == "step_first" and e["attempt"] == attempt]
    first.update(step=step, at=at)
    return log


def test_a_first_beat_seen_past_the_resume_step_is_moved_back_at_the_rate_that_followed():
    """The slots are polled: attempt 1 (resumed at 60) is first seen at step 63 at t=123 and at 70 at
    t=130, 1 s a step, so it started re-running at t=120; seen first already at 70, no rate: from its
    productive start (t=110)."""
    assert goodput.compute(with_first_beat(1, 63, 123.0)).failures[0].recompute_seconds == 10.0
    assert goodput.compute(with_first_beat(1, 70, 130.0)).failures[0].recompute_seconds == 20.0


def test_without_steps_it_says_unknown_never_zero():
    g = goodput.compute(one_failure_run())
    assert g.summary().endswith("; 1 failure(s), steps recomputed unknown")
    assert g.to_json()["steps_recomputed"] is None and g.failures[0].recompute_seconds is None
    # Steps known but no beat in the next attempt (it died before its first step): the count, not the time.
    log = [e for e in hangwatch_run() if not (e["event"] in ("step_first", "step_regained") and e["attempt"] == 1)]
    first = goodput.compute(log).failures[0]
    assert (first.steps_recomputed, first.recompute_seconds) == (10, None)
    # No restore plan (no --checkpoint-dir): where the next attempt resumed is unknown.
    log = [e for e in hangwatch_run() if e["event"] != "restore_plan"]
    assert [f.steps_recomputed for f in goodput.compute(log).failures] == [None, None]


def test_a_live_run_ends_now_and_only_the_newest_run_counts():
    old = [dict(e, run_id="old") for e in one_failure_run()]
    live = [ev(200.0, "start"), ev(201.0, "attempt_start", attempt=0, ranks=[0]),
            ev(202.0, "rank_spawned", attempt=0, rank=0), ev(205.0, "rank_output", attempt=0, rank=0, at=204.0)]
    g = goodput.compute(old + live, now=250.0)
    assert (g.start, g.end, g.ended) == (200.0, 250.0, False)
    assert g.parts["unknown"] == 46.0 and g.parts["startup"] == 4.0


def test_an_empty_log():
    g = goodput.compute([], now=5.0)
    assert g.wall == 0 and g.ratio is None and "?" in g.summary()


KINDS = ["attempt_start", "rank_spawned", "rank_exited", "stop_group", "gasp", "attempt_end", "restart",
         "cluster_hold", "cluster_hold_end", "heartbeat", "restore_plan", "job_end", "other",
         "step_first", "step_regained", "step_last", "rank_output", "hang_detected"]


@st.composite
def event_logs(draw):
    """Arbitrary event sequences, timestamps not even monotonic (clock steps, a damaged file)."""
    n = draw(st.integers(0, 40))
    log = [ev(draw(st.floats(0, 1e6)), "start")]
    for _ in range(n):
        kind = draw(st.sampled_from(KINDS))
        fields = {"attempt": draw(st.integers(0, 3)), "rank": draw(st.integers(0, 3)),
                  "ranks": draw(st.lists(st.integers(0, 3), max_size=4)), "failed": draw(st.booleans()),
                  "state": draw(st.sampled_from(["failed", "stopped", "succeeded"])),
                  "exited_at": draw(st.floats(0, 1e6)), "step": draw(st.integers(0, 1000)),
                  "scope": draw(st.sampled_from(["group", "rank"])), "after_rank": draw(st.integers(0, 3)),
                  "at": draw(st.floats(0, 1e6)), "last_output": draw(st.none() | st.floats(0, 1e6)),
                  "last_beat": draw(st.none() | st.floats(0, 1e6))}
        log.append(ev(draw(st.floats(0, 1e6)), kind, **fields))
    return log


@settings(max_examples=200, deadline=None)
@given(event_logs(), st.floats(0, 2e6))
def test_parts_always_add_up_to_the_wall_time(log, now):
    g = goodput.compute(log, now=now)
    assert set(g.parts) == set(goodput.PARTS)
    assert all(v >= 0 for v in g.parts.values())
    assert math.isclose(sum(g.parts.values()), g.wall, rel_tol=1e-9, abs_tol=1e-6)
    assert all(0 <= f.time_lost <= g.wall + 1e-6 for f in g.failures)
    assert math.isclose(sum(f.recompute_seconds or 0.0 for f in g.failures), g.parts["recomputed"], abs_tol=1e-6)
    spans = g.spans
    assert all(a[2] <= b[1] + 1e-9 for a, b in zip(spans, spans[1:]))  # in order, no overlap
