"""Supervision: run the ranks of one attempt, watch them, stop them, decide what happens next.

Owns the policy (``supervisor`` restart loop, ``policy``, ``states``) apart from the mechanism
(``procgroup``: spawn, signal, reap; ``guard``: orphan guard; ``output``/``console``: rank output and
the terminal), the loop's event types (``loopevents``) and ``--debug-rank`` (``debugging``). The
supervisor sees only the ProcessGroup interface and events.

May import: ``launcher.jobspec``, ``launcher.monitoring``, ``launcher.common``.
"""
