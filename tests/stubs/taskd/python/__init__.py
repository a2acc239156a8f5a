"""Stand-in for ``taskd.python`` (MindCluster TaskD).

TaskD is proprietary and not installable; this stand-in implements the documented API surface and
records calls for tests. Only the directory matters here: it holds ``cython_api/libs/libtaskd.so``.
"""
