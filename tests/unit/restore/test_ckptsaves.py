"""A save round the ranks reported, absorbed from inotify events without listing rank directories,
and the changes the reports cannot account for, which still have their directory listed."""

import hashlib
import os

import pytest

from launcher.restore import PlanInputs, compute_plan
from launcher.restore.checkpoints import scan_checkpoints
from launcher.restore.ckptnames import DIGEST_SUFFIX
from launcher.restore.ckptindex import CheckpointIndex
from tests.unit.restore.test_ckptindex import _listings  # noqa: F401  # pylint: disable=unused-import
from tests.unit.restore.test_ckptindex import _index_thread_only, _reported_tree, _saves

RANKS = 4


def _rsave(root, rank, name, size=8):
    """The example's save: a temporary file renamed into place, then its report."""
    path = os.path.join(root, f"rank_{rank}", name)
    with open(path + ".tmp", "wb") as fh:
        fh.write(b"y" * size)
    os.replace(path + ".tmp", path)
    _saves().report_saved(path)
    return path


def _rdelete(root, rank, name):
    path = os.path.join(root, f"rank_{rank}", name)
    _saves().withdraw(path)
    os.remove(path)


@pytest.fixture(name="index")
def _index(tmp_path):
    """An index of a reported tree on a local file system with inotify, after the first scan."""
    _index_thread_only()
    root = str(tmp_path)
    _reported_tree(root, RANKS)
    index = CheckpointIndex(root, settle_seconds=0)
    index.scan(RANKS)
    index.update()  # the first listing of .saves/ since its watch
    yield index
    index.close()


def _same_as_full_scan(index):
    assert index.scan(RANKS) == scan_checkpoints(index.root, RANKS, settle_seconds=0)


def test_a_reported_save_round_is_absorbed_without_listing_a_rank_directory(index, listings):
    listings.clear()
    for rank in range(RANKS):  # a new step, and the one before it rotated out (keep_checkpoint_max)
        _rsave(index.root, rank, "ckpt-1_200.pt")
        _rdelete(index.root, rank, "ckpt-1_100.pt")
    index.update()
    result = index.scan(RANKS)
    assert not listings
    assert [sorted(c.step for c in per_rank) for per_rank in result.checkpoints] == [[150, 200]] * RANKS
    _same_as_full_scan(index)


def test_a_file_written_after_its_report_has_its_directory_listed(index, listings):
    listings.clear()
    path = _rsave(index.root, 1, "ckpt-1_200.pt")
    with open(path, "ab") as fh:  # the rank broke the contract: the report's size is now wrong
        fh.write(b"more")
    _rsave(index.root, 2, "ckpt-1_200.pt")
    index.update()
    assert listings == [1]
    _same_as_full_scan(index)


@pytest.mark.parametrize("stray", ["ckpt-1_300.pt.tmp", "notes.txt", "ckpt-1_300.pt"])
def test_a_file_no_report_accounts_for_has_its_directory_listed(index, listings, stray):
    listings.clear()
    _rsave(index.root, 3, "ckpt-1_200.pt")
    with open(os.path.join(index.root, "rank_3", stray), "wb") as fh:  # left behind, never reported
        fh.write(b"z")
    index.update()
    assert listings == [3]
    _same_as_full_scan(index)


def test_a_subdirectory_made_in_a_rank_directory_has_it_listed(index, listings):
    listings.clear()
    os.mkdir(os.path.join(index.root, "rank_0", "ckpt-1_300.pt"))
    index.update()
    assert listings == [0]
    _same_as_full_scan(index)


def test_removing_a_file_the_listing_warned_about_has_the_directory_listed(index, listings):
    empty = os.path.join(index.root, "rank_2", "ckpt-1_300.pt")
    open(empty, "wb").close()  # pylint: disable=consider-using-with  # an empty file: the scan warns
    index.update()
    assert any("empty" in line for line in index.scan(RANKS).warnings)
    listings.clear()
    os.remove(empty)
    index.update()
    assert listings == [2]  # the warning goes with it, as in the full scan
    _same_as_full_scan(index)


def test_a_file_deleted_without_withdrawing_its_report_has_its_directory_listed(index, listings):
    listings.clear()
    os.remove(os.path.join(index.root, "rank_1", "ckpt-1_100.pt"))  # its report stays
    index.update()
    assert listings == [1]
    _same_as_full_scan(index)



def _atomic_write(path, data):
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def _plans_agree(index):
    # A replica group per rank: every rank's own file is picked and checked against its sidecar.
    inputs = PlanInputs(world_size=RANKS, dp=1, tp=RANKS, checkpoint_dir=index.root, settle_seconds=0)
    plan = compute_plan(inputs, index=index)
    assert plan == compute_plan(inputs)
    return plan


def test_a_save_with_its_digest_sidecar_first_needs_no_listing(index, listings):
    """The PyTorch example's save: the sidecar (temporary file, rename), the checkpoint (the same),
    then the report."""
    listings.clear()
    for rank in range(RANKS):
        path = os.path.join(index.root, f"rank_{rank}", "ckpt-1_200.pt")
        data = b"y" * 8
        _atomic_write(path + DIGEST_SUFFIX, f"{hashlib.sha256(data).hexdigest()}  ckpt-1_200.pt\n".encode())
        _atomic_write(path, data)
        _saves().report_saved(path)
    index.update()
    _same_as_full_scan(index)
    assert not listings
    assert _plans_agree(index).step == 200


def test_a_sidecar_beside_a_file_listed_without_one_has_the_directory_listed(index, listings):
    """The listing found no sidecar, so the planner would not check that file against one: a
    sidecar that appears later (here one that does not match) must be listed and then checked."""
    listings.clear()
    with open(os.path.join(index.root, "rank_2", "ckpt-1_150_breakpoint.pt" + DIGEST_SUFFIX), "w",
              encoding="ascii") as fh:
        fh.write(f"{'0' * 64}  ckpt-1_150_breakpoint.pt\n")
    index.update()
    assert listings == [2]
    _same_as_full_scan(index)
    assert any("digest" in warning for warning in _plans_agree(index).warnings)
