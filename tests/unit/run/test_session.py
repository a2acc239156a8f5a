"""Unit tests for ``launcher.run.session``'s words about restore plans (the rest runs in tests/integration)."""

from launcher.restore.plan import RestorePlan
from launcher.run.session import resume_summary


def plan(kind, step=None, sources=(), reason="why"):
    return RestorePlan(world_size=len(sources) or 4, kind=kind, reason=reason, epoch=None, step=step,
                       groups=(), groups_source="-", fault_ranks=(), fault_origins=(), sources=sources, files=())


def test_resume_summary():
    assert resume_summary(plan("breakpoint", 70, (0, 0, 0, 0))) == "resuming from the step-70 breakpoint of rank 0"
    assert resume_summary(plan("breakpoint", 70, (0, 0, 4, 4))) == \
        "resuming from the step-70 breakpoint of ranks 0, 4"
    assert resume_summary(plan("periodic", 60, (0, 1, 2, 3))) == "resuming from the step-60 periodic checkpoints"
    assert resume_summary(plan("none", reason="no checkpoints: /c does not exist yet")) == \
        "starting from scratch (no checkpoints: /c does not exist yet)"
