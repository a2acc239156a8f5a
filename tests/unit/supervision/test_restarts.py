"""The restart policy's failure classes, through the supervisor with scripted events (no processes):
transient start-up failures retried outside the budget, a deterministic one ended at its first
repeat, and the cannot-progress exit code."""

from typing import List

from launcher.supervision.causes import MAX_TRANSIENT_RETRIES
from launcher.supervision.policy import RestartPolicy
from tests.unit.supervision.test_supervisor import ScriptedGroup, exited, specs_for, supervisor

PORT = "Failed to call bind, url: 127.0.0.1:8118 Address already in use\nFailed to init the tcp server\n"
NO_MODULE = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'modle'\n"


def crash(rank=1, code=1):
    return [exited(rank, code), exited(1 - rank, -15)]


class ClockedGroup(ScriptedGroup):
    """A timeout passes at once on a fake clock (the retry waits)."""

    now = 0.0

    def wait_event(self, timeout):
        event = super().wait_event(timeout)
        if event is None:
            self.now += timeout
        return event


def run(scripts, texts, steps=None, **policy):
    """``texts``: attempt -> rank -> what it wrote; ``steps``: attempt -> highest step."""
    group = ClockedGroup(scripts)
    events: List[tuple] = []
    sup = supervisor(group, specs_for(2), RestartPolicy(**policy), lambda name, **kw: events.append((name, kw)),
                     failure_text=lambda attempt, rank: texts.get(attempt, {}).get(rank, ""),
                     progress=(steps or {}).get, clock=lambda: group.now)
    return sup.run(), events, sup


def named(events, name):
    return [kw for n, kw in events if n == name]


def test_transient_start_up_failure_is_retried_without_spending_the_budget():
    result, events, sup = run([crash(), crash(), [exited(0, 0), exited(1, 0)]], {0: {1: PORT}, 1: {1: PORT}},
                              max_restarts=0)
    assert (result.reason, result.exit_code, result.attempts) == ("succeeded", 0, 3)
    assert sup.restarts == 0
    retries = named(events, "restart")
    assert [(r["scope"], r["cause"], r["counted"], r["retry"], r["backoff"]) for r in retries] == [
        ("retry", "mindspore-port-in-use", False, 1, 5.0), ("retry", "mindspore-port-in-use", False, 2, 5.0)]
    assert retries[0]["error"] == "Failed to call bind, url: 127.0.0.1:8118 Address already in use"


def test_transient_retries_are_bounded_then_count_against_the_budget():
    n = MAX_TRANSIENT_RETRIES
    scripts = [crash() for _ in range(n + 2)]
    texts = {a: {1: PORT} for a in range(n + 2)}
    result, events, sup = run(scripts, texts, max_restarts=1)
    scopes = [r["scope"] for r in named(events, "restart")]
    assert scopes == ["retry"] * n + ["group"]
    assert (result.reason, result.exit_code, result.attempts, sup.restarts) == ("failed", 1, n + 2, 1)


def test_a_failure_after_the_first_step_is_never_transient():
    result, events, _ = run([crash(), crash()], {0: {1: PORT}, 1: {1: PORT}}, steps={0: 5, 1: 9}, max_restarts=1)
    assert [r["scope"] for r in named(events, "restart")] == ["group"]
    assert result.reason == "failed"


def test_the_same_deterministic_error_twice_ends_the_job_with_the_no_progress_code(caplog):
    texts = {a: {0: NO_MODULE, 1: NO_MODULE} for a in range(5)}
    with caplog.at_level("ERROR"):
        result, events, sup = run([crash() for _ in range(5)], texts, max_restarts=4, no_progress_exit_code=77)
    assert (result.reason, result.exit_code, result.attempts, sup.restarts) == ("deterministic", 77, 2, 1)
    [ended] = named(events, "deterministic_failure")
    assert ended == {"attempt": 1, "cause": "missing-module", "error": "ModuleNotFoundError: No module named 'modle'",
                     "ranks": [0, 1], "exit_code": 77}
    assert "attempts 0 and 1 failed the same way before their first step" in caplog.text


def test_different_errors_or_progress_are_not_deterministic():
    other = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'other'\n"
    result, events, _ = run([crash() for _ in range(3)], {0: {1: NO_MODULE}, 1: {1: other}, 2: {1: NO_MODULE}},
                            max_restarts=2)
    assert (result.reason, result.attempts) == ("failed", 3)
    result, _, _ = run([crash() for _ in range(3)], {a: {1: NO_MODULE} for a in range(3)}, steps={0: 1, 1: 2, 2: 3},
                       max_restarts=2)
    assert (result.reason, result.attempts) == ("failed", 3)


def test_ranks_failing_with_different_errors_are_not_one_deterministic_failure():
    other = "SyntaxError: invalid syntax\n"
    texts = {a: {1: NO_MODULE, 0: other} for a in range(3)}
    result, _, _ = run([[exited(1, 1), exited(0, 1)] for _ in range(3)], texts, max_restarts=2)
    assert (result.reason, result.attempts) == ("failed", 3)


def test_budget_spent_at_one_step_is_no_progress():
    result, events, _ = run([crash() for _ in range(3)], {}, steps={0: 40, 1: 40, 2: 38}, max_restarts=2)
    assert (result.reason, result.exit_code) == ("no-progress", 93)
    assert named(events, "restart_budget_spent")[0]["progress"] is False
    result, events, _ = run([crash() for _ in range(3)], {}, steps={0: 40, 1: 41, 2: 41}, max_restarts=2)
    assert (result.reason, result.exit_code) == ("failed", 1)
