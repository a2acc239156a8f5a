"""MindSpore steps saved per rank under a sharding strategy: the launcher manifest that says which world
wrote a step, with which strategy file, in which files.

The manifest is written (by rank 0, after every rank's save of the step) to
``<checkpoint dir>/manifests/step-<epoch>_<step>.json``::

    {"launcher_manifest": 1, "format": "mindspore", "world_size": 2, "epoch": 1, "step": 10,
     "strategy_file": "strategy/src.ckpt",
     "files": {"0": "rank_0/ms-1_10.ckpt", "1": "rank_1/ms-1_10.ckpt"}}

Relative paths are relative to the checkpoint directory. A step counts only when the manifest is
valid, names a file for every rank ``0..world_size-1``, and every file and the strategy file exist
and are not empty; otherwise it is skipped with one warning and an older one is tried. MindSpore's
strategy file itself is not parsed (its device matrix gives one pipeline stage's size, not the
world's): it is only handed to the conversion (``mstransform.py``).
"""

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from launcher.common.inputfiles import InputFileError, read_json
from launcher.restore.dcpsteps import STEP_NAME, parse_manifest, step_entries

MANIFESTS_DIR = "manifests"
FORMAT_MINDSPORE = "mindspore"
_LIMIT = 16 * 1024 * 1024  # a file per rank: ~60 bytes each, 16,384 ranks fit in 1 MiB
_NAME = re.compile(STEP_NAME + r"\.json")


@dataclass(frozen=True)
class StrategyStep:
    """One complete per-rank MindSpore step and what wrote it.

    Attributes:
        manifest: the manifest file.
        epoch: the step's epoch, when it has one.
        step: the step.
        world_size: ranks that wrote it.
        strategy_file: the strategy file it was written with (absolute).
        files: ``(rank, absolute path)`` for ranks ``0..world_size-1``.
        layout: ``(("dp", 2), ...)`` when the manifest gives one.
    """

    manifest: str
    epoch: Optional[int]
    step: int
    world_size: int
    strategy_file: str
    files: Tuple[Tuple[int, str], ...]
    layout: Tuple[Tuple[str, int], ...] = ()

    @property
    def key(self) -> Tuple[int, int]:
        """``(epoch, step)``, no epoch counting as 0."""
        return (self.epoch or 0, self.step)


def newest_ms_step(checkpoint_dir: str) -> Tuple[Optional[StrategyStep], Tuple[str, ...]]:
    """The newest complete step with a manifest, and warnings for newer ones skipped. Never raises."""
    found, listing = step_entries(os.path.join(checkpoint_dir, MANIFESTS_DIR), _NAME, "step manifests",
                                  directories=False)
    warnings: List[str] = list(listing)
    for key, epoch, name in found:
        path = os.path.join(checkpoint_dir, MANIFESTS_DIR, name)
        try:
            return _read(checkpoint_dir, path, epoch, key[1]), tuple(warnings)
        except InputFileError as exc:
            warnings.append(f"{exc}; step skipped")
        except (ValueError, OSError) as exc:
            warnings.append(f"step manifest {path}: {exc}; step skipped")
    return None, tuple(warnings)


def _read(checkpoint_dir: str, path: str, epoch: Optional[int], step: int) -> StrategyStep:
    data = read_json(path, "step manifest", _LIMIT)
    world, layout = parse_manifest(data, epoch, step, FORMAT_MINDSPORE)
    strategy = data.get("strategy_file")
    if not isinstance(strategy, str) or not strategy:
        raise ValueError(f"strategy_file {strategy!r} is not a path")
    files = _files(data.get("files"), world)
    strategy = _existing(checkpoint_dir, strategy)
    return StrategyStep(path, epoch, step, world, strategy,
                        tuple((rank, _existing(checkpoint_dir, files[rank])) for rank in range(world)), layout)


def _files(value: Any, world: int) -> Dict[int, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
        raise ValueError("files is not an object of rank -> path")
    ranks = {k: v for k, v in value.items() if isinstance(k, str) and k.isdigit() and str(int(k)) == k}
    missing = [r for r in range(world) if str(r) not in ranks]
    if missing or len(value) != world:
        raise ValueError(f"files must name one file for each rank 0..{world - 1}")
    return {int(k): v for k, v in ranks.items()}


def _existing(checkpoint_dir: str, path: str) -> str:
    """``path`` made absolute; it must be a non-empty regular file (a save or a copy not finished)."""
    full = os.path.normpath(os.path.join(checkpoint_dir, path))
    try:
        size = os.stat(full).st_size
    except OSError as exc:
        raise ValueError(f"{full}: {exc.strerror or exc}") from exc
    if not os.path.isfile(full) or size == 0:
        raise ValueError(f"{full} is empty or not a regular file")
    return full
