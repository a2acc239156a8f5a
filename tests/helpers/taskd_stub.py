"""Build the stand-in ``libtaskd.so`` (TaskD is proprietary; see ``tests/stubs/taskd``)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "tests" / "stubs"
STUB_PKG = STUBS / "taskd"
STUB_LIB = STUB_PKG / "python" / "cython_api" / "libs" / "libtaskd.so"
STUB_LIB_SOURCE = STUBS / "libtaskd.c"


def build_libtaskd() -> str:
    """Compile ``tests/stubs/libtaskd.c`` into the stub tree (when missing or stale); its path.

    The result is never committed; concurrent builds are safe (build aside, then rename).
    """
    if STUB_LIB.exists() and STUB_LIB.stat().st_mtime >= STUB_LIB_SOURCE.stat().st_mtime:
        return str(STUB_LIB)
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the stand-in libtaskd.so")
    STUB_LIB.parent.mkdir(parents=True, exist_ok=True)
    tmp = STUB_LIB.with_name(f".libtaskd.{os.getpid()}.so")
    result = subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(tmp), str(STUB_LIB_SOURCE)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"cannot build the stand-in libtaskd.so:\n{result.stderr}")
    os.replace(tmp, STUB_LIB)
    return str(STUB_LIB)
