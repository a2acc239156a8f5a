"""Run by Python's ``site`` at every start of a rank (this directory is on the ranks' ``PYTHONPATH``).

Standard library only. Two things, in this order:

1. With ``LAUNCHER_IMPORTS_FILE`` set (the launcher's default ``--preload auto``), record which
   modules the rank imports (``launcher_imports``).
2. Run the ``sitecustomize`` this file shadows, if there is one further on ``sys.path`` (a
   distribution's or a virtual environment's), as ``site`` would have run it: the rank starts
   exactly as without the launcher, the recording aside.
"""

import os
import sys


def _path_finder():
    """The path finder of ``sys.meta_path`` (the one ``site`` found this file with): importing
    ``importlib.machinery`` for it was half of what this file added to each rank's start-up."""
    for finder in sys.meta_path:
        if getattr(finder, "__name__", None) == "PathFinder":
            return finder
    from importlib.machinery import PathFinder

    return PathFinder


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = _path_finder().find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("LAUNCHER_IMPORTS_FILE"):
    try:
        import launcher_imports

        launcher_imports.install(os.environ["LAUNCHER_IMPORTS_FILE"])
    except OSError:
        pass  # no record: the standbys go without, the rank is unaffected
_chain()
