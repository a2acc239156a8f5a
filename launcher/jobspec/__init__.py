"""The job description: what to run, where, and with which environment per rank.

Owns: ``options`` (RunOptions, from the command line and YAML), ``runspec`` (RunSpec: the options
parsed once into the typed groups each consumer reads), ``topology`` (nodes, ranks, parallel
dimensions), ``ranktable/`` (hccl.json: parse, validate, wait for, generate), ``rankenv`` (the pure
per-rank environment function), ``hostfacts``, ``recovery`` (the recovery strategy) and ``binding``
(``--bind-cores``: each local rank's CPU set).

May import: ``launcher.common``. Nothing here starts a process or talks to another node.
"""
