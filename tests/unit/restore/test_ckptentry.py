"""The checkpoint index's records: what a save round leaves behind for the garbage collector."""

import gc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.restore.checkpoints import Candidate, scan_checkpoints
from launcher.restore.ckptentry import NO_KINDS, View, kept, same_kinds
from launcher.restore.ckptindex import CheckpointIndex
from launcher.restore.ckptnames import Checkpoint

RANKS = 64


def _candidate(name, size=8, mtime=1):
    return Candidate(Checkpoint(0, f"/c/rank_0/{name}", "periodic", 1, int(name.split("_")[1][:-3]), size),
                     (size, mtime), False)


def test_kept_reuses_equal_candidates_only():
    old = [_candidate("ckpt-1_100.pt"), _candidate("ckpt-1_200.pt")]
    new = [_candidate("ckpt-1_100.pt"), _candidate("ckpt-1_200.pt", mtime=2), _candidate("ckpt-1_300.pt")]
    out = kept(old, new)
    assert out == new
    assert out[0] is old[0]  # same file, same stamp
    assert out[1] is new[1]  # rewritten in place: the new stamp counts
    assert out[2] is new[2]
    assert kept([], new) is new


def test_same_kinds_reuses_equal_dicts():
    a, b = _candidate("ckpt-1_100.pt").checkpoint, _candidate("ckpt-1_200.pt").checkpoint
    old = ({}, {a.key: a})
    assert same_kinds(old, ({}, {a.key: a})) is old
    grown = same_kinds(old, ({}, {a.key: a, b.key: b}))
    assert grown[0] is old[0] and grown[1] == {a.key: a, b.key: b}
    assert same_kinds(NO_KINDS, ({}, {}))[0] is NO_KINDS[0]


def _tree(root):
    for rank in range(RANKS):
        os.makedirs(os.path.join(root, f"rank_{rank}"))
        for name in ("ckpt-1_100.pt", "ckpt-1_150_breakpoint.pt"):
            with open(os.path.join(root, f"rank_{rank}", name), "wb") as fh:
                fh.write(b"x" * 8)


def _round(root, step):
    for rank in range(RANKS):
        with open(os.path.join(root, f"rank_{rank}", f"ckpt-1_{step}.pt"), "wb") as fh:
            fh.write(b"y" * 8)


@pytest.fixture(name="index")
def _index(tmp_path):
    _tree(str(tmp_path))
    index = CheckpointIndex(str(tmp_path), settle_seconds=0)
    if index.fileno() is None:
        index.close()
        pytest.skip("no inotify here")
    yield index
    index.close()


def test_a_save_round_keeps_what_did_not_change(tmp_path, index):
    before = index.scan(RANKS)
    (tmp_path / "rank_3" / "ckpt-1_200.pt").write_bytes(b"y" * 8)
    index.update()
    after = index.scan(RANKS)
    assert after == scan_checkpoints(str(tmp_path), RANKS, settle_seconds=0)
    breakpoints, periodics = 0, 1  # ScanResult.kinds: per kind, per rank
    assert after.kinds[breakpoints][3] is before.kinds[breakpoints][3]  # only a periodic was added
    assert after.kinds[periodics][3] is not before.kinds[periodics][3]
    assert all(after.kinds[kind][r] is before.kinds[kind][r] for kind in (0, 1) for r in range(RANKS) if r != 3)
    assert after.keys == (((1, 150),), ((1, 200), (1, 100)))
    unchanged = [c for c in after.checkpoints[3] if c.step != 200]
    assert all(any(c is old for old in before.checkpoints[3]) for c in unchanged)


def test_a_save_round_leaves_few_objects_for_the_collector(tmp_path, index):
    """Every object a round leaves alive is one more for each later collection to traverse, in
    whichever thread allocates next (the plan before a restart included). Here 14 per saved rank
    before the index kept what did not change (a new candidate, checkpoint and instance dict for each
    of the rank's files, new per-kind dicts, new notes; 38 in ``bench scale``'s tree), 4 after."""
    index.scan(RANKS)
    for step in (200, 201):  # the first round after the first scan also settles one-time state
        gc.collect()
        gc.disable()  # as the index's steps and the plan run: what they leave waits for the next collection
        try:
            tracked = len(gc.get_objects())
            _round(str(tmp_path), step)
            index.update()
            index.scan(RANKS)
            left = len(gc.get_objects()) - tracked
        finally:
            gc.enable()
    assert left <= 8 * RANKS, f"{left / RANKS:.1f} tracked objects left per saved rank"


def test_the_scan_lists_follow_a_changed_world_size(tmp_path, index):
    """The scan's per-rank lists are kept between scans and updated for changed ranks only; a scan
    for another world size (an elastic regroup) rebuilds them."""
    root = str(tmp_path)
    for world in (RANKS, 2, RANKS + 3, RANKS):
        (tmp_path / "rank_1" / f"ckpt-1_{300 + world}.pt").write_bytes(b"z" * 8)
        index.update()
        assert index.scan(world) == scan_checkpoints(root, world, settle_seconds=0)


_STEPS = st.frozensets(st.tuples(st.integers(1, 2), st.integers(0, 5)), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), _STEPS, _STEPS, st.booleans()), max_size=30))
def test_the_view_counts_every_step_some_rank_holds(changes):
    """``View.keys`` is the union of every rank's steps, newest first, after any sequence of changes,
    including dicts the index kept unchanged (the same object handed again)."""
    view = View(6)
    model = [(set(), set()) for _ in range(6)]  # what each rank holds, kept apart from the view
    for rank, breakpoints, periodics, keep_breakpoints in changes:
        old = (view.by_kind[0][rank], view.by_kind[1][rank])
        new_breakpoints = old[0] if keep_breakpoints else dict.fromkeys(breakpoints)
        view.set_kinds(rank, same_kinds(old, (new_breakpoints, dict.fromkeys(periodics))))
        model[rank] = (set(new_breakpoints), set(periodics))
        for kind in (0, 1):
            union = set().union(*(held[kind] for held in model))
            assert view.keys()[kind] == tuple(sorted(union, reverse=True))
            assert [set(steps) for steps in view.by_kind[kind]] == [held[kind] for held in model]
