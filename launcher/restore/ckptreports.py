"""Saves the ranks reported themselves: the reports directory beside the rank directories (issue #19).

A rank that finished writing a checkpoint ``<root>/rank_<r>/<name>`` (under its final name, e.g. after
the rename of a temporary file) creates the empty file ``<root>/.saves/<r>.<size>.<name>``, ``<size>``
being the checkpoint's size in bytes; before it deletes or overwrites the checkpoint it removes that
report. ``launcher/rankhooks/launcher_saves.py`` does both for Python ranks; the format is documented
in ``docs/restore-plan.md`` so any framework's save callback can write it.

The whole job's reports are one directory, so on a shared file system one ``stat`` of it says whether
any rank saved, and one listing says which: no ``stat`` of each rank directory, no settle sleep for
a reported file (the writer said it is complete), no listing of the rank directory it is in. The
name carries everything the index needs, so no report is ever opened.
"""

import os
from typing import Callable, Dict, FrozenSet, Optional, Set, Tuple

#: The reports directory's name under the checkpoint directory (skipped by the rank directory listing).
REPORTS_DIR = ".saves"
DirStamp = Optional[Tuple[int, int]]  # (mtime_ns, inode) of a directory; None when it cannot be stat-ed


def dir_stamp(path: str) -> DirStamp:
    """``(mtime_ns, inode)`` of a directory, None when it cannot be stat-ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino)


def parse_report(name: str) -> Optional[Tuple[int, int, str]]:
    """``(rank, size, checkpoint file name)`` from a report's name, None when it is not one."""
    parts = name.split(".", 2)
    if len(parts) != 3 or not all(part.isdigit() and part.isascii() for part in parts[:2]) or not parts[2]:
        return None
    if parts[0] != str(int(parts[0])) or parts[2].startswith("."):
        return None
    return int(parts[0]), int(parts[1]), parts[2]


class Reports:
    """The reports directory as last listed: per rank, each reported file name and its sizes
    (more than one size: the rank reported the name twice and the index lists the directory instead).

    Args:
        root: the checkpoint directory.
    """

    def __init__(self, root: str):
        self.path = os.path.join(root, REPORTS_DIR)
        self._stamp: DirStamp = None
        self._names: FrozenSet[str] = frozenset()
        self._by_rank: Dict[int, Dict[str, Set[int]]] = {}

    def refresh(self, trusted: Callable[[DirStamp], DirStamp]) -> Set[int]:
        """List the reports directory again if it changed; returns the ranks whose reports changed.

        Args:
            trusted: the index's racy-stamp rule (a stamp too recent to prove the next change -> None).
        """
        stamp = dir_stamp(self.path)
        if stamp is not None and stamp == self._stamp:
            return set()
        try:
            with os.scandir(self.path) as it:
                names = frozenset(entry.name for entry in it)
        except OSError:
            names = frozenset()
        self._stamp = trusted(stamp)
        changed = set()
        for name, add in [(n, True) for n in names - self._names] + [(n, False) for n in self._names - names]:
            parsed = parse_report(name)
            if parsed is None:
                continue
            rank, size, file_name = parsed
            sizes = self._by_rank.setdefault(rank, {}).setdefault(file_name, set())
            (sizes.add if add else sizes.discard)(size)
            if not sizes:
                del self._by_rank[rank][file_name]
            changed.add(rank)
        self._names = names
        return changed

    def reporting(self, rank: int) -> bool:
        """Whether ``rank`` reports its saves (has at least one report)."""
        return bool(self._by_rank.get(rank))

    def files(self, rank: int) -> Dict[str, Optional[int]]:
        """``file name -> size`` reported by ``rank`` (None: reported with different sizes)."""
        return {name: next(iter(sizes)) if len(sizes) == 1 else None
                for name, sizes in self._by_rank.get(rank, {}).items()}
