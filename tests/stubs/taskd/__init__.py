"""Stand-in for MindCluster's ``taskd`` package, for the launcher's tests.

TaskD is proprietary and not installable; this stand-in implements the documented API surface and
records calls for tests. Put ``tests/stubs`` on ``PYTHONPATH`` to use it. Layout as in the wheel:
``taskd.api`` (``init_taskd_manager`` / ``start_taskd_manager``) and
``taskd/python/cython_api/libs/libtaskd.so`` (built from ``tests/stubs/libtaskd.c`` by the tests).
"""

__version__ = "0.0.0+launcher.stub"
