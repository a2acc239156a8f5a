"""The restart policy's failure classes with real processes: a transient start-up failure retried
without spending the budget, a deterministic one stopped at its first repeat with the
cannot-progress exit code (``launcher.supervision.causes``)."""

from tests.helpers.paths import REPO

STARTUP_FAIL = str(REPO / "tests" / "workers" / "startup_fail.py")


def named(events, name):
    return [e for e in events if e["event"] == name]


def test_port_in_use_at_start_up_is_retried_outside_the_budget(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "0"], ["--mode", "port"], worker=STARTUP_FAIL)
    assert code == 0, launcher.stderr
    events = launcher.events()
    [retry] = named(events, "restart")
    assert (retry["scope"], retry["cause"], retry["counted"], retry["backoff"]) == \
        ("retry", "mindspore-port-in-use", False, 5.0)
    assert len(named(events, "attempt_start")) == 2
    assert "retrying in 5 s, not counted against --max-restarts (transient retry 1 of 3)" in launcher.stderr


def test_the_same_import_error_twice_stops_with_the_no_progress_code(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "10", "--no-progress-exit-code", "97"],
                        ["--mode", "import"], worker=STARTUP_FAIL)
    assert code == 97, launcher.stderr
    events = launcher.events()
    assert len(named(events, "attempt_start")) == 2
    [ended] = named(events, "deterministic_failure")
    assert ended["cause"] == "missing-module"
    assert ended["error"] == "ModuleNotFoundError: No module named 'no_such_module_for_the_test'"
    assert named(events, "job_end")[0]["reason"] == "deterministic"
    assert "attempts 0 and 1 failed the same way before their first step" in launcher.stderr
