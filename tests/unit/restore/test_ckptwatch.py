"""The indexer thread (``launcher.restore.ckptwatch``): its wait, on descriptors of any number, and\nthe collect-and-freeze passes it runs for the index."""

import gc
import os
import resource
import time

import pytest

from launcher.restore.ckptindex import CheckpointIndex
from launcher.restore.ckptwatch import _ready

FD_SETSIZE = 1024  # select()'s limit on descriptor numbers


@pytest.fixture(name="high_fds")
def _high_fds():
    """Every descriptor below ``FD_SETSIZE`` taken while the test opens its own, then freed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FD_SETSIZE + 64:
        if hard != resource.RLIM_INFINITY and hard < FD_SETSIZE + 64:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {FD_SETSIZE + 64}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_SETSIZE + 64, hard))
    fillers = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            fillers.append(fd)
            if fd >= FD_SETSIZE - 1:
                break

        def release():
            for fd in fillers:
                os.close(fd)
            fillers.clear()

        yield release
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_indexer_thread_works_with_descriptors_numbered_above_fd_setsize(tmp_path, high_fds):
    """A launcher with many ranks' pipes and log files open gives the index descriptors numbered
    1024 and up. ``select.select`` raised ValueError on them and the thread ended silently."""
    (tmp_path / "rank_0").mkdir()
    index = CheckpointIndex(str(tmp_path), settle_seconds=0, background=True)
    try:
        high_fds()
        if index.fileno() is None:
            pytest.skip("no inotify here")
        assert index.fileno() >= FD_SETSIZE
        index.scan(1)
        steps = index.indexer.steps
        (tmp_path / "rank_0" / "ckpt-1_100.pt").write_bytes(b"x" * 8)
        assert index.indexer.wait_steps(steps + 1, timeout=30)
        assert index.indexer._thread.is_alive()  # pylint: disable=protected-access
    finally:
        index.close()


def test_ready_says_which_descriptors_can_be_read_and_when_one_is_closed():
    read_a, write_a = os.pipe()
    read_b, write_b = os.pipe()
    try:
        assert _ready([read_a, read_b], 0) == set()
        os.write(write_b, b"x")
        assert _ready([read_a, read_b], 1.0) == {read_b}
        os.close(read_a)
        assert _ready([read_a, read_b], 0) is None
    finally:
        for fd in (write_a, read_b, write_b):
            os.close(fd)


def _until(condition, timeout=30.0):
    """Wait for the indexer thread to make ``condition()`` true (checked as its steps end)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the indexer thread did not get there"
        time.sleep(0.01)


@pytest.fixture(name="unfrozen")
def _unfrozen():
    yield
    gc.unfreeze()  # the rest of the suite's process must not stay frozen


@pytest.mark.parametrize("freeze", [True, False])
def test_a_save_round_absorbed_by_the_thread_leaves_the_collectors_passes(tmp_path, unfrozen, freeze):
    """With ``gc_freeze`` (the launcher's setting) the round's new records are frozen by the thread
    after its step: no later collection, in the event loop or a plan, traverses them."""
    (tmp_path / "rank_0").mkdir()
    index = CheckpointIndex(str(tmp_path), settle_seconds=0, background=True, gc_freeze=freeze)
    try:
        if index.fileno() is None:
            pytest.skip("no inotify here")
        index.scan(1)
        (tmp_path / "rank_0" / "ckpt-1_100.pt").write_bytes(b"x" * 8)
        entry = index._ranks[0]  # pylint: disable=protected-access
        _until(lambda: entry.result and not index._freeze_due)  # pylint: disable=protected-access
        [checkpoint] = entry.result
        assert all(o is not checkpoint for o in gc.get_objects()) is freeze
    finally:
        index.close()


@pytest.mark.parametrize("watch", [True, False])
@pytest.mark.parametrize("freeze", [True, False])
def test_what_the_first_plan_listed_leaves_the_collectors_passes_while_the_job_runs(tmp_path, unfrozen, freeze,
                                                                                    watch):
    """The plan before the first start lists the whole tree itself (49k files at 16,384 ranks). With
    ``gc_freeze`` the thread freezes those records once the job runs, as it does a round it absorbed:
    else the first full collection after it (0.3-0.7 s at that scale) fell in the plan before the
    first restart. With inotify and without (a shared file system: the thread only polls)."""
    for rank in range(3):
        (tmp_path / f"rank_{rank}").mkdir()
        (tmp_path / f"rank_{rank}" / "ckpt-1_100.pt").write_bytes(b"x" * 8)
    index = CheckpointIndex(str(tmp_path), settle_seconds=0, watch=watch, background=True, gc_freeze=freeze)
    try:
        result = index.scan(3)
        checkpoint = result.checkpoints[2][0]
        if freeze:
            _until(lambda: not index._freeze_due)  # pylint: disable=protected-access
        else:
            time.sleep(1.5)  # REFREEZE_QUIET and then some: nothing is frozen without gc_freeze
        assert all(o is not checkpoint for o in gc.get_objects()) is freeze
    finally:
        index.close()


def test_a_scan_that_found_nothing_new_schedules_no_freeze(tmp_path, unfrozen):
    (tmp_path / "rank_0").mkdir()
    index = CheckpointIndex(str(tmp_path), settle_seconds=0, background=True, gc_freeze=True)
    try:
        index.scan(1)
        steps = index.absorbed_steps
        index.scan(1)
        assert index.absorbed_steps == steps
    finally:
        index.close()
