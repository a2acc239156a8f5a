"""The job's process tree and orphan guard, set up before the session's imports so the first ranks wait less.

The first ranks are born in the first attempt's cgroup, which needs this process moved into it: a
5-20 ms wait for the kernel (an RCU grace period) that uses no CPU (docs/benchmarks.md, launch).
Begun here, in a thread, it runs while the session's modules are imported and the run dir is set up,
instead of in front of the first spawn. The orphan guard is forked before the move begins: a process
started during the move is born in the attempt's cgroup, and the guard must outlive every attempt.
"""

from launcher.common.records import record
from launcher.supervision import guard as guard_mod
from launcher.supervision.jobtree import JobTree


@record
class JobStart:
    """What a session takes over: the job's process tree (moving into the first attempt's cgroup) and
    the orphan guard watching it.

    Attributes:
        tree: The job's process tree; :meth:`JobTree.prepare` began for attempt 0.
        guard: The orphan guard, forked before the move.
    """

    tree: JobTree
    guard: guard_mod.OrphanGuard

    @classmethod
    def begin(cls) -> "JobStart":
        """Become the job's subreaper, create its tree, fork the guard, begin the move for attempt 0."""
        guard_mod.become_subreaper()
        tree = JobTree.create(adopt_orphans=True)  # our children we did not start are the job's orphans
        guard = guard_mod.OrphanGuard(tree)
        tree.prepare("a0")
        return cls(tree, guard)

    def abandon(self) -> None:
        """The run never started: back out of the move, remove the cgroup, let the guard exit."""
        self.tree.close()
        self.guard.close()
