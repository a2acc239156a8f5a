"""Benchmark 7, scale: the checkpoint scan, the index and the restore plan on a simulated shared file
system (see :mod:`bench.scale`'s docstring; split out of it for size)."""

import os
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List

from bench.common import median, progress
from bench.scale import SLOW_FS_LATENCY, SLOW_FS_RANKS, WORLD, _save_round


@contextmanager
def _slow_fs() -> Iterator[None]:
    """A simulated shared file system: ``os.scandir``, ``os.stat``, ``os.listdir`` (of ``.saves/``)
    and ``os.open`` (digest sidecars, checkpoints) sleep ``SLOW_FS_LATENCY`` first, process-wide."""
    real = (os.scandir, os.stat, os.listdir, os.open)

    def slow(call):
        def wrapped(*args, **kwargs):
            time.sleep(SLOW_FS_LATENCY)
            return call(*args, **kwargs)
        return wrapped

    os.scandir, os.stat, os.listdir, os.open = (slow(call) for call in real)
    try:
        yield
    finally:
        os.scandir, os.stat, os.listdir, os.open = real


def slow_fs_scan(root: str, inputs) -> Dict[str, List[float]]:
    """The checkpoint scan of ``SLOW_FS_RANKS`` rank directories on a simulated shared file system
    (:func:`_slow_fs`), once as the launcher does it (threads after the probe) and once forced into
    one thread. One run each: the serial one takes seconds, and sleeps are not noisy."""
    from launcher.restore import CheckpointIndex, checkpoints

    threshold_before = checkpoints.SLOW_RANK_SECONDS
    out = {}
    # As on NFS: no events from the other nodes' writes; the poll's timer is driven by hand.
    index = CheckpointIndex(root, watch=False)
    index.scan(WORLD)
    try:
        with _slow_fs():
            out.update(_slow_fs_measured(root, inputs, index, threshold_before))
        out.update(_slow_fs_sidecars(root, inputs, index))
    finally:
        checkpoints.SLOW_RANK_SECONDS = threshold_before
        index.close()
    progress(f"scale: slow file system scan: {out['slow_fs_scan'][0]:.2f} s, one thread "
             f"{out['slow_fs_scan_one_thread'][0]:.2f} s, index of {WORLD} ranks {out['slow_fs_index'][0]:.2f} s, "
             f"plan after a reported save round {median(out['slow_fs_plan_saved']):.2f} s, "
             f"after the poll {median(out['slow_fs_plan_polled']):.2f} s, with sidecars "
             f"{median(out['slow_fs_plan_sidecars']):.2f} s")
    return out


def _slow_fs_measured(root: str, inputs, index, threshold_before: float) -> Dict[str, List[float]]:
    """The full scans, the index's check and the save rounds, on the simulated file system."""
    from launcher.restore import checkpoints

    out = {}
    for key, threshold in (("slow_fs_scan", threshold_before), ("slow_fs_scan_one_thread", float("inf"))):
        checkpoints.SLOW_RANK_SECONDS = threshold
        start = time.perf_counter()
        checkpoints.scan_checkpoints(root, SLOW_FS_RANKS)
        out[key] = [time.perf_counter() - start]
    checkpoints.SLOW_RANK_SECONDS = threshold_before
    start = time.perf_counter()
    index.scan(WORLD)
    out["slow_fs_index"] = [time.perf_counter() - start]
    out.update(_slow_fs_rounds(root, inputs, index))
    return out


def _slow_fs_sidecars(root: str, inputs, index) -> Dict[str, List[float]]:
    """A ``.sha256`` sidecar beside each file the plan picks (as the PyTorch example writes them),
    written on the real file system; a new index lists them (the sidecar is written before its file,
    so the listing that found the file found it) and the files are verified once (the index's worker,
    the first plan); then the plan on the simulated file system (3 runs): a ``stat`` of each picked
    file and its sidecar, no hash."""
    import hashlib

    from launcher.restore import CheckpointIndex, compute_plan
    from launcher.restore.ckptnames import DIGEST_SUFFIX

    old = time.time() - 3600
    for _, path in compute_plan(inputs, index=index).files:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
        with open(path + DIGEST_SUFFIX, "w", encoding="utf-8") as fh:
            fh.write(f"{digest}  {os.path.basename(path)}\n")
        for touched in (path + DIGEST_SUFFIX, os.path.dirname(path)):
            os.utime(touched, (old, old))  # saved long before the failure, as the tree
    index = CheckpointIndex(root, watch=False)
    try:
        compute_plan(inputs, index=index)  # the full listing; the picked files hashed
        index.digests.join()
        out: Dict[str, List[float]] = {"slow_fs_plan_sidecars": [], "slow_fs_plan_sidecars_cpu": []}
        with _slow_fs():
            for _ in range(3):
                start, cpu = time.perf_counter(), time.thread_time()
                plan = compute_plan(inputs, index=index)
                out["slow_fs_plan_sidecars_cpu"].append(time.thread_time() - cpu)
                out["slow_fs_plan_sidecars"].append(time.perf_counter() - start)
    finally:
        index.close()
    assert not [w for w in plan.warnings if DIGEST_SUFFIX in w], plan.warnings
    return out


def _slow_fs_rounds(root: str, inputs, index) -> Dict[str, List[float]]:
    """Save rounds of another node's ranks (no inotify event, only their reports): the plan right
    after one, and the plan after the event loop's poll absorbed another (3 runs each)."""
    from launcher.restore import compute_plan
    from launcher.restore.ckptindex import RACY_SECONDS

    out: Dict[str, List[float]] = {"slow_fs_plan_saved": [], "slow_fs_poll": [], "slow_fs_plan_polled": [],
                                   "slow_fs_scan_polled": [], "slow_fs_plan_polled_cpu": []}
    for run in range(3):
        _save_round(root, 300 + 2 * run)
        start = time.perf_counter()
        compute_plan(inputs, index=index)
        out["slow_fs_plan_saved"].append(time.perf_counter() - start)
        _save_round(root, 301 + 2 * run)
        time.sleep(RACY_SECONDS)  # the polls before this one listed .saves/ while its mtime was too recent
        start = time.perf_counter()
        index.poll()
        out["slow_fs_poll"].append(time.perf_counter() - start)
        start = time.perf_counter()
        index.scan(WORLD)  # the index's share of the plan below (which finds the same: nothing new)
        out["slow_fs_scan_polled"].append(time.perf_counter() - start)
        start, cpu = time.perf_counter(), time.thread_time()
        compute_plan(inputs, index=index)
        out["slow_fs_plan_polled_cpu"].append(time.thread_time() - cpu)
        out["slow_fs_plan_polled"].append(time.perf_counter() - start)
    return out
