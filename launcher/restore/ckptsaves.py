"""The ranks' reported saves applied to the checkpoint index (:mod:`launcher.restore.ckptindex`):
a newly reported file becomes a candidate without a listing or a settle sleep, a withdrawn report
drops its file, and whatever the name alone cannot settle has the rank directory listed. On a local
file system the reports also account for the inotify events of the rank directories they name, so
a save round of reporting ranks is absorbed without listing a rank directory.

Split out of the index for size; :class:`ReportedSaves` is a base of
:class:`launcher.restore.ckptindex.CheckpointIndex` and works on that object's state (as
:class:`launcher.restore.ckptwatch.IndexWatches` does).
"""

import os
from typing import Dict, Iterable, List, Optional, Set, Tuple

from launcher.restore.checkpoints import Candidate, Checkpoint
from launcher.restore.ckptentry import RankEntry
from launcher.restore.ckptnames import DIGEST_SUFFIX, SIDE_FILE_SUFFIXES, classify_name
from launcher.restore.ckptwatch import GONE, WRITTEN


class ReportedSaves:  # pylint: disable=too-few-public-methods
    """Reports for :class:`launcher.restore.ckptindex.CheckpointIndex` (its attributes)."""

    def _absorb_reports(self, eager: bool = True) -> Set[int]:
        """Read the reports that changed and apply them to the known ranks; returns those ranks
        (``eager``: see :meth:`launcher.restore.ckptreports.Reports.refresh`)."""
        if self._reports is None:
            return set()
        self._reports.refresh(self._trusted, eager)
        ranks = {rank for rank in self._reports.take_changed() if rank in self._ranks}
        for rank in ranks:
            self._apply_reports(rank)
        return ranks

    def _apply_reports(self, rank: int) -> None:
        """Bring one rank's entry up to date with its reports, without listing its directory: a newly
        reported file is a candidate that needs no settling, a withdrawn report drops its file.
        Anything the name alone cannot settle (one name reported with two sizes, an empty file, a
        name that is no checkpoint, a file the last listing warned about) has the directory listed."""
        entry = self._ranks[rank]
        files = self._reports.files(rank)
        fresh = self._reported_fresh(rank, entry, files)
        if fresh is None:
            self._dirty.add(rank)
            return
        gone = {os.path.join(entry.path, name) for name in entry.reported if name not in files}
        if not gone and not fresh:
            entry.reported = files
            return
        gone.update(candidate.checkpoint.path for candidate in fresh)
        if entry.list_notes.by_reason:
            noted = {name for names in entry.list_notes.by_reason.values() for name in names}
            if any(f"rank_{rank}/{os.path.basename(path)}" in noted for path in gone):
                self._dirty.add(rank)  # the listing said something about the file (e.g. empty): list again
                return
        self._forget(gone)
        self._complete.update(candidate.checkpoint.path for candidate in fresh)
        entry.candidates = [c for c in entry.candidates if c.checkpoint.path not in gone] + fresh
        entry.reported, entry.result = files, None
        self._unresolved.add(rank)
        self._hash_ahead(rank, fresh)

    def _explain(self) -> Set[int]:
        """The rank directories inotify saw change, without listing those whose every change the
        rank's reports account for (a save round on a local file system: 2,048 listings and the
        ``stat`` of each file were most of the cost of absorbing it). The others are marked for
        listing. Returns the ranks whose entry changed here. Call after :meth:`_absorb_reports`.

        A rank's reports account for a changed name when its last event left it written (closed
        after writing, or renamed in) and its report, of the size the index now holds for it, came
        later in the same event queue (so nothing touched the file after its writer reported it);
        or when its last event removed it, its report is withdrawn and the last listing said nothing
        about it; or a side file written (:meth:`_side_file_accounted`). The directory then holds
        what a listing would find: what was there, less the removed names, plus the reported files.
        Only where inotify sees every change.
        """
        touched, self._touched = self._touched, {}
        exact = self._reports is not None and self._fd is not None and self._all_watched and self._shared is False
        changed = set()
        for rank, names in touched.items():
            entry = self._ranks.get(rank)
            if entry is None or rank in self._dirty:
                continue  # gone, or listed anyway
            if not exact or not self._accounted(rank, entry, names):
                self._dirty.add(rank)
                continue
            gone = {os.path.join(entry.path, name) for name, (_, state) in names.items() if state == GONE}
            if any(c.checkpoint.path in gone for c in entry.candidates):
                self._forget(gone)
                entry.candidates = [c for c in entry.candidates if c.checkpoint.path not in gone]
                entry.result = None
                self._unresolved.add(rank)
                changed.add(rank)
        return changed

    def _accounted(self, rank: int, entry: RankEntry, names: Dict[str, Tuple[int, str]]) -> bool:
        """Whether ``rank``'s reports account for every change of ``names`` (see :meth:`_explain`)."""
        sizes: Optional[Dict[str, int]] = None
        for name, (number, state) in names.items():
            if state == GONE:
                if name in entry.reported or self._noted(rank, entry, name):
                    return False
            elif name.endswith(SIDE_FILE_SUFFIXES):
                if state != WRITTEN or not self._side_file_accounted(entry, name):
                    return False
            elif state == WRITTEN:
                size = entry.reported.get(name)
                if not size or not self._reports.reported_after(rank, name, number):
                    return False
                if sizes is None:
                    sizes = {c.checkpoint.path: c.stamp[0] for c in entry.candidates}
                if sizes.get(os.path.join(entry.path, name)) != size:
                    return False
            else:
                return False  # still being written, or its attributes changed: a listing tells
        return True

    @staticmethod
    def _side_file_accounted(entry: RankEntry, name: str) -> bool:
        """A side file written (a digest sidecar, MindSpore's ``.meta``): the listing would add no
        candidate and say nothing about it, but the candidate of a checkpoint whose listing found no
        sidecar is not checked against one (``verify_digest``): a sidecar appearing beside such a
        file needs the listing."""
        if not name.endswith(DIGEST_SUFFIX):
            return True
        path = os.path.join(entry.path, name[:-len(DIGEST_SUFFIX)])
        return not any(c.sidecar is False and c.checkpoint.path == path for c in entry.candidates)

    @staticmethod
    def _noted(rank: int, entry: RankEntry, name: str) -> bool:
        """Whether the last listing of ``rank`` said something about ``name`` (e.g. an empty file)."""
        return any(f"rank_{rank}/{name}" in names for names in entry.list_notes.by_reason.values())

    def _reported_fresh(self, rank: int, entry: RankEntry, files: Dict[str, int]) -> Optional[List[Candidate]]:
        """The candidates ``rank``'s reports add to its entry (a reported file the listing already
        has with that size is only marked complete); None when a report needs the directory listed
        (size 0, a name that is no checkpoint)."""
        listed = {c.checkpoint.path: c.stamp[0] for c in entry.candidates}
        fresh = []
        for name, size in files.items():
            if entry.reported.get(name) == size:
                continue  # accounted for by the last listing or report
            # No pattern has a marker when reports are used, so no other name matters here.
            parsed = classify_name(name, self.patterns, frozenset())[1] if size else None
            if parsed is None:
                return None
            path = os.path.join(entry.path, name)
            if listed.get(path) == size:  # inotify's listing already has it: only its settling is saved
                self._complete.add(path)
                continue
            fresh.append(Candidate(Checkpoint(rank, path, *parsed[:3], size), (size, -1)))
        return fresh

    def _forget(self, paths: Iterable[str]) -> None:
        """What the index knows about files deleted or replaced: settled, digest checked, complete."""
        for path in paths:
            self._settled.pop(path, None)
            self.digests.cache.forget(path)
            self._complete.discard(path)
