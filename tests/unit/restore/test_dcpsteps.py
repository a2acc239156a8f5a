"""DCP step directories: completeness, the manifest, the shard-name fallback, malformed inputs."""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.restore.dcpsteps import (DCP_DIR, FROM_MANIFEST, FROM_SHARD_NAMES, MANIFEST, METADATA,
                                       newest_dcp_step)


def make_step(root, name, shards=(0, 1, 2, 3), metadata=True, manifest=None):
    """A DCP step directory ``root/dcp/name`` with empty shard files ``__<r>_0.distcp``."""
    path = root / DCP_DIR / name
    path.mkdir(parents=True)
    for rank in shards:
        (path / f"__{rank}_0.distcp").write_bytes(b"x")
    if metadata:
        (path / METADATA).write_bytes(b"pickled")
    if manifest is not None:
        (path / MANIFEST).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return str(path)


def manifest(world=4, step=20, epoch=None, layout=None, **extra):
    data = {"launcher_manifest": 1, "format": "dcp", "world_size": world, "epoch": epoch, "step": step}
    if layout is not None:
        data["layout"] = layout
    data.update(extra)
    return data


def test_no_dcp_directory_is_no_step_and_no_warning(tmp_path):
    assert newest_dcp_step(str(tmp_path)) == (None, ())
    assert newest_dcp_step(str(tmp_path / "missing")) == (None, ())


def test_manifest_gives_world_and_layout(tmp_path):
    path = make_step(tmp_path, "step-20", shards=(0,),
                     manifest=manifest(layout={"dp": 2, "tp": 2}))
    step, warnings = newest_dcp_step(str(tmp_path))
    assert warnings == ()
    assert (step.path, step.step, step.epoch, step.world_size) == (path, 20, None, 4)
    assert step.layout == (("dp", 2), ("tp", 2), ("pp", 1))
    assert step.known_from == FROM_MANIFEST


def test_without_manifest_the_shard_names_give_the_world(tmp_path):
    make_step(tmp_path, "step-3_7", shards=(0, 1, 2))
    step, warnings = newest_dcp_step(str(tmp_path))
    assert (step.epoch, step.step, step.world_size, step.known_from) == (3, 7, 3, FROM_SHARD_NAMES)
    assert warnings == ()


def test_newest_by_epoch_then_step_never_by_name_order(tmp_path):
    make_step(tmp_path, "step-1_90")
    make_step(tmp_path, "step-2_10")
    make_step(tmp_path, "step-1_100")
    assert newest_dcp_step(str(tmp_path))[0].key == (2, 10)


def test_unfinished_save_is_skipped_with_one_warning(tmp_path):
    make_step(tmp_path, "step-10")
    make_step(tmp_path, "step-20", metadata=False)
    step, warnings = newest_dcp_step(str(tmp_path))
    assert step.step == 10
    assert len(warnings) == 1 and "step-20" in warnings[0] and METADATA in warnings[0]


def test_only_unfinished_saves(tmp_path):
    make_step(tmp_path, "step-20", metadata=False)
    step, warnings = newest_dcp_step(str(tmp_path))
    assert step is None and len(warnings) == 1


def test_other_names_are_not_steps(tmp_path):
    make_step(tmp_path, "step-30.partial")  # a writer's scratch directory, even with a .metadata
    make_step(tmp_path, "step-010")
    (tmp_path / DCP_DIR / "step-40").write_text("a file, not a directory")
    assert newest_dcp_step(str(tmp_path)) == (None, ())


def test_no_shards_and_no_manifest_is_an_unknown_world(tmp_path):
    make_step(tmp_path, "step-5", shards=())
    step, _ = newest_dcp_step(str(tmp_path))
    assert step.world_size is None and step.known_from == ""


def test_unlistable_dcp_directory_warns(tmp_path):
    (tmp_path / DCP_DIR).write_text("not a directory")
    step, warnings = newest_dcp_step(str(tmp_path))
    assert step is None and len(warnings) == 1


MALFORMED = {
    "not json": "{",
    "not an object": "[1, 2]",
    "empty": "",
    "nested too deep": "[" * 100 + "]" * 100,
    "wrong version": manifest(launcher_manifest=2),
    "wrong format": manifest(format="mindspore"),
    "world zero": manifest(world=0),
    "world negative": manifest(world=-4),
    "world a string": manifest(world="4"),
    "world a bool": manifest(world=True),
    "world huge": manifest(world=10 ** 30),
    "world missing": {k: v for k, v in manifest().items() if k != "world_size"},
    "step disagrees": manifest(step=21),
    "epoch disagrees": manifest(epoch=1),
    "layout not an object": manifest(layout=[4, 1, 1]),
    "layout empty": manifest(layout={}),
    "layout unknown axis": manifest(layout={"dp": 2, "ep": 2}),
    "layout zero": manifest(layout={"dp": 0}),
    "layout product": manifest(layout={"dp": 3, "tp": 1}),
    "not utf-8": "\udcff",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_manifest_warns_once_and_falls_back_to_shard_names(tmp_path, name):
    content = MALFORMED[name]
    path = make_step(tmp_path, "step-20", shards=(0, 1))
    raw = content.encode("utf-8", "surrogateescape") if isinstance(content, str) else \
        json.dumps(content).encode()
    with open(os.path.join(path, MANIFEST), "wb") as out:
        out.write(raw)
    step, warnings = newest_dcp_step(str(tmp_path))
    assert len(warnings) == 1 and MANIFEST in warnings[0]
    assert (step.world_size, step.known_from) == (2, FROM_SHARD_NAMES)


def test_manifest_that_is_a_directory_or_fifo_does_not_hang(tmp_path):
    path = make_step(tmp_path, "step-20", shards=(0,))
    os.mkfifo(os.path.join(path, MANIFEST))
    step, warnings = newest_dcp_step(str(tmp_path))
    assert step.world_size == 1 and len(warnings) == 1


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_any_manifest_bytes_never_crash(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("m")
    path = make_step(root, "step-20", shards=(0, 1, 2))
    with open(os.path.join(path, MANIFEST), "wb") as out:
        out.write(data)
    step, warnings = newest_dcp_step(str(root))
    assert step.step == 20 and len(warnings) <= 1
    assert step.world_size == (4 if step.known_from == FROM_MANIFEST else 3)
