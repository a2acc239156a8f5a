"""Finding a program on ``PATH``, as ``shutil.which`` finds it, without importing ``shutil``.

``shutil`` imports ``fnmatch``, ``bz2``, ``lzma`` and ``zlib``: about 2 ms of ``launcher run``'s
start-up before its first rank, where all it needed was ``which`` (the command, setpriv, npu-smi).
tests/unit/common/test_programs.py compares :func:`which` with ``shutil.which``.
"""

import os
from typing import Optional


def which(program: str, path: Optional[str] = None) -> Optional[str]:
    """The first executable file named ``program`` on ``path`` (default: ``$PATH``, else the system's
    default path), or ``program`` itself when it names a directory part and is executable; None
    otherwise. An empty ``path`` finds nothing; an empty entry in it means the current directory."""
    if os.path.dirname(program):
        return program if _executable(program) else None
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):
                path = os.defpath
    if not path:
        return None
    seen = set()
    for directory in path.split(os.pathsep):
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, program)
        if _executable(candidate):
            return candidate
    return None


def _executable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.F_OK | os.X_OK) and not os.path.isdir(path)
