"""The collector pause shared by threads (the checkpoint index's thread and the planner)."""

import gc
import threading
import weakref

import pytest

from launcher.common import gcpause
from launcher.common.gcpause import collector_paused, freeze_survivors, paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()  # the tests freeze; the rest of the suite's process must not stay frozen
    # Put back what the process had: a test that disables the collector must not leave it off for
    # the files that run after this one in the same worker (the index's freeze waits for it).
    if was:
        gc.enable()
    else:
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


class _Node:
    """A weak-referenceable object that can sit in a reference cycle."""

    def __init__(self):
        self.other = None


def _cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture(name="fresh_freeze")
def _fresh_freeze(monkeypatch):
    """The module's record of the last full pass as in a new process."""
    monkeypatch.setattr(gcpause, "_at_full", -1)
    monkeypatch.setattr(gcpause, "_since_full", 0)


def test_freeze_survivors_takes_what_is_alive_out_of_later_collections(fresh_freeze):
    keep = [_Node() for _ in range(100)]
    assert freeze_survivors()
    assert gc.get_freeze_count() >= len(keep)
    ids = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in ids for o in keep)  # in the permanent generation: no pass traverses them


def test_a_cycle_frozen_alive_is_reclaimed_once_the_frozen_objects_grew_by_a_quarter(fresh_freeze):
    """What is frozen and later becomes cyclic garbage stays until a full pass (young passes do not
    see it); the full pass comes when the objects frozen since the last one reach FULL_PASS_GROWTH
    of those frozen then."""
    assert freeze_survivors()  # the first pass is full
    node, ref = _cycle()
    assert freeze_survivors()  # young: the cycle is alive, now frozen
    del node
    assert freeze_survivors()  # young again: nothing grew
    assert ref() is not None
    grown = [_Node() for _ in range(int(gc.get_freeze_count() * gcpause.FULL_PASS_GROWTH) + 10)]
    assert freeze_survivors()  # full: unfreezes, collects everything
    assert ref() is None
    del grown


def test_freeze_survivors_is_put_off_while_a_thread_has_the_collector_paused(fresh_freeze):
    inside, leave = threading.Event(), threading.Event()

    def plan():
        with collector_paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=plan)
    thread.start()
    try:
        assert inside.wait(5)
        before = gc.get_freeze_count()
        assert not freeze_survivors()
        assert gc.get_freeze_count() == before
    finally:
        leave.set()
        thread.join()
    assert freeze_survivors()


def test_the_startup_pause_counts_with_the_others_and_ends_once():
    assert gc.isenabled()
    gcpause.end_startup_pause()  # without a pause: nothing to end
    assert gc.isenabled()
    gcpause.pause_for_startup()
    gcpause.pause_for_startup()  # once only: one end lets it go
    try:
        assert not gc.isenabled()
        with collector_paused():  # the checkpoint index's thread pauses meanwhile
            gcpause.end_startup_pause()
            assert not gc.isenabled()  # still held by the one inside
        assert gc.isenabled()
        gcpause.end_startup_pause()
        assert gc.isenabled()
    finally:
        gcpause.end_startup_pause()
        gc.enable()


def test_a_run_from_the_command_line_is_parsed_with_the_collector_paused():
    import subprocess
    import sys

    code = ("import gc, launcher.__main__ as m, launcher.commands.fastrun as f; seen = []; "
            "f.run = lambda args: seen.append(gc.isenabled()) or 0; "
            "import sys; sys.argv = ['launcher', 'run', '--', 'true']\n"
            "try:\n    m.main()\nexcept SystemExit:\n    print(seen)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False]"
