"""Supervision: run the ranks of one attempt, watch them, stop them, decide what happens next.

Owns the policy (``supervisor``, with ``requests`` for what is asked from outside the ranks;
``policy``; ``states``) apart from the mechanism (``procgroup``: spawn, signal, reap, on ``eventloop``,
behind the interface in ``group``; with ``spawn``: how one rank's process starts; ``listening``: whether
the rank hosting the rendezvous listens yet;
``jobtree`` and ``cgroup``: every process of the job; ``guard``: orphan guard; ``output``/``console``:
rank output and the terminal; ``standby``: warm standby ranks, with ``standbylearn``: what ``--preload
auto`` learns and the memory left for them), the loop's event types (``loopevents``), ``--debug-rank``
(``debugging``) and the interface of what runs beside the ranks (``integration``). The supervisor sees
only the ProcessGroup interface and events.

May import: ``launcher.jobspec``, ``launcher.common``.
"""
