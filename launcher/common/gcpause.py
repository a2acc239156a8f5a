"""Cyclic garbage collection paused while any thread asks, restored when the last one is done.

``gc.disable()`` is process-wide. The checkpoint index's thread and the planner both pause the
collector around work that allocates tens of thousands of short-lived containers (a full collection
would traverse the whole long-lived index). Each restoring the state *it* saw is wrong with two
threads: the index's step ending in the middle of a plan re-enabled the collector there, and the
plan paid the full pass (432 of 570 ms profiled). One count for the process fixes that.

:func:`freeze_survivors` takes a long-lived structure out of the collector's passes altogether.
"""

import functools
import gc
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

_lock = threading.Lock()
_holders = 0
_was_enabled = False
_startup = False  # pause_for_startup holds the collector off

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection until every thread inside one of these has left it."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()


def pause_for_startup() -> None:
    """Hold the collector off while the launcher starts, until :func:`end_startup_pause`.

    Importing the launcher's modules and building the job allocate many objects that live as long
    as the process: the young passes over them were about 4 ms of CPU on the way to the first rank
    (27 young and 3 middle passes in ``launcher run``), collecting nothing. Counted with
    :func:`collector_paused`, so a thread pausing meanwhile leaves it paused until both are done.
    """
    global _holders, _was_enabled, _startup
    with _lock:
        if _startup:
            return
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
        _startup = True


def end_startup_pause() -> None:
    """The first ranks run (or the launcher waits for something): the collector as before, once
    nothing else holds it off. A no-op without :func:`pause_for_startup`."""
    global _holders, _startup
    with _lock:
        if not _startup:
            return
        _startup = False
        _holders -= 1
        if _holders == 0 and _was_enabled:
            gc.enable()


def paused(function: F) -> F:
    """Decorator form of :func:`collector_paused`."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with collector_paused():
            return function(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


#: A full pass when the objects frozen since the last one reach this share of those frozen then
#: (CPython's own rule for its oldest generation: ``long_lived_pending > long_lived_total / 4``).
FULL_PASS_GROWTH = 0.25
_at_full = -1  # objects frozen right after the last full pass; -1: none yet
_since_full = 0  # objects frozen by young passes since


def freeze_survivors() -> bool:
    """Collect, then move every surviving object to the permanent generation (``gc.freeze``): later
    collections no longer traverse them. Meant for a long-lived structure just grown (the checkpoint
    index after a save round: a full collection of its 300k objects takes 0.3 s of GIL at 16,384
    ranks, in whichever thread allocates when it falls due, the plan before a restart included).

    The collection is young: it traverses only what is not frozen yet (what the process allocated
    since the last call), a few ms. What is frozen is never reclaimed by it if it later becomes
    unreachable *in a cycle* (reference counting still frees the rest); so once the objects frozen
    since the last full pass reach ``FULL_PASS_GROWTH`` of those frozen then (and on the first call),
    the pass is full: unfreeze, collect everything, freeze again. That bounds such garbage as CPython
    bounds its own. (``gc.get_freeze_count`` walks all frozen objects: only full passes call it.)

    Returns:
        False, having done nothing, while a thread is inside :func:`collector_paused` (a plan) or
        the collector is disabled: the caller tries again later.
    """
    global _at_full, _since_full
    with _lock:
        if _holders or not gc.isenabled():
            return False
        gc.collect()  # young: traverses only what is not frozen (everything, the first time)
        _since_full += len(gc.get_objects())  # the survivors, about to be frozen
        gc.freeze()
        if _at_full < 0 or _since_full > _at_full * FULL_PASS_GROWTH:
            if _at_full >= 0:
                gc.unfreeze()
                gc.collect()
                gc.freeze()
            _at_full, _since_full = gc.get_freeze_count(), 0
        return True
