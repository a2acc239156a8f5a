"""Stand-in for ``taskd.python.cython_api`` (MindCluster TaskD).

TaskD is proprietary and not installable; this stand-in implements the documented API surface and
records calls for tests. ``libs/libtaskd.so`` is built by the tests from ``tests/stubs/libtaskd.c``
(never committed).
"""
