"""Damaging a stopped job's checkpoints between two launches (the chaos suite's damaged-checkpoint kinds)."""

import struct
import zipfile
from pathlib import Path
from typing import Dict, Optional, Tuple


def truncate(path: Path) -> Tuple[int, int]:
    """Cut ``path`` to half its size (a torn copy, a full disk). Returns (old size, new size)."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    return size, size // 2


def flip_bit_in_tensor_data(path: Path) -> Tuple[int, int]:
    """Flip the lowest bit of one float in the largest tensor of a torch zip checkpoint: the size,
    the zip structure and the pickle stay valid, so nothing short of a checksum notices.
    Returns (offset, size)."""
    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", fh.read(4))
        offset = info.header_offset + 30 + name_len + extra_len + 4 * (info.file_size // 8)
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x01]))
    return offset, path.stat().st_size


def planned_files(ckpt_dir: Path, world_size: int, dp: int) -> Tuple[str, Optional[int], Dict[int, str]]:
    """What the launcher's restore plan would pick now: (kind, step, {source rank: file})."""
    from launcher.restore import PlanInputs, compute_plan

    plan = compute_plan(PlanInputs(world_size=world_size, dp=dp, checkpoint_dir=str(ckpt_dir)))
    return plan.kind, plan.step, dict(plan.files)
