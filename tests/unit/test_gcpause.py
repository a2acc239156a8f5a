"""The collector pause shared by threads (the checkpoint index's thread and the planner)."""

import gc
import threading

import pytest

from launcher.common.gcpause import collector_paused, paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_a_pause_ending_in_another_thread_keeps_the_collector_off_for_the_one_still_inside():
    """The index's step ends while a plan runs: the plan must stay paused (the per-thread
    save-and-restore re-enabled it there)."""
    inside, leave = threading.Event(), threading.Event()

    def index_step():
        with collector_paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=index_step)
    thread.start()
    assert inside.wait(5)
    with collector_paused():  # the plan begins while the step runs
        leave.set()
        thread.join(5)
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_plan_ending_first_leaves_it_off_for_the_step_and_on_after_both():
    entered, release = threading.Event(), threading.Event()
    states = []

    def index_step():
        with collector_paused():
            entered.set()
            release.wait(5)
            states.append(gc.isenabled())

    with collector_paused():
        thread = threading.Thread(target=index_step)
        thread.start()
        assert entered.wait(5)
    release.set()
    thread.join(5)
    assert states == [False] and gc.isenabled()


def test_a_collector_disabled_by_the_program_stays_disabled():
    gc.disable()

    @paused
    def work(value):
        return value * 2

    assert work(21) == 42
    assert not gc.isenabled()


def test_an_exception_still_restores_it():
    with pytest.raises(ValueError):
        with collector_paused():
            raise ValueError("boom")
    assert gc.isenabled()
