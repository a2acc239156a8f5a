"""Finding a program on ``PATH`` as ``exec`` finds it, without importing ``shutil``.

The one lookup of a program in the launcher: the rank's command (checked before anything runs, and
looked at before it is spawned), setpriv, npu-smi, py-spy. It searches the directories
``os.get_exec_path`` gives for an environment, which ``subprocess.Popen`` and ``execvp`` search, so
the file it names is the one a spawn runs. ``shutil`` would have imported ``fnmatch``, ``bz2``,
``lzma`` and ``zlib``: about 2 ms of ``launcher run``'s start-up before its first rank.
"""

import os
from typing import Mapping, Optional


def which(program: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The file ``exec`` runs for ``program`` in an environment ``env`` (default: this process's): as
    given when it names a directory part, else the first executable regular file of that name in
    ``env``'s ``PATH`` (the system's default path without one; an empty entry is the current
    directory). None when there is none."""
    if os.path.dirname(program):
        candidates = [program]
    else:
        candidates = [os.path.join(d, program) for d in os.get_exec_path(None if env is None else dict(env))]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None
