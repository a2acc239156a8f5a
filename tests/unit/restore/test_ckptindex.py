"""The checkpoint index: same result as the full scan, reading only what changed, settling for free."""

import os
import shutil
import tempfile
import threading
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.filewatch import IN_Q_OVERFLOW
from launcher.restore import PlanInputs, compute_plan
from launcher.restore import checkpoints, ckptindex, ckptreports, ckptwatch
from launcher.restore.checkpoints import scan_checkpoints
from launcher.restore.ckptnames import by_kind
from launcher.common.filewatch import shared_file_system
from launcher.restore.ckptindex import CheckpointIndex

NAMES = ["ckpt-1_100.pt", "ckpt-1_100_breakpoint.pt", "ckpt-2_50.pt", "a-1_100.ckpt", "x_1-1_100.ckpt",
         "weird.bin", "ckpt-1_100.pt.sha256", ".hidden", "m_train.ckpt", "ckpt-1_7.pt.tmp"]
WORLD = 3
_RANK = st.integers(0, WORLD)  # WORLD itself is a directory beyond the world size
OPS = st.one_of(
    st.tuples(st.just("write"), _RANK, st.sampled_from(NAMES), st.integers(0, 2)),
    st.tuples(st.just("rename"), _RANK, st.sampled_from(NAMES), st.integers(1, 2)),
    st.tuples(st.just("append"), _RANK, st.sampled_from(NAMES), st.just(1)),
    st.tuples(st.just("delete"), _RANK, st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("rmdir"), _RANK, st.just(""), st.just(0)),
    st.tuples(st.just("junk"), st.just(0), st.sampled_from(["notes.txt", "rank_01"]), st.just(0)),
    st.tuples(st.sampled_from(["update", "poll", "scan"]), st.just(0), st.just(""), st.just(0)),
)


def _apply(root, index, op):
    kind, rank, name, size = op
    rank_dir = os.path.join(root, f"rank_{rank}")
    path = os.path.join(rank_dir, name)
    if kind in ("write", "rename"):
        os.makedirs(rank_dir, exist_ok=True)
        with open(path + ".tmp" if kind == "rename" else path, "wb") as fh:
            fh.write(b"x" * size)
        if kind == "rename":
            os.replace(path + ".tmp", path)
    elif kind == "append" and os.path.isfile(path):
        with open(path, "ab") as fh:  # in place: the directory's mtime does not change
            fh.write(b"y")
    elif kind == "delete" and os.path.isfile(path):
        os.remove(path)
    elif kind == "rmdir":
        shutil.rmtree(rank_dir, ignore_errors=True)
    elif kind == "junk":
        os.makedirs(os.path.join(root, name), exist_ok=True)
    elif kind == "update":
        index.update()
    elif kind == "poll":
        index.poll()
    elif kind == "scan":
        index.scan(WORLD)


def _replay(watch, ops, apply, background=False):
    """Apply ``ops`` to a fresh tree under an index; the index's scan, per-kind dicts and plan must
    equal the full scan's."""
    with tempfile.TemporaryDirectory() as root:
        index = CheckpointIndex(root, settle_seconds=0, watch=watch, background=background)
        try:
            assert index.scan(WORLD) == scan_checkpoints(root, WORLD, settle_seconds=0)
            for op in ops:
                apply(root, index, op)
            result = index.scan(WORLD)
            assert result == scan_checkpoints(root, WORLD, settle_seconds=0)
            per_rank = [by_kind(items) for items in result.checkpoints]
            assert result.kinds == (tuple(p[0] for p in per_rank), tuple(p[1] for p in per_rank))
            assert result.keys == tuple(tuple(sorted(set().union(*kind), reverse=True)) for kind in result.kinds)
            inputs = PlanInputs(world_size=WORLD, dp=WORLD, checkpoint_dir=root, settle_seconds=0)
            assert compute_plan(inputs, index=index) == compute_plan(inputs)  # the planner uses the kinds
            assert index.scan(WORLD - 1) == scan_checkpoints(root, WORLD - 1, settle_seconds=0)
        finally:
            index.close()


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "mtimes"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, max_size=25))
def test_index_equals_full_scan_after_any_file_events(watch, ops):
    _replay(watch, ops, _apply)


def _tree(root, ranks=4):
    for rank in range(ranks):
        os.makedirs(os.path.join(root, f"rank_{rank}"))
        for name in ("ckpt-1_100.pt", "ckpt-1_150_breakpoint.pt"):
            with open(os.path.join(root, f"rank_{rank}", name), "wb") as fh:
                fh.write(b"x" * 8)


def _age(root):
    """Move every directory's mtime an hour back: older than the racy window."""
    for path in [root] + [os.path.join(root, name) for name in os.listdir(root)]:
        os.utime(path, (os.path.getmtime(path) - 3600,) * 2)


@pytest.fixture(name="listings")
def _listings(monkeypatch):
    """The rank directories the index lists, in order."""
    seen = []
    real = ckptindex.scan_rank

    def counting(rank, *args):
        seen.append(rank)
        return real(rank, *args)

    monkeypatch.setattr(ckptindex, "scan_rank", counting)
    return seen


def test_mtimes_relist_only_changed_directories(tmp_path, listings):
    root = str(tmp_path)
    _tree(root)
    _age(root)
    index = CheckpointIndex(root, settle_seconds=0, watch=False)
    index.scan(4)
    assert listings == [0, 1, 2, 3]
    listings.clear()
    index.scan(4)
    assert not listings
    (tmp_path / "rank_2" / "ckpt-1_200.pt").write_bytes(b"y")  # another node's save: only an mtime shows it
    result = index.scan(4)
    assert listings == [2]
    assert result == scan_checkpoints(root, 4, settle_seconds=0)


@pytest.fixture(name="watched")
def _watched(tmp_path):
    """``make(ranks, settle_seconds=0)``: a tree of ``ranks`` in tmp_path and its inotify index."""
    made = []

    def make(ranks, settle_seconds=0):
        _tree(str(tmp_path), ranks)
        made.append(CheckpointIndex(str(tmp_path), settle_seconds=settle_seconds))
        if made[-1].fileno() is None:
            pytest.skip("no inotify here")
        return made[-1]

    yield make
    for index in made:
        index.close()


def test_inotify_lists_changed_directories_before_the_scan(tmp_path, listings, watched):
    root = str(tmp_path)
    index = watched(4)
    index.scan(4)
    listings.clear()
    (tmp_path / "rank_1" / "ckpt-1_200.pt").write_bytes(b"y")
    index.update()  # what the event loop's timer does after the events
    assert listings == [1]
    listings.clear()
    assert index.scan(4) == scan_checkpoints(root, 4, settle_seconds=0)
    assert not listings


def _no_sleep(seconds):
    raise AssertionError(f"slept {seconds} s")


def test_files_reported_complete_cost_no_settle_sleep(tmp_path, monkeypatch, watched):
    root = str(tmp_path)
    index = watched(2, settle_seconds=30)
    slept = []
    monkeypatch.setattr(checkpoints.time, "sleep", slept.append)
    first = index.scan(2)
    assert slept == [30]  # once: the files written before the index watched them
    assert first == scan_checkpoints(root, 2, settle_seconds=0)
    monkeypatch.setattr(checkpoints.time, "sleep", _no_sleep)
    (tmp_path / "rank_1" / "ckpt-1_200.pt").write_bytes(b"w" * 8)  # closed after writing: reported
    assert index.scan(2) == scan_checkpoints(root, 2, settle_seconds=0)


def test_unreported_new_files_are_settled_once(tmp_path, monkeypatch):
    root = str(tmp_path)
    _tree(root, 2)
    index = CheckpointIndex(root, settle_seconds=30, watch=False)
    slept = []
    monkeypatch.setattr(checkpoints.time, "sleep", slept.append)
    index.scan(2)
    index.scan(2)
    assert slept == [30]


def test_event_queue_overflow_relists_everything(listings, watched):
    index = watched(3)
    index.scan(3)
    listings.clear()
    index._event(-1, IN_Q_OVERFLOW, "")  # pylint: disable=protected-access
    index.scan(3)
    assert listings == [0, 1, 2]


def test_missing_root_then_created(tmp_path):
    root = str(tmp_path / "ckpt")
    index = CheckpointIndex(root, settle_seconds=0)
    assert index.scan(2) == scan_checkpoints(root, 2, settle_seconds=0)
    _tree(root, 2)
    assert index.scan(2) == scan_checkpoints(root, 2, settle_seconds=0)


def test_plan_from_the_index_equals_the_full_scan_plan(tmp_path, listings):
    root = str(tmp_path)
    _tree(root, 8)
    inputs = PlanInputs(world_size=8, dp=2, tp=2, pp=2, extra_fault_ranks=(3,), checkpoint_dir=root,
                        settle_seconds=0)
    index = CheckpointIndex(root, settle_seconds=0)
    assert compute_plan(inputs, index=index) == compute_plan(inputs)
    assert listings  # the plan came from the index
    index.close()


def test_a_file_still_being_written_is_looked_at_again(tmp_path, monkeypatch):
    root = str(tmp_path)
    _tree(root, 1)
    index = CheckpointIndex(root, settle_seconds=30, watch=False)
    growing = tmp_path / "rank_0" / "ckpt-1_100.pt"

    def grow(_seconds):
        with open(growing, "ab") as fh:  # the writer is still at it during the settle interval
            fh.write(b"more")

    monkeypatch.setattr(checkpoints.time, "sleep", grow)
    assert [c.step for c in index.scan(1).checkpoints[0]] == [150]
    monkeypatch.setattr(checkpoints.time, "sleep", lambda _seconds: None)  # the writer finished
    assert sorted(c.step for c in index.scan(1).checkpoints[0]) == [100, 150]


# -- rank-reported saves ------------------------------------------------------------------------
REPORTER = 1  # this rank reports its saves; the others do not (mixed, as in a job mid-migration)
_OTHER = st.sampled_from([0, 2, 3])
REPORTED_OPS = st.one_of(
    st.tuples(st.sampled_from(["write", "rename", "append", "delete"]), _OTHER, st.sampled_from(NAMES),
              st.integers(0, 2)),
    st.tuples(st.sampled_from(["rsave", "rdelete"]), st.just(REPORTER), st.sampled_from(NAMES[:5]),
              st.integers(0, 3)),
    # Not reports, or reports the name alone cannot settle: the index must list the rank instead.
    # (A report of a file that does not exist breaks the contract: the index trusts reports.)
    st.tuples(st.just("rjunk"), st.just(REPORTER), st.sampled_from(["notes.txt", "1.8.weird.bin", "1.x.a-1_1.ckpt",
                                                                    "1.0.ckpt-3_1.pt"]),
              st.just(0)),
    st.tuples(st.just("rmsaves"), st.just(0), st.just(""), st.just(0)),
    st.tuples(st.sampled_from(["update", "poll", "scan"]), st.just(0), st.just(""), st.just(0)),
)


def _saves():
    import sys  # pylint: disable=import-outside-toplevel

    from launcher.supervision.debugging import HOOKS_DIR  # pylint: disable=import-outside-toplevel

    if HOOKS_DIR not in sys.path:
        sys.path.append(HOOKS_DIR)
    import launcher_saves  # pylint: disable=import-outside-toplevel,import-error

    return launcher_saves


def _apply_reported(root, index, op):
    kind, rank, name, size = op
    path = os.path.join(root, f"rank_{rank}", name)
    if kind == "rsave":  # the example's save: temporary file, rename, report
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            _saves().withdraw(path)
        with open(path + ".tmp", "wb") as fh:
            fh.write(b"x" * size)
        os.replace(path + ".tmp", path)
        _saves().report_saved(path)
    elif kind == "rdelete" and os.path.isfile(path):
        _saves().withdraw(path)
        os.remove(path)
    elif kind == "rjunk":  # a stray file, or a report whose file the rank never wrote (as reported)
        os.makedirs(os.path.join(root, ".saves"), exist_ok=True)
        with open(os.path.join(root, ".saves", name), "wb"):
            pass
    elif kind == "rmsaves":  # the reports directory removed with the files it reports (a cleared job)
        for rank_dir in os.listdir(root):
            if rank_dir.startswith("rank_") and os.path.exists(os.path.join(root, ".saves")):
                shutil.rmtree(os.path.join(root, rank_dir))
        shutil.rmtree(os.path.join(root, ".saves"), ignore_errors=True)
    else:
        _apply(root, index, op)


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "mtimes"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(REPORTED_OPS, max_size=25))
def test_index_with_reported_saves_equals_full_scan(watch, ops):
    _replay(watch, ops, _apply_reported)


def test_reported_saves_need_no_directory_stat_listing_or_sleep(tmp_path, listings, monkeypatch):
    root = str(tmp_path)
    _tree(root)
    for rank in range(4):
        for name in ("ckpt-1_100.pt", "ckpt-1_150_breakpoint.pt"):
            _saves().report_saved(os.path.join(root, f"rank_{rank}", name))
    _age(root)
    index = CheckpointIndex(root, watch=False)  # as on a shared file system: no inotify
    monkeypatch.setattr(checkpoints.time, "sleep", _no_sleep)
    index.scan(4)
    listings.clear()
    stats = []
    real_stamp = ckptindex.dir_stamp
    monkeypatch.setattr(ckptindex, "dir_stamp", lambda path: stats.append(path) or real_stamp(path))
    new = tmp_path / "rank_2" / "ckpt-1_200.pt"
    new.write_bytes(b"y" * 8)
    _saves().report_saved(str(new))
    result = index.scan(4)
    assert not listings and stats == [root]  # the root's stamp; the reports directory is read apart
    assert sorted(c.step for c in result.checkpoints[2]) == [100, 150, 200]
    assert result == scan_checkpoints(root, 4, settle_seconds=0)


def test_a_rank_directory_recreated_after_its_watch_was_lost_is_listed_again(tmp_path):
    root = str(tmp_path)
    index = CheckpointIndex(root, settle_seconds=0)
    try:
        if index.fileno() is None:
            pytest.skip("no inotify here")
        rank_dir = tmp_path / "rank_0"
        rank_dir.mkdir()
        (rank_dir / "ckpt-1_100.pt").write_bytes(b"")
        index.scan(3)
        shutil.rmtree(rank_dir)
        index.update()  # the event loop sees the deletion; the watch is gone
        rank_dir.mkdir()
        (rank_dir / "ckpt-1_100.pt").write_bytes(b"")  # before the next watch: no event
        assert index.scan(3) == scan_checkpoints(root, 3, settle_seconds=0)
    finally:
        index.close()


def _reported_tree(root, ranks=4):
    """``_tree`` with every file reported by its rank, every directory an hour old."""
    _tree(root, ranks)
    for rank in range(ranks):
        for name in ("ckpt-1_100.pt", "ckpt-1_150_breakpoint.pt"):
            _saves().report_saved(os.path.join(root, f"rank_{rank}", name))
    _age(root)


def _report_save(tmp_path, rank, name):
    path = tmp_path / f"rank_{rank}" / name
    path.write_bytes(b"y" * 8)
    _saves().report_saved(str(path))


@pytest.fixture(name="report_reads")
def _report_reads(monkeypatch):
    """What the index reads of the reports: listings of ``.saves/``, ranks whose reports it applies."""
    seen = {"listings": 0, "applied": []}
    real_apply = CheckpointIndex._apply_reports  # pylint: disable=protected-access

    def counted(real):
        def listing(path):
            seen["listings"] += os.path.basename(path) == ".saves"
            return real(path)
        return listing

    def apply(self, rank):
        seen["applied"].append(rank)
        real_apply(self, rank)

    monkeypatch.setattr(ckptreports.os, "listdir", counted(os.listdir))  # the os module's: any caller's
    monkeypatch.setattr(ckptreports.os, "scandir", counted(os.scandir))
    monkeypatch.setattr(CheckpointIndex, "_apply_reports", apply)
    return seen


def test_the_event_loop_poll_leaves_the_plan_nothing_to_read(tmp_path, report_reads, listings):
    root = str(tmp_path)
    _reported_tree(root)
    index = CheckpointIndex(root, settle_seconds=0, watch=False)
    assert index.polls()  # the indexer thread polls from the start, as on a shared file system
    index.scan(4)
    report_reads.update(listings=0, applied=[])
    _report_save(tmp_path, 2, "ckpt-1_200.pt")  # another node's save: no inotify event
    _age(root)  # the poll comes after the racy window
    os.utime(tmp_path / ".saves", (os.path.getmtime(root),) * 2)
    index.poll()
    assert report_reads == {"listings": 1, "applied": [2]}
    listings.clear()
    result = index.scan(4)
    assert report_reads == {"listings": 1, "applied": [2]} and not listings  # the plan read nothing new
    assert sorted(c.step for c in result.checkpoints[2]) == [100, 150, 200]
    assert result == scan_checkpoints(root, 4, settle_seconds=0)
    index.close()


def test_inotify_follows_the_reports_directory_instead_of_listing_it(tmp_path, report_reads, listings):
    root = str(tmp_path)
    index = CheckpointIndex(root, settle_seconds=0)
    try:
        if index.fileno() is None or shared_file_system(root):
            pytest.skip("no inotify, or a shared file system, here")
        index.scan(4)  # an empty checkpoint directory: the job's first start
        _reported_tree(root)  # the first save round creates .saves/: the root's event says so
        index.update()
        assert index.scan(4) == scan_checkpoints(root, 4, settle_seconds=0)
        before = report_reads["listings"]
        for step in (200, 300):
            _report_save(tmp_path, 1, f"ckpt-1_{step}.pt")
            index.update()
        listings.clear()
        assert index.scan(4) == scan_checkpoints(root, 4, settle_seconds=0)
        assert report_reads["listings"] == before and not listings  # events only; the update did the rest
        index._event(-1, IN_Q_OVERFLOW, "")  # pylint: disable=protected-access
        index.scan(4)
        assert report_reads["listings"] == before + 1  # events lost: listed once again
    finally:
        index.close()


def _index_thread_only():
    """Skip unless inotify works here on a local file system (the indexer's update lists nothing
    elsewhere)."""
    probe = tempfile.mkdtemp()
    try:
        index = CheckpointIndex(probe)
        if index.fileno() is None or shared_file_system(probe):
            pytest.skip("no inotify, or a shared file system, here")
        index.close()
    finally:
        shutil.rmtree(probe)


def test_the_indexer_thread_absorbs_a_save_round_without_the_event_loop(tmp_path, listings):
    _index_thread_only()
    root = str(tmp_path)
    _reported_tree(root)
    index = CheckpointIndex(root, settle_seconds=0, background=True)
    try:
        index.scan(4)
        steps = index.indexer.steps
        listings.clear()
        (tmp_path / "rank_1" / "ckpt-1_200.pt").write_bytes(b"y" * 8)  # not reported: only a listing finds it
        _report_save(tmp_path, 2, "ckpt-1_200.pt")
        while 1 not in listings:  # the thread's update lists rank_1 (or a poll comes first: wait on)
            assert index.indexer.wait_steps(steps + 1, timeout=30)
            steps += 1
        listings.clear()
        result = index.scan(4)
        assert not listings  # the plan found the round absorbed
        assert sorted(c.step for c in result.checkpoints[1]) == sorted(c.step for c in result.checkpoints[2])
        assert result == scan_checkpoints(root, 4, settle_seconds=0)
    finally:
        index.close()
    assert not index.indexer._thread.is_alive()  # pylint: disable=protected-access


class _Arrival:
    """The index's lock, noting when the thread named ``plan`` asks for it."""

    def __init__(self, lock, arrived):
        self.lock, self.arrived = lock, arrived

    def __enter__(self):
        if threading.current_thread().name == "plan":
            self.arrived.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_a_plan_while_the_indexer_is_mid_round_equals_the_full_scan(tmp_path, monkeypatch):
    """The indexer took the round's events and stopped in the middle of listing the directories:
    the plan's scan must wait for it (or do the rest), not miss the files not yet listed."""
    _index_thread_only()
    root = str(tmp_path)
    _tree(root)
    _age(root)
    paused, plan_arrived = threading.Event(), threading.Event()
    real = ckptindex.scan_rank

    def pausing(rank, *args):
        if threading.current_thread().name == "ckpt-index" and not paused.is_set():
            paused.set()
            assert plan_arrived.wait(60)
        return real(rank, *args)

    index = CheckpointIndex(root, settle_seconds=0, background=True)
    index._lock = _Arrival(index._lock, plan_arrived)  # pylint: disable=protected-access
    try:
        index.scan(4)
        monkeypatch.setattr(ckptindex, "scan_rank", pausing)
        for rank in (1, 2, 3):  # not reported: only the listings find them
            (tmp_path / f"rank_{rank}" / "ckpt-1_200.pt").write_bytes(b"y" * 8)
        assert paused.wait(60)  # the indexer is inside its update, the events drained
        results = []
        plan = threading.Thread(target=lambda: results.append(index.scan(4)), name="plan")
        plan.start()
        plan.join(60)
        assert results == [scan_checkpoints(root, 4, settle_seconds=0)]
    finally:
        plan_arrived.set()
        index.close()


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "mtimes"])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(REPORTED_OPS, max_size=25))
def test_index_with_a_live_indexer_thread_equals_full_scan(watch, ops):
    """The same cross-check with the indexer thread updating and polling as fast as it can,
    concurrently with the writes and the scans."""
    with mock.patch.object(ckptwatch, "UPDATE_DELAY", 0.0), mock.patch.object(ckptwatch, "POLL_SECONDS", 0.002):
        _replay(watch, ops, _apply_reported, background=True)


def test_the_indexer_thread_with_nothing_to_watch_or_poll_waits_for_its_stop(tmp_path, monkeypatch):
    """No inotify and no reports (a completion marker): the thread has no timer and no descriptor,
    and must still wait (not die) until it is stopped."""
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    patterns = checkpoints.compile_patterns(None, marker="{name}.done")
    index = CheckpointIndex(str(tmp_path), patterns, watch=False, background=True)
    assert not index.polls() and index.fileno() is None
    index.close()
    assert not index.indexer._thread.is_alive() and not died  # pylint: disable=protected-access


def test_a_local_file_system_is_listed_in_one_thread_even_when_the_probe_looks_slow(tmp_path, monkeypatch):
    """On a local file system threads only contend for the GIL; a CPU-starved probe (a loaded
    machine, the indexer thread beside the event loop) must not send the listings to the pool."""
    root = str(tmp_path)
    if shared_file_system(root):
        pytest.skip("a shared file system here")
    _tree(root, ranks=checkpoints.PROBE_RANKS + 8)
    expected = scan_checkpoints(root, checkpoints.PROBE_RANKS + 8, settle_seconds=0)
    index = CheckpointIndex(root, settle_seconds=0)
    monkeypatch.setattr(checkpoints, "SLOW_RANK_SECONDS", 0.0)  # every probe looks slow
    monkeypatch.setattr(checkpoints, "ThreadPoolExecutor", None)  # the pool is not to be used
    try:
        assert index.scan(checkpoints.PROBE_RANKS + 8) == expected
    finally:
        index.close()


def test_polls_wait_for_a_recent_reports_directory_to_age_the_plan_does_not(tmp_path, report_reads):
    """After a round the reports directory's mtime is too recent to prove the next change: the
    plan lists it again, but the thread's polls (every 0.25 s) need not list 49k names each time."""
    root = str(tmp_path)
    _reported_tree(root)
    index = CheckpointIndex(root, settle_seconds=0, watch=False)
    index.scan(4)
    _report_save(tmp_path, 2, "ckpt-1_200.pt")  # the directory's mtime is now
    index.poll()
    listed = report_reads["listings"]
    index.poll()
    index.poll()
    assert report_reads["listings"] == listed  # unchanged and still recent: not listed again
    assert index.scan(4) == scan_checkpoints(root, 4, settle_seconds=0)
    assert report_reads["listings"] == listed + 1  # the plan lists it (a report of the same clock tick)
    index.close()
