"""Checkpoint steps saved by ``torch.distributed.checkpoint`` (DCP): one global directory per step,
and the world size and layout each was written with.

Layout under the checkpoint directory::

    <checkpoint_dir>/dcp/step-<epoch>_<step>/     (or step-<step>)
        .metadata                  DCP's global metadata: the coordinator writes it to a temporary
                                   name and renames it after every rank's shards are written
        __<rank>_<n>.distcp        the shards (DCP FileSystemWriter's names)
        launcher-manifest.json     optional: {"launcher_manifest": 1, "format": "dcp",
                                   "world_size": 4, "epoch": 1, "step": 30,
                                   "layout": {"dp": 4, "tp": 1, "pp": 1}}

A step counts when ``.metadata`` exists: anything else is a save that did not finish (a crash
mid-save leaves shards without it). Its world size comes from the manifest; without one (or when it
is malformed: one warning) from the distinct ranks in the shard names, a lower bound when a rank had
nothing to write. The launcher never imports torch: DCP reshards on load, so the world size is only
reported, never needed to load.
"""

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Pattern, Tuple

from launcher.common.inputfiles import InputFileError, read_json

DCP_DIR = "dcp"
METADATA = ".metadata"
MANIFEST = "launcher-manifest.json"
MANIFEST_VERSION = 1
FORMAT_DCP = "dcp"
FROM_MANIFEST = "launcher manifest"
FROM_SHARD_NAMES = "DCP shard file names"
_LIMIT_MANIFEST = 64 * 1024
STEP_NAME = r"step-(?:(?P<epoch>0|[1-9]\d{0,17})_)?(?P<step>0|[1-9]\d{0,17})"
_STEP_DIR = re.compile(STEP_NAME)
_SHARD = re.compile(r"__(0|[1-9]\d{0,8})_\d+\.distcp")
LAYOUT_AXES = ("dp", "tp", "pp")


@dataclass(frozen=True)
class SavedStep:
    """One complete DCP step directory.

    Attributes:
        path: the step directory (what every rank passes to ``dcp.load``).
        epoch: from the directory name, when it has one.
        step: from the directory name.
        world_size: ranks that wrote it; None when neither source says.
        layout: ``(("dp", 4), ("tp", 1), ("pp", 1))`` from the manifest, or ``()``.
        known_from: where ``world_size`` came from (:data:`FROM_MANIFEST`, :data:`FROM_SHARD_NAMES`).
    """

    path: str
    epoch: Optional[int]
    step: int
    world_size: Optional[int]
    layout: Tuple[Tuple[str, int], ...] = ()
    known_from: str = ""

    @property
    def key(self) -> Tuple[int, int]:
        """Order of recency, as for per-rank checkpoints: ``(epoch, step)``, no epoch counting as 0."""
        return (self.epoch or 0, self.step)


def layout_text(layout: Tuple[Tuple[str, int], ...]) -> str:
    """``dp=4 tp=1 pp=1``; empty for no layout."""
    return " ".join(f"{axis}={size}" for axis, size in layout)


def newest_dcp_step(checkpoint_dir: str) -> Tuple[Optional[SavedStep], Tuple[str, ...]]:
    """The newest complete DCP step under ``checkpoint_dir/dcp/`` and warnings. Never raises.

    Only the newest complete step's directory is read beyond its listing entry; a missing ``dcp/``
    is normal (no DCP checkpoints) and warns nothing.
    """
    root = os.path.join(checkpoint_dir, DCP_DIR)
    candidates, listing = step_entries(root, _STEP_DIR, "DCP checkpoints", directories=True)
    warnings: List[str] = list(listing)
    unfinished = []
    for key, epoch, name in candidates:
        path = os.path.join(root, name)
        try:
            files = os.listdir(path)
        except OSError:
            continue  # removed meanwhile (rotation)
        if METADATA not in files:
            unfinished.append(name)
            continue
        return _saved_step(path, epoch, key[1], files, _unfinished(unfinished, warnings)), tuple(warnings)
    return None, tuple(_unfinished(unfinished, warnings))


def step_entries(root: str, pattern: Pattern[str], what: str, directories: bool) -> Tuple[
        List[Tuple[Tuple[int, int], Optional[int], str]], Tuple[str, ...]]:
    """``((epoch or 0, step), epoch, name)`` of the entries of ``root`` (directories or files) whose
    names fully match ``pattern`` (groups ``epoch``, ``step``), newest first; and a listing warning.
    A missing ``root`` has none and warns nothing."""
    try:
        with os.scandir(root) as entries:
            names = [e.name for e in entries if e.is_dir() == directories]
    except FileNotFoundError:
        return [], ()
    except OSError as exc:
        return [], (f"{what}: cannot list {root}: {exc.strerror or exc}",)
    found = []
    for match in filter(None, map(pattern.fullmatch, names)):
        epoch = int(match.group("epoch")) if match.group("epoch") is not None else None
        found.append(((epoch or 0, int(match.group("step"))), epoch, match.string))
    return sorted(found, reverse=True), ()


def _unfinished(names: List[str], warnings: List[str]) -> List[str]:
    """``warnings`` plus one line for the newer step directories without ``.metadata``."""
    if names:
        warnings.append(f"DCP checkpoints without {METADATA} (unfinished saves) ignored: "
                        + ", ".join(sorted(names)))
    return warnings


def _saved_step(path: str, epoch: Optional[int], step: int, files: List[str],
                warnings: List[str]) -> SavedStep:
    """The step with its world size: the manifest's, else the shard names'."""
    if MANIFEST in files:
        manifest_path = os.path.join(path, MANIFEST)
        try:
            world, layout = parse_manifest(read_json(manifest_path, "launcher manifest", _LIMIT_MANIFEST),
                                           epoch, step)
            return SavedStep(path, epoch, step, world, layout, FROM_MANIFEST)
        except InputFileError as exc:
            problem = str(exc)
        except ValueError as exc:
            problem = f"launcher manifest {manifest_path}: {exc}"
        except OSError as exc:
            problem = f"launcher manifest {manifest_path}: {exc.strerror or exc}"
        warnings.append(f"{problem}; ignored, the world size is taken from the shard file names")
    ranks = {int(m.group(1)) for m in map(_SHARD.fullmatch, files) if m}
    if not ranks:
        return SavedStep(path, epoch, step, None)
    return SavedStep(path, epoch, step, max(ranks) + 1, (), FROM_SHARD_NAMES)


def parse_manifest(data: Any, epoch: Optional[int], step: int,
                   fmt: str = FORMAT_DCP) -> Tuple[int, Tuple[Tuple[str, int], ...]]:
    """``(world_size, layout)`` of a manifest that must describe the step ``(epoch, step)`` in ``fmt``.

    Raises:
        ValueError: any field missing, of the wrong type, or disagreeing with the directory name
            or with the world size.
    """
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    problems = []
    if data.get("launcher_manifest") != MANIFEST_VERSION:
        problems.append(f"launcher_manifest is {data.get('launcher_manifest')!r}, not {MANIFEST_VERSION}")
    if data.get("format") != fmt:
        problems.append(f"format is {data.get('format')!r}, not {fmt!r}")
    world = data.get("world_size")
    if not _positive(world):
        problems.append(f"world_size {world!r} is not a positive integer")
    if data.get("step") != step or data.get("epoch") != epoch:
        problems.append(f"epoch/step {data.get('epoch')!r}/{data.get('step')!r} differ from the "
                        f"directory name's {epoch!r}/{step}")
    layout = _layout(data.get("layout"), world if _positive(world) else None, problems)
    if problems:
        raise ValueError("; ".join(problems))
    return world, layout


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31


def _layout(value: Any, world: Optional[int], problems: List[str]) -> Tuple[Tuple[str, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not value or set(value) - set(LAYOUT_AXES) or not all(
            _positive(v) for v in value.values()):
        problems.append(f"layout {value!r} is not an object of positive dp/tp/pp sizes")
        return ()
    sizes: Dict[str, int] = {axis: value.get(axis, 1) for axis in LAYOUT_AXES}
    if world is not None and sizes["dp"] * sizes["tp"] * sizes["pp"] != world:
        problems.append(f"layout {layout_text(tuple(sizes.items()))} does not multiply to world_size {world}")
    return tuple(sizes.items())
