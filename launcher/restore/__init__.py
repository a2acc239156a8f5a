"""Restore planning: decide once, identically on every node, what each rank resumes from.

``compute_plan(PlanInputs(...))`` reads the fault reports, the replica groups and the checkpoint
directory and returns a :class:`RestorePlan`; ``plan.env_for(rank)`` is what that rank's process gets.
See ``docs/restore-plan.md``.

May import: ``launcher.cluster`` (the reset.json reader), ``launcher.jobspec``, ``launcher.common``.
"""

from launcher.restore.ckptindex import CheckpointIndex
from launcher.restore.plan import RestorePlan
from launcher.restore.planner import PlanInputs, build_plan, compute_plan

__all__ = ["CheckpointIndex", "PlanInputs", "RestorePlan", "build_plan", "compute_plan"]
