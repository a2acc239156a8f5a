"""Checkpoint scanning: names, completeness rules, ordering by (epoch, step), bad directories."""

import os
import threading

import pytest

from launcher.common.errors import UsageError
from launcher.restore import checkpoints
from launcher.restore.checkpoints import (KIND_BREAKPOINT, KIND_PERIODIC, compile_patterns,
                                          scan_checkpoints)


def put(root, rank, name, size=10):
    directory = root / f"rank_{rank}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"x" * size)
    return str(directory / name)


def scan(root, world=2, pattern=None, marker=None, settle=0.0):
    return scan_checkpoints(str(root), world, compile_patterns(pattern, marker), settle)


def summary(result):
    return [[(os.path.basename(c.path), c.kind, c.epoch, c.step) for c in per_rank]
            for per_rank in result.checkpoints]


def test_default_names(tmp_path):
    put(tmp_path, 0, "pangu0-1_20.ckpt")
    put(tmp_path, 0, "pangu0-1_25_breakpoint.ckpt")
    put(tmp_path, 1, "ckpt-2_30.pt")
    put(tmp_path, 1, "ckpt-2_31_breakpoint.pt")
    result = scan(tmp_path)
    assert summary(result) == [
        [("pangu0-1_25_breakpoint.ckpt", KIND_BREAKPOINT, 1, 25),
         ("pangu0-1_20.ckpt", KIND_PERIODIC, 1, 20)],
        [("ckpt-2_31_breakpoint.pt", KIND_BREAKPOINT, 2, 31),
         ("ckpt-2_30.pt", KIND_PERIODIC, 2, 30)],
    ]
    assert result.warnings == ()


def test_epoch_orders_before_step(tmp_path):
    # MindSpore's step is the step within the epoch: resnet-2_10 is newer than resnet-1_100.
    put(tmp_path, 0, "resnet-1_100.ckpt")
    put(tmp_path, 0, "resnet-2_10.ckpt")
    keys = [c.key for c in scan(tmp_path, world=1).checkpoints[0]]
    assert keys == [(1, 100), (2, 10)]
    assert max(keys) == (2, 10)


def test_in_progress_and_side_files(tmp_path):
    put(tmp_path, 0, "ckpt-1_40.pt.tmp")
    put(tmp_path, 0, ".ckpt-1_41.pt")
    put(tmp_path, 0, "ckpt-1_42.pt.part")
    put(tmp_path, 0, "ckpt-1_43.pt", size=0)
    put(tmp_path, 0, "resnet-graph.meta")
    put(tmp_path, 0, "net_train.mindir")
    put(tmp_path, 0, "ckpt-1_10.pt")
    result = scan(tmp_path, world=1)
    assert summary(result) == [[("ckpt-1_10.pt", KIND_PERIODIC, 1, 10)]]
    text = "\n".join(result.warnings)
    assert "3 temporary files" in text and "1 empty files ignored: rank_0/ckpt-1_43.pt" in text
    assert "meta" not in text and "mindir" not in text


def test_graceful_exit_checkpoints_are_recognised_not_chosen(tmp_path):
    put(tmp_path, 0, "net_train.ckpt")
    result = scan(tmp_path, world=1)
    assert result.checkpoints == ((),)
    assert "graceful-exit checkpoints not used" in result.warnings[0]


def test_unexpected_names(tmp_path):
    put(tmp_path, 0, "notes.txt")
    put(tmp_path, 5, "ckpt-1_1.pt")
    (tmp_path / "rank_x").mkdir()
    (tmp_path / "rank_01").mkdir()
    (tmp_path / "README").write_text("hi")
    (tmp_path / "rank_0" / "subdir").mkdir()
    result = scan(tmp_path)
    text = "\n".join(result.warnings)
    assert ("5 unexpected names ignored: README, rank_0/notes.txt, rank_0/subdir, rank_01, rank_x"
            in text)
    assert "rank directories beyond world size 2 ignored: rank_5" in text


def test_missing_directory_means_no_checkpoints(tmp_path):
    result = scan(tmp_path / "absent")
    assert result.checkpoints == ((), ())
    # a job's first start: the reason there is nothing, not a warning
    assert result.warnings == ()
    assert result.absent == f"{tmp_path / 'absent'} does not exist yet"


def test_checkpoint_dir_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    result = scan(tmp_path / "f")
    assert result.checkpoints == ((), ()) and "unreadable" in result.warnings[0]


def test_same_step_twice_is_ambiguous(tmp_path):
    # MindSpore names a rerun's files prefix_1-...: two states claim epoch 1 step 20.
    put(tmp_path, 0, "net-1_20.ckpt")
    put(tmp_path, 0, "net_1-1_20.ckpt")
    put(tmp_path, 0, "net-1_10.ckpt")
    result = scan(tmp_path, world=1)
    assert [c.step for c in result.checkpoints[0]] == [10]
    assert "same step as another file" in result.warnings[0]


def test_completion_marker(tmp_path):
    put(tmp_path, 0, "ckpt-1_10.pt")
    put(tmp_path, 0, "ckpt-1_10.pt.done", size=0)
    put(tmp_path, 0, "ckpt-1_20.pt")
    result = scan(tmp_path, world=1, marker="{name}.done")
    assert [c.step for c in result.checkpoints[0]] == [10]
    text = "\n".join(result.warnings)
    assert "without their completion marker ignored: rank_0/ckpt-1_20.pt" in text
    assert "unexpected" not in text


def test_custom_pattern_and_marker_fields(tmp_path):
    put(tmp_path, 0, "iter_0000100.bin")
    put(tmp_path, 0, "iter_0000100.ok")
    put(tmp_path, 0, "iter_0000200.bin")
    result = scan(tmp_path, world=1, pattern=r"iter_(?P<step>\d+)\.bin", marker="iter_{step}.ok")
    assert [(c.epoch, c.step, c.kind) for c in result.checkpoints[0]] == [(None, 100, KIND_PERIODIC)]


@pytest.mark.parametrize("pattern,marker,error", [
    ("ckpt-(", None, "not a valid regex"),
    (r"ckpt-(?P<epoch>\d+)\.pt", None, "no named group"),
    (r"ckpt-(?P<step>\d+)\.pt", "{epoch}.done", "does not define"),
    (None, "../x", "plain name"),
    (None, "{step:08d}.ok", "no format spec"),
    (None, "{name!r}.ok", "no format spec"),
    (None, "{0}.ok", "does not define"),
    (None, "{}.ok", "does not define"),
])
def test_bad_pattern_options(pattern, marker, error):
    with pytest.raises(UsageError, match=error):
        compile_patterns(pattern, marker)


def test_file_still_growing_is_not_chosen(tmp_path, monkeypatch):
    growing = put(tmp_path, 0, "ckpt-1_20.pt")
    put(tmp_path, 0, "ckpt-1_10.pt")
    slept = []

    def write_more(seconds):
        slept.append(seconds)
        with open(growing, "ab") as fh:
            fh.write(b"more")

    monkeypatch.setattr(checkpoints.time, "sleep", write_more)
    result = scan(tmp_path, world=1, settle=0.5)
    assert slept == [0.5]  # one sleep for the whole scan, not one per file
    assert [c.step for c in result.checkpoints[0]] == [10]
    assert "still being written ignored: rank_0/ckpt-1_20.pt" in result.warnings[0]


def test_listing_order_does_not_matter(tmp_path, monkeypatch):
    for rank in range(3):
        for step in (1, 2, 3):
            put(tmp_path, rank, f"ckpt-0_{step}.pt")
    expected = scan(tmp_path, world=3)
    real_scandir = os.scandir

    class Reversed:
        def __init__(self, path):
            self.entries = list(reversed(list(real_scandir(path))))

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(checkpoints.os, "scandir", Reversed)
    assert scan(tmp_path, world=3) == expected


def _mixed_tree(root, world):
    """Every kind of entry the scan sorts: checkpoints, temp, empty, side, unexpected, ambiguous, markers."""
    for rank in range(world):
        put(root, rank, f"ckpt-1_{10 + rank % 3}.pt")
        put(root, rank, f"ckpt-1_{20 + rank % 5}_breakpoint.pt")
        if rank % 4 == 0:
            put(root, rank, "ckpt-1_30.pt.tmp")
        if rank % 5 == 1:
            put(root, rank, "ckpt-1_31.pt", size=0)
        if rank % 6 == 2:
            put(root, rank, "notes.txt")
        if rank % 7 == 3:
            put(root, rank, "a-1_10.ckpt")
            put(root, rank, "b-1_10.ckpt")  # the same step twice: ambiguous
    (root / "rank_x").mkdir()
    (root / f"rank_{world + 1}").mkdir()


@pytest.mark.parametrize("settle", [0.0, 0.01])
def test_a_slow_file_system_is_scanned_in_parallel_with_the_same_result(tmp_path, monkeypatch, settle):
    """The probe decides; forced both ways, the answer (checkpoints, order, warnings) is identical."""
    world = checkpoints.PROBE_RANKS * 3 + 5
    _mixed_tree(tmp_path, world)
    threads = set()
    real_stamp = checkpoints._stamp

    def stamp(path):
        threads.add(threading.current_thread().name.split("_")[0])
        return real_stamp(path)

    monkeypatch.setattr(checkpoints, "_stamp", stamp)
    monkeypatch.setattr(checkpoints, "SLOW_RANK_SECONDS", 3600.0)  # a fast disk: one thread
    serial = scan(tmp_path, world=world, settle=settle)
    assert threads == {"MainThread"}
    threads.clear()
    monkeypatch.setattr(checkpoints, "SLOW_RANK_SECONDS", 0.0)  # a slow one: the pool after the probe
    parallel = scan(tmp_path, world=world, settle=settle)
    assert threads == {"MainThread", "ckpt-scan"}
    assert parallel == serial
    assert len(serial.warnings) >= 5 and all(len(per_rank) >= 1 for per_rank in serial.checkpoints)


def test_a_scan_smaller_than_the_probe_never_starts_a_pool(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "SLOW_RANK_SECONDS", 0.0)
    monkeypatch.setattr(checkpoints, "ThreadPoolExecutor", None)  # would fail if used
    put(tmp_path, 0, "ckpt-1_10.pt")
    assert summary(scan(tmp_path, world=1, settle=0.01)) == [[("ckpt-1_10.pt", KIND_PERIODIC, 1, 10)]]
