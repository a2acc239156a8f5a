"""Digest checks remembered between restarts: the cached plan equals the uncached one, corrupted and
rewritten files are still caught, the event loop only queues work."""

import hashlib
import os
import tempfile
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.restore import PlanInputs, compute_plan
from launcher.restore import digests
from launcher.restore.ckptindex import CheckpointIndex
from launcher.restore.ckptnames import DIGEST_SUFFIX, verify_digest
from launcher.restore.digests import DigestCache, DigestWorker

WORLD = 4
OLD = time.time() - 3600  # files older than the racy window, as checkpoints are when a rank fails
# Per file: sidecar matching, sidecar of other bytes, no sidecar.
SIDECAR = st.sampled_from(["good", "bad", "none"])
TREE = st.dictionaries(st.tuples(st.integers(0, WORLD - 1), st.sampled_from(
    ["ckpt-1_10.pt", "ckpt-1_20.pt", "ckpt-1_20_breakpoint.pt", "ckpt-1_30_breakpoint.pt"])), SIDECAR, max_size=16)


def _write(path, data, sidecar, when=OLD):
    with open(path, "wb") as fh:
        fh.write(data)
    if sidecar != "none":
        digest = hashlib.sha256(data if sidecar == "good" else data + b"!").hexdigest()
        with open(path + DIGEST_SUFFIX, "w", encoding="utf-8") as fh:
            fh.write(f"{digest}  {os.path.basename(path)}\n")
        os.utime(path + DIGEST_SUFFIX, (when, when))
    os.utime(path, (when, when))


def _tree(root, files):
    for (rank, name), sidecar in sorted(files.items()):
        os.makedirs(os.path.join(root, f"rank_{rank}"), exist_ok=True)
        _write(os.path.join(root, f"rank_{rank}", name), b"state %d" % rank, sidecar)


@settings(max_examples=40, deadline=None)
@given(TREE, st.lists(st.tuples(st.integers(0, WORLD - 1), st.sampled_from(["same", "resize"])), max_size=6),
       st.booleans())
def test_cached_plan_equals_uncached_plan_and_catches_rewrites(files, rewrites, watch):
    """Plans from the index (digests cached, the worker's results used) equal the full scan's
    (every picked file hashed), before and after picked files are rewritten in place once verified."""
    with tempfile.TemporaryDirectory() as root:
        _tree(root, files)
        inputs = PlanInputs(world_size=WORLD, dp=2, tp=2, checkpoint_dir=root, settle_seconds=0)
        index = CheckpointIndex(root, settle_seconds=0, watch=watch)
        try:
            assert compute_plan(inputs, index=index) == compute_plan(inputs)
            index.digests.join()  # everything verified and cached now
            assert compute_plan(inputs, index=index) == compute_plan(inputs)
            picked = sorted({path for _, path in compute_plan(inputs, index=index).files})
            for number, (which, how) in enumerate(rewrites if picked else []):
                # Corrupt a verified file in place: same size (or not), a later write time.
                path = picked[which % len(picked)]
                size = os.path.getsize(path)
                with open(path, "r+b") as fh:
                    fh.write(b"X" * (size + (how == "resize")))
                os.utime(path, (OLD + 10 + number, OLD + 10 + number))
                os.utime(os.path.dirname(path))  # without inotify the index relists on the directory's mtime
                assert compute_plan(inputs, index=index) == compute_plan(inputs)
        finally:
            index.close()


def test_a_rewritten_file_is_hashed_again(tmp_path):
    path = str(tmp_path / "ckpt-1_10.pt")
    _write(path, b"state", "good")
    cache = DigestCache()
    assert cache.check(path) is True
    with open(path, "r+b") as fh:
        fh.write(b"STATE")  # same size, same inode
    os.utime(path, (OLD + 1, OLD + 1))
    assert cache.check(path) is False
    assert verify_digest(path) is False


def test_a_verified_file_is_not_read_again(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt-1_10.pt")
    _write(path, b"state", "good")
    cache = DigestCache()
    assert cache.check(path) is True
    monkeypatch.setattr(digests, "verify_digest", lambda _path: None)  # a hash now would return None
    assert cache.check(path) is True


def test_a_fresh_file_is_not_cached(tmp_path, monkeypatch):
    """Written within the racy window: a same-size rewrite in the same clock tick would keep its key."""
    path = str(tmp_path / "ckpt-1_10.pt")
    _write(path, b"state", "good", when=time.time())
    cache = DigestCache()
    assert cache.check(path) is True
    monkeypatch.setattr(digests, "verify_digest", lambda _path: None)
    assert cache.check(path) is None


def test_no_sidecar_opens_nothing(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt-1_10.pt")
    _write(path, b"state", "none")
    monkeypatch.setattr(digests, "verify_digest", lambda _path: 1 / 0)
    assert DigestCache().check(path) is None


def test_the_index_knows_which_sidecars_are_absent(tmp_path, monkeypatch):
    """A file listed without its sidecar is not even stat-ed for one before a restart."""
    _tree(str(tmp_path), {(0, "ckpt-1_10.pt"): "none", (1, "ckpt-1_10.pt"): "good"})
    index = CheckpointIndex(str(tmp_path), settle_seconds=0, watch=False)
    try:
        index.scan(2)
        index.digests.join()
        looked = []
        monkeypatch.setattr(digests, "_stat_key", lambda path: looked.append(path))
        assert index.verify_digest(0, str(tmp_path / "rank_0" / "ckpt-1_10.pt")) is None
        assert looked == []
    finally:
        index.close()


def test_submit_never_blocks_and_the_worker_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "QUEUE_SIZE", 1)
    path = str(tmp_path / "ckpt-1_10.pt")
    _write(path, b"state", "good")
    worker = DigestWorker(DigestCache())
    for _ in range(100):
        worker.submit([path])  # a full queue drops the batch
    worker.join()
    assert worker.cache.check(path) is True
    worker.stop()
    worker.join(timeout=10)
    assert not worker._thread.is_alive()  # pylint: disable=protected-access


def _save_step_20(root, index, rank_1_sidecar="good"):
    """Ranks 0 and 1 save step 20 and the index scans: their directories touched, as a new file
    does, within the racy window, so they are listed again."""
    _tree(root, {(0, "ckpt-1_20.pt"): "good", (1, "ckpt-1_20.pt"): rank_1_sidecar})
    os.utime(os.path.join(root, "rank_0"))
    os.utime(os.path.join(root, "rank_1"))
    index.scan(2)


def test_the_worker_hashes_files_saved_after_the_first_listing(tmp_path, monkeypatch):
    """Not the tree found at start (the plan checks what it picks), but each file saved since: by the
    time of the plan it is verified, and the planner reads nothing."""
    root = str(tmp_path)
    _tree(root, {(0, "ckpt-1_10.pt"): "good", (1, "ckpt-1_10.pt"): "good"})
    index = CheckpointIndex(root, settle_seconds=0, watch=False)
    try:
        index.scan(2)
        index.digests.join()
        assert index.digests._thread is None  # pylint: disable=protected-access  # the first tree: nothing queued
        _save_step_20(root, index, "bad")
        index.digests.join()
        monkeypatch.setattr(digests, "verify_digest", lambda _path: 1 / 0)  # the planner must not hash
        assert index.verify_digest(0, os.path.join(root, "rank_0", "ckpt-1_20.pt")) is True
        assert index.verify_digest(1, os.path.join(root, "rank_1", "ckpt-1_20.pt")) is False
    finally:
        index.close()


def test_only_this_nodes_ranks_are_hashed_ahead(tmp_path, monkeypatch):
    """On a job of many nodes every launcher indexes the whole tree: reading every rank's save ahead
    would read each save round once per node. Other nodes' files are left to the plan's own check."""
    root = str(tmp_path)
    _tree(root, {(0, "ckpt-1_10.pt"): "good", (1, "ckpt-1_10.pt"): "good"})
    index = CheckpointIndex(root, settle_seconds=0, watch=False, hash_ranks=frozenset({0}))
    hashed = []
    real = digests.verify_digest
    monkeypatch.setattr(digests, "verify_digest", lambda path: hashed.append(path) or real(path))
    try:
        index.scan(2)
        _save_step_20(root, index)
        index.digests.join()
        assert hashed and all(os.sep + "rank_0" + os.sep in path for path in hashed), hashed
        assert index.verify_digest(1, os.path.join(root, "rank_1", "ckpt-1_20.pt")) is True  # checked when asked
    finally:
        index.close()


def test_only_the_new_files_of_a_save_round_are_queued_once(tmp_path, monkeypatch):
    """A rank's files verified before are not queued again when its directory is listed for a new
    save, and a round is one batch (one queue operation, not one per file)."""
    root = str(tmp_path)
    _tree(root, {(0, "ckpt-1_10.pt"): "good", (1, "ckpt-1_10.pt"): "good"})
    index = CheckpointIndex(root, settle_seconds=0, watch=False)
    batches = []
    monkeypatch.setattr(index.digests, "submit", lambda paths: batches.append(list(paths)) if paths else None)
    try:
        index.scan(2)
        _save_step_20(root, index)
        assert batches == [[os.path.join(root, f"rank_{rank}", "ckpt-1_20.pt") for rank in (0, 1)]]
    finally:
        index.close()
