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


def test_parts_of_a_run_with_one_failure():
    g = goodput.compute(one_failure_run())
    assert g.wall == 100.0 and g.ended
    assert g.parts == {"startup": 3.0, "productive": 47.0 + 28.0, "detection": 0.5, "stopping": 5.5 + 1.0,
                       "restarting": 2.0 + 3.0, "waiting": 10.0, "recomputed": 0.0}
    [failure] = g.failures
    assert (failure.attempt, failure.rank, failure.cause) == (0, 1, "exit code 3")
    assert failure.time_lost == 0.5 + 5.5 + 2.0 + 10.0 + 3.0  # up to attempt 1's productive time
    assert failure.steps_recomputed is None  # no step numbers in the events: not guessed
    assert math.isclose(g.ratio, 0.75)


def test_recomputed_steps_from_step_events_and_the_restore_plan():
    g = goodput.compute(one_failure_run(steps=True))
    [failure] = g.failures
    # Attempt 0 reached step 40 (heartbeat) in 47 s of productive time; attempt 1 resumes at step 20.
    assert failure.steps_recomputed == 20
    assert math.isclose(g.parts["recomputed"], 20 * 47.0 / 40)
    assert math.isclose(sum(g.parts.values()), g.wall)


def test_a_live_run_ends_now_and_only_the_newest_run_counts():
    old = [dict(e, run_id="old") for e in one_failure_run()]
    live = [ev(200.0, "start"), ev(201.0, "attempt_start", attempt=0, ranks=[0]),
            ev(202.0, "rank_spawned", attempt=0, rank=0)]
    g = goodput.compute(old + live, now=250.0)
    assert (g.start, g.end, g.ended) == (200.0, 250.0, False)
    assert g.parts["productive"] == 48.0 and g.parts["startup"] == 2.0


def test_an_empty_log():
    g = goodput.compute([], now=5.0)
    assert g.wall == 0 and g.ratio is None and "?" in g.summary()


KINDS = ["attempt_start", "rank_spawned", "rank_exited", "stop_group", "gasp", "attempt_end", "restart",
         "cluster_hold", "cluster_hold_end", "heartbeat", "restore_plan", "job_end", "other"]


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
                  "scope": draw(st.sampled_from(["group", "rank"])), "after_rank": draw(st.integers(0, 3))}
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
    spans = g.spans
    assert all(a[2] <= b[1] + 1e-9 for a, b in zip(spans, spans[1:]))  # in order, no overlap
