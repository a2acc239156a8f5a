"""Which modules a rank imports, for the launcher's default warm standbys (``--preload auto``).

Standard library only, and never ``import launcher``. Installed by this directory's
``sitecustomize.py`` when ``LAUNCHER_IMPORTS_FILE`` names a file: a finder first on
``sys.meta_path`` that finds nothing (Python asks the next finder, as without it) but appends to that
file, one line each, the name of every module whose import *starts a chain*: one imported by running
code (the script, a function that imports lazily, such as ``torch.optim`` importing ``torch._dynamo``
on the first step) or by a package while it is imported from outside (``torch`` importing ``numpy``),
not the imports a package makes of its own submodules while it is imported (``torch`` of
``torch.nn``: importing ``torch`` again does those). A few hundred lines for a PyTorch job. The
launcher reads the file and has its standbys import the installed packages among these names
(``docs/warm-standby.md``).

Python consults ``sys.meta_path`` only for modules not in ``sys.modules``; each name is written once
per process (O_APPEND, one ``write`` per line: lines of several ranks never mix). Every
:data:`MARK_EVERY` imports of any kind it also writes an empty line, a sign of life: ``import torch``
is one name in the record for all its seconds, and the launcher waits until the ranks' imports
paused. A failing write switches the recorder off; it never fails an import.
"""

import os
import sys

ENV_VAR = "LAUNCHER_IMPORTS_FILE"
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib")
#: Imports between two empty lines (``import torch`` imports some 1500 modules).
MARK_EVERY = 50


def _top(name):
    return name.partition(".")[0]


class ImportRecorder:
    """The finder: records chain-starting module names, finds nothing.

    Args:
        fd: The file, opened for appending.
    """

    def __init__(self, fd):
        self.fd = fd
        self.seen = set()
        self.count = 0

    def find_spec(self, name, path=None, target=None):
        if self.fd >= 0 and name not in self.seen:
            self.seen.add(name)
            self.count += 1
            try:
                if self._starts_chain(name):
                    os.write(self.fd, (name + "\n").encode("utf-8", "surrogateescape"))
                elif self.count % MARK_EVERY == 0:
                    os.write(self.fd, b"\n")
            except Exception:  # never fail the rank's import: stop recording instead
                self.fd = -1
        return None

    @staticmethod
    def _starts_chain(name):
        """False for a package's import of its own module while that package is being imported."""
        frame = sys._getframe(2)
        while frame is not None:
            importer = frame.f_globals.get("__name__") or ""
            if not importer.startswith(_IMPORT_MACHINERY) and frame.f_code.co_filename[:17] != "<frozen importlib":
                break
            frame = frame.f_back
        if frame is None or _top(importer) != _top(name):
            return True
        spec = getattr(sys.modules.get(importer), "__spec__", None)
        return not getattr(spec, "_initializing", False)

    def invalidate_caches(self):
        """Nothing cached (``importlib.invalidate_caches`` calls every finder's)."""


def install(path):
    """Record into ``path`` from now on (the first finder); returns the recorder."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    recorder = ImportRecorder(fd)
    sys.meta_path.insert(0, recorder)
    return recorder
