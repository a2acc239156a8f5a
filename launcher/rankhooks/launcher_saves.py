"""Report a rank's checkpoint saves to the launcher's checkpoint index (issue #19).

Standard library only, and never ``import launcher``: ranks may run a Python without the launcher.
The launcher appends this directory to the ranks' ``PYTHONPATH``; a script can also copy this file.

For a checkpoint ``<checkpoint dir>/rank_<r>/<name>``, the report is the empty file
``<checkpoint dir>/.saves/<r>.<size>.<name>`` (``docs/restore-plan.md``). With the reports, the launcher
finds a save round on a shared file system with one ``stat`` and one listing of ``.saves/`` instead
of a ``stat`` of every rank directory, and a reported file skips the settle interval. A rank that
reports must report every checkpoint it writes and withdraw the report before it deletes or
overwrites the file; a rank that never reports is found by the directory scan, as before.

Usage::

    os.replace(tmp, path)            # the checkpoint is complete under its final name
    launcher_saves.report_saved(path)
    ...
    launcher_saves.withdraw(path)    # before os.remove(path) or a save over the same name
"""

import os

REPORTS_DIR = ".saves"


def _report_path(path, size):
    rank_dir = os.path.dirname(os.path.abspath(path))
    rank = os.path.basename(rank_dir)
    if not (rank.startswith("rank_") and rank[5:].isdigit()):
        raise ValueError("{} is not in a rank_<r> directory".format(path))
    name = "{}.{}.{}".format(int(rank[5:]), size, os.path.basename(path))
    return os.path.join(os.path.dirname(rank_dir), REPORTS_DIR, name)


def report_saved(path):
    """Report the complete checkpoint ``path`` (call after it has its final name and size)."""
    report = _report_path(path, os.stat(path).st_size)
    os.makedirs(os.path.dirname(report), exist_ok=True)
    with open(report, "w"):
        pass
    return report


def withdraw(path):
    """Remove the report of ``path`` (call before deleting or overwriting it); no-op without one."""
    try:
        os.remove(_report_path(path, os.stat(path).st_size))
    except FileNotFoundError:
        pass
