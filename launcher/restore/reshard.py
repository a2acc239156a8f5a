"""Resuming with a different world: what the chosen step was written with, and the conversion the
plan makes when that differs from the current world.

* DCP (``torch.distributed.checkpoint``) steps are one global directory that DCP reshards on load:
  the conversion is "every rank loads the directory"; nothing runs before the ranks.
* MindSpore per-rank steps with a launcher manifest (:mod:`launcher.restore.mssteps`) written by
  another world are converted once, before the ranks start, from the manifest's strategy file to
  the current world's (``--strategy-file``) by :mod:`launcher.restore.mstransform`; each rank gets its
  converted file.

:func:`with_dcp` turns a per-rank plan into a DCP plan when the newest complete DCP step is at least
as new as the per-rank choice (pure: the caller read the step with
:func:`launcher.restore.dcpsteps.newest_dcp_step`).
"""

from dataclasses import replace
from typing import Optional, Tuple

from launcher.common.inputfiles import LIMIT_BINARY, InputFileError, read_bytes
from launcher.restore.dcpsteps import FORMAT_DCP, FROM_MANIFEST, SavedStep, layout_text
from launcher.restore.mssteps import FORMAT_MINDSPORE, StrategyStep
from launcher.restore.mstransform import plan_job
from launcher.restore.plan import KIND_NONE, KIND_PERIODIC, Conversion, RestorePlan

DCP_METHOD = "torch.distributed.checkpoint reshards on load; every rank loads the one global checkpoint"
MS_METHOD = ("mindspore.transform_checkpoint_by_rank in the job's interpreter before the ranks start; "
             "every rank loads its converted file")


def target_layout(world_size: int, dp: Optional[int], tp: Optional[int], pp: Optional[int]) -> str:
    """The current layout as ``dp=.. tp=.. pp=..`` when the user gave one (``--dp/--tp/--pp``), else ``""``."""
    if dp is None and tp is None and pp is None:
        return ""
    tp, pp = tp or 1, pp or 1
    return layout_text((("dp", dp or max(world_size // (tp * pp), 1)), ("tp", tp), ("pp", pp)))


def dcp_conversion(step: SavedStep, world_size: int, layout: str) -> Optional[Conversion]:
    """The conversion resuming ``step`` on ``world_size`` ranks of ``layout`` needs; None when the
    world and layout it was written with are the current ones (or unknown)."""
    saved_layout = layout_text(step.layout)
    if step.world_size is None:
        return None
    if step.world_size == world_size and not (saved_layout and layout and saved_layout != layout):
        return None
    return Conversion(format=FORMAT_DCP, source=step.path, source_world_size=step.world_size,
                      target_world_size=world_size, source_layout=saved_layout, target_layout=layout,
                      known_from=step.known_from, method=DCP_METHOD)


def with_dcp(plan: RestorePlan, step: Optional[SavedStep], warnings: Tuple[str, ...],
             layout: str = "") -> RestorePlan:
    """``plan``, or a DCP plan when ``step`` is at least as new as the per-rank choice.

    Args:
        plan: the per-rank plan.
        step: the newest complete DCP step, or None.
        warnings: the DCP scan's warnings (added to whichever plan is returned).
        layout: the current layout (:func:`target_layout`).
    """
    plan = replace(plan, warnings=plan.warnings + warnings) if warnings else plan
    if step is None:
        return plan
    per_rank_key = (plan.epoch or 0, plan.step) if plan.kind != KIND_NONE else None
    if per_rank_key is not None and per_rank_key > step.key:
        return replace(plan, warnings=plan.warnings + (
            f"DCP checkpoint {step.path} is older than the per-rank checkpoints chosen; not used",))
    if step.world_size is None:
        saved = "written by an unknown number of ranks (no manifest, no shard files)"
    else:
        saved = f"written by {step.world_size} rank{'s' if step.world_size > 1 else ''} ({step.known_from})"
    reason = f"DCP checkpoint at {_at(step)} {saved}"
    if per_rank_key is not None:
        reason += f"; at least as new as the per-rank {plan.kind} checkpoints"
    return replace(plan, kind=KIND_PERIODIC, reason=reason, epoch=step.epoch, step=step.step,
                   sources=(), files=(), dcp_dir=step.path, saved_world_size=step.world_size,
                   conversion=dcp_conversion(step, plan.world_size, layout))


def unconvertible(step: Optional[StrategyStep], world_size: int, strategy_file: Optional[str]) -> bool:
    """Whether ``step`` was written by another world and cannot be converted (no strategy file)."""
    return step is not None and step.world_size != world_size and strategy_file is None


def with_ms(plan: RestorePlan, step: Optional[StrategyStep], warnings: Tuple[str, ...], checkpoint_dir: str,
            strategy_file: Optional[str], layout: str = "") -> RestorePlan:
    """``plan``, or a conversion plan when ``step`` (a MindSpore manifest step) was written by another
    world and is at least as new as the per-rank choice.

    Without ``strategy_file`` such a step cannot be converted: the planner left its files out
    (:func:`unconvertible`), and the plan says why.
    """
    plan = replace(plan, warnings=plan.warnings + warnings) if warnings else plan
    per_rank_key = (plan.epoch or 0, plan.step) if plan.kind != KIND_NONE else None
    if step is None or (per_rank_key is not None and per_rank_key > step.key):
        return plan
    if step.world_size == plan.world_size and (strategy_file is None
                                               or _same_bytes(strategy_file, step.strategy_file)):
        return replace(plan, saved_world_size=step.world_size) if per_rank_key == step.key else plan
    written = f"step {step.step} was written by {step.world_size} ranks ({step.manifest})"
    if strategy_file is None:
        return replace(plan, warnings=plan.warnings + (
            f"{written}; without --strategy-file (this world's sharding strategy) it cannot be "
            f"converted for {plan.world_size} ranks, and its files are not loaded",))
    try:
        job = plan_job(checkpoint_dir, step.files, step.strategy_file, strategy_file, plan.world_size)
    except (OSError, InputFileError) as exc:
        return replace(plan, warnings=plan.warnings + (f"{written}; cannot plan its conversion: {exc}",))
    conversion = Conversion(format=FORMAT_MINDSPORE, source=step.manifest, source_world_size=step.world_size,
                            target_world_size=plan.world_size, source_layout=layout_text(step.layout),
                            target_layout=layout, known_from=FROM_MANIFEST, method=MS_METHOD, output=job.output)
    return replace(plan, kind=KIND_PERIODIC, reason=f"{written}; converted with {strategy_file}",
                   epoch=step.epoch, step=step.step, sources=(), files=(), saved_world_size=step.world_size,
                   conversion=conversion, transform=job)


def _same_bytes(path: str, other: str) -> bool:
    """Whether two strategy files are the same sharding (small files: read whole)."""
    try:
        return read_bytes(path, "strategy file", LIMIT_BINARY) == read_bytes(other, "strategy file", LIMIT_BINARY)
    except (OSError, InputFileError):
        return False


def _at(step: SavedStep) -> str:
    return f"step {step.step}" if step.epoch is None else f"epoch {step.epoch} step {step.step}"

