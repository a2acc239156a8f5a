"""Shared ground every layer stands on: errors, env var names, bounded input reading, the run dir.

Owns: ``errors`` (UsageError / LauncherError), ``envnames`` (every env var name), ``inputfiles``,
``inputrecords`` and ``inputyaml`` (the one bounded reader of every file and record the launcher did
not write), ``outputfiles`` (the one way to create files where someone else may plant a symlink), ``resources`` (shipped schemas), ``rundir`` and ``jobs`` (the run dir
and the jobs under the base dir), ``signals`` (handlers that only record), ``warnonce``,
``filewatch`` and ``gcpause`` (the cyclic collector paused while any thread asks, and long-lived
objects frozen out of its passes), ``records`` (``@record``: dataclasses that import faster), ``programs``
(``which``: a program on ``PATH`` as ``exec`` finds it).

May import: the standard library and third-party packages only; nothing else from ``launcher``.
"""
