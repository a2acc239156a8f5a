"""What the DCP tests share about examples/pytorch/dcp_train.py: its log lines, and a step resharded
offline (a world of one, no launcher) to compare with what the resumed ranks loaded."""

import re
from pathlib import Path

#: Rank 0's per-step line and every rank's resume line of the example.
LOSS = re.compile(r"\[dcp_train rank 0/\d+\] step (\d+) loss ([0-9.]+)")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+) \(saved by (\d+) ranks\)")


def offline_state(step_dir: Path, out: Path) -> dict:
    """The whole state (``model``, ``optim``, ``step``) of a DCP step loaded without any process
    group: ``dcp_to_torch_save`` into ``out``, then ``torch.load``."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(step_dir), str(out))
    return torch.load(str(out), weights_only=False)


def check_loaded_equals_offline(loaded: Path, step_dir: Path, out: Path) -> None:
    """The full model state rank 0 dumped after its resume (``--dump-loaded``) equals the step
    resharded offline, tensor for tensor."""
    import torch

    state = torch.load(str(loaded), weights_only=False)
    reference = offline_state(step_dir, out)["model"]
    assert sorted(state) == sorted(reference)
    for key, tensor in reference.items():
        assert torch.equal(state[key], tensor), f"{key}: loaded from {step_dir} differs from its offline reshard"


def check_conversion(conversion, step_dir: Path, saved: int, world: int) -> None:
    """A plan's ``conversion`` (record or event) for ``step_dir``, written by ``saved`` ranks and
    resumed by ``world``: None at the same world, else DCP's reshard-on-load of that directory."""
    if saved == world:
        assert conversion is None, conversion
        return
    assert conversion is not None, f"no conversion planned for {saved} -> {world} ranks"
    assert (conversion["format"], conversion["source"], conversion["source_world_size"],
            conversion["target_world_size"], conversion["source_layout"]) == (
        "dcp", str(step_dir), saved, world, f"dp={saved} tp=1 pp=1"), conversion
