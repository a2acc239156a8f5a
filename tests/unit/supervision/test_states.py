"""Unit tests for ``launcher.supervision.states``: the worker lifecycle and how a process ended."""

import signal

import pytest

from launcher.supervision.states import TERMINAL, ExitInfo, InvalidTransition, Worker, WorkerState

S = WorkerState
ALLOWED = {
    (S.PENDING, S.RUNNING), (S.PENDING, S.FAILED),
    (S.RUNNING, S.STOPPING), (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED),
    (S.STOPPING, S.STOPPED),
}
ALL_PAIRS = [(a, b) for a in S for b in S]


def worker_in(state: WorkerState, calls=None) -> Worker:
    """A worker driven to ``state`` along an allowed path, then given the recording callback."""
    paths = {S.PENDING: [], S.RUNNING: [S.RUNNING], S.STOPPING: [S.RUNNING, S.STOPPING],
             S.SUCCEEDED: [S.RUNNING, S.SUCCEEDED], S.FAILED: [S.RUNNING, S.FAILED],
             S.STOPPED: [S.RUNNING, S.STOPPING, S.STOPPED]}
    w = Worker(rank=3, label="rank 3")
    for step in paths[state]:
        w.transition(step)
    if calls is not None:
        w.on_change = lambda worker, old: calls.append((worker, old, worker.state))
    return w


@pytest.mark.parametrize("old, new", sorted(ALLOWED, key=lambda p: (p[0].value, p[1].value)))
def test_allowed_transition_notifies_once(old, new):
    calls = []
    w = worker_in(old, calls)
    w.transition(new)
    assert w.state is new
    assert calls == [(w, old, new)]  # called after the change, with the previous state


@pytest.mark.parametrize("old, new", [p for p in ALL_PAIRS if p not in ALLOWED])
def test_forbidden_transition_raises_and_changes_nothing(old, new):
    calls = []
    w = worker_in(old, calls)
    with pytest.raises(InvalidTransition) as exc:
        w.transition(new)
    assert str(exc.value) == f"rank 3: {old.value} -> {new.value}"
    assert w.state is old
    assert calls == []


def test_invalid_transition_is_a_runtime_error_not_a_user_error():
    from launcher.common.errors import LauncherError
    assert issubclass(InvalidTransition, RuntimeError)
    assert not issubclass(InvalidTransition, LauncherError)


def test_full_lifecycle_calls_on_change_once_per_step():
    seen = []
    w = Worker(rank=0, label="rank 0", on_change=lambda worker, old: seen.append((old, worker.state)))
    assert w.state is S.PENDING and not w.done
    for new in (S.RUNNING, S.STOPPING, S.STOPPED):
        w.transition(new)
    assert seen == [(S.PENDING, S.RUNNING), (S.RUNNING, S.STOPPING), (S.STOPPING, S.STOPPED)]
    assert w.done


def test_no_callback_is_fine():
    w = Worker(rank=1, label="rank 1")
    w.transition(S.RUNNING)
    w.transition(S.SUCCEEDED)
    assert w.state is S.SUCCEEDED


@pytest.mark.parametrize("state", list(S))
def test_done_exactly_for_terminal_states(state):
    assert worker_in(state).done is (state in (S.SUCCEEDED, S.FAILED, S.STOPPED))


def test_terminal_states_have_no_way_out():
    assert TERMINAL == {S.SUCCEEDED, S.FAILED, S.STOPPED}
    for state in TERMINAL:
        for new in S:
            with pytest.raises(InvalidTransition):
                worker_in(state).transition(new)


def test_state_values():
    assert [s.value for s in S] == ["pending", "running", "stopping", "succeeded", "failed", "stopped"]


# --------------------------------------------------------------------------- ExitInfo

@pytest.mark.parametrize("returncode, exit_code, name, text", [
    (0, 0, None, "exit code 0"),
    (1, 1, None, "exit code 1"),
    (137, 137, None, "exit code 137"),  # a shell that reported a kill: still a plain exit code
    (-signal.SIGKILL, 137, "SIGKILL", "killed by SIGKILL"),
    (-signal.SIGTERM, 143, "SIGTERM", "killed by SIGTERM"),
    (-signal.SIGSEGV, 139, "SIGSEGV", "killed by SIGSEGV"),
    (-signal.SIGINT, 130, "SIGINT", "killed by SIGINT"),
    (-signal.SIGABRT, 134, "SIGABRT", "killed by SIGABRT"),
])
def test_exit_info(returncode, exit_code, name, text):
    info = ExitInfo(returncode, 1700000000.5)
    assert info.exit_code == exit_code
    assert info.signal_name == name
    assert info.describe() == text
    assert info.wall_time == 1700000000.5


def test_exit_info_unknown_signal_number():
    info = ExitInfo(-200, 0.0)
    assert info.exit_code == 328
    assert info.signal_name == "signal 200"
    assert info.describe() == "killed by signal 200"


def test_exit_info_is_immutable_and_comparable():
    a, b = ExitInfo(1, 2.0), ExitInfo(1, 2.0)
    assert a == b
    with pytest.raises(AttributeError):
        a.returncode = 0
