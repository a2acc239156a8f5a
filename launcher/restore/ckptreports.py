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
from typing import Callable, Dict, KeysView, Optional, Set, Tuple

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
    """The reports directory as last read: per rank, each reported file name and its sizes (more
    than one size: the rank reported the name twice and the index lists the directory instead).

    Read two ways. By listing (:meth:`refresh`): one ``stat``, and one listing when it changed; a
    listing costs about 35 ms per 49k names on a local disk, more on a shared file system, so the
    index does it from its own thread between restarts (:meth:`launcher.restore.ckptindex.
    CheckpointIndex.poll`), not only in the plan. By inotify events (:meth:`follow`, :meth:`event`)
    on a local file system: after one listing, each created or removed report is applied as it
    comes and nothing is listed again. Either way :meth:`take_changed` hands the index only the ranks
    whose reports changed.

    Args:
        root: the checkpoint directory.
    """

    def __init__(self, root: str):
        self.path = os.path.join(root, REPORTS_DIR)
        self._stamp: DirStamp = None  # at the last listing
        self._proven = False  # that stamp was old enough to prove the next change (the racy rule)
        self._names: Set[str] = set()
        self._by_rank: Dict[int, Dict[str, Set[int]]] = {}
        self._files: Dict[int, Dict[str, Optional[int]]] = {}  # what files() returns, kept as events come
        self._changed: Set[int] = set()
        # Per rank, ``file name -> the index's event number`` of reports that came as inotify events.
        self._created_at: Dict[int, Dict[str, int]] = {}
        self._followed = False  # inotify watches the directory and every event reaches event()
        self._relist = True  # the names may be out of date whatever the directory's stamp says

    def follow(self, followed: bool) -> None:
        """Start (after the watch was added) or stop following the directory's inotify events; the
        next :meth:`refresh` lists it once (events before the watch are not known)."""
        self._followed, self._relist = followed, True

    def lost(self) -> None:
        """Events were lost (queue overflow): list again at the next :meth:`refresh`."""
        self._relist = True
        self._created_at.clear()

    def refresh(self, trusted: Callable[[DirStamp], DirStamp], eager: bool = True) -> None:
        """List the reports directory again unless events or its unchanged stamp prove nothing new.

        Args:
            trusted: the index's racy-stamp rule (a stamp too recent to prove the next change -> None).
            eager: list again while the unchanged stamp is too recent to prove anything (the plan
                must); without it (the index thread's polls) such a stamp is listed again once it is
                old enough, not at every poll: a report made within the last listing's clock tick
                waits that long, any later one changes the stamp and is listed at once.
        """
        if self._followed and not self._relist:
            return
        stamp = dir_stamp(self.path)
        if not self._relist and stamp is not None and stamp == self._stamp:
            if self._proven or (not eager and trusted(stamp) is None):
                return
        try:
            names = set(os.listdir(self.path))  # names only: about 2x cheaper than scandir's entries
        except OSError:
            names = set()
        self._stamp, self._proven, self._relist = stamp, trusted(stamp) is not None, False
        for name in names - self._names:
            self.event(name, True)
        for name in self._names - names:
            self.event(name, False)

    def event(self, name: str, present: bool, number: int = -1) -> None:
        """Report ``name`` created (``present``) or removed; ``number``: the inotify event's number
        in the index's queue (-1: found by a listing, its time unknown)."""
        if (name in self._names) == present:
            return
        (self._names.add if present else self._names.discard)(name)
        parsed = parse_report(name)
        if parsed is None:
            return
        rank, size, file_name = parsed
        created = self._created_at.setdefault(rank, {})
        if present and number >= 0:
            created[file_name] = number
        else:
            created.pop(file_name, None)
            if not created:
                del self._created_at[rank]
        files = self._by_rank.setdefault(rank, {})
        sizes = files.setdefault(file_name, set())
        (sizes.add if present else sizes.discard)(size)
        if not sizes:
            del files[file_name], self._files[rank][file_name]
            if not files:
                del self._by_rank[rank], self._files[rank]
        else:
            self._files.setdefault(rank, {})[file_name] = next(iter(sizes)) if len(sizes) == 1 else None
        self._changed.add(rank)

    def pending(self) -> bool:
        """Whether some rank's reports changed since the last :meth:`take_changed`."""
        return bool(self._changed)

    def take_changed(self) -> Set[int]:
        """The ranks whose reports changed since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def reporting(self) -> KeysView[int]:
        """The ranks that report their saves (at least one report), as a live view."""
        return self._by_rank.keys()

    def reported_after(self, rank: int, file_name: str, number: int) -> bool:
        """Whether ``rank``'s report of ``file_name`` came as an inotify event later than the index's
        event ``number`` (a file's last event: the report then says what its writer left)."""
        return self._created_at.get(rank, {}).get(file_name, -1) > number

    def files(self, rank: int) -> Dict[str, Optional[int]]:
        """``file name -> size`` reported by ``rank`` (None: reported with different sizes)."""
        files = self._files.get(rank)
        return dict(files) if files else {}  # a copy: the index compares it with later reports
