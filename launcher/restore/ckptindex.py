"""An index of the checkpoint tree, kept by the launcher between restarts (issue #19).

A full scan (:func:`launcher.restore.checkpoints.scan_checkpoints`) lists every ``rank_<r>/``
directory, stats every checkpoint twice and sleeps the settle interval once: 1.3 s for 16,384 ranks
on a local disk, minutes on a shared file system. :class:`CheckpointIndex` keeps what the last look
found, per rank directory, and on :meth:`CheckpointIndex.scan` reads again only what changed:

* **Directory mtimes** are the cross-check that works everywhere, NFS included: every scan stats each
  rank directory (one call, no listing) and re-lists those whose ``(mtime, inode)`` changed. Creating,
  deleting or renaming a file changes its directory's mtime, on whichever node it happened. A
  directory whose mtime is younger than ``racy_seconds`` at the look is listed again next time
  (a file created within the same clock tick would not change it again; git's "racy" rule).
* **inotify** (one watch per rank directory and one on the checkpoint directory, through
  :mod:`launcher.common.filewatch`'s calls; inotify is not recursive) adds what mtimes miss on a local
  file system: writes into an existing file mark its directory for re-listing, and a file closed
  after writing (``IN_CLOSE_WRITE``) or renamed into place (``IN_MOVED_TO``) and not touched since
  counts as reported complete, so it needs no settle sleep. Writes from other nodes of a shared file
  system raise no inotify events: for them the mtime check above applies, and the settle interval.
* **As files appear, off the event loop.** With ``background``, the index's own thread
  (:class:`launcher.restore.ckptwatch.Indexer`) drains the inotify events as they come, runs
  :meth:`CheckpointIndex.update` after a burst (local file systems only, never sleeping) and
  :meth:`CheckpointIndex.poll` every ``ckptwatch.POLL_SECONDS`` (new reports), so a save round is indexed
  while it happens and the plan before the restart finds little left to read. One lock guards the
  index's state: the plan's :meth:`CheckpointIndex.scan` waits for the step the thread is in, then
  reads whatever is still unabsorbed itself (same result as the full scan either way).
* **Rank-reported saves** (:mod:`launcher.restore.ckptreports`): a rank that reports its saves in
  ``<root>/.saves/`` is not stat-ed at each scan, its new files need no listing and no settle sleep;
  ``.saves/`` is followed by inotify on a local file system, else by one ``stat`` per look. There a
  rank directory's inotify events need no listing either when the rank's reports account for every
  name they touched (:meth:`launcher.restore.ckptsaves.ReportedSaves._explain`).
* **Settle.** A checkpoint is settled when it was reported complete, or when an earlier scan already
  saw it with the same size and mtime after its own settle. Only the others are stat-ed again after
  one sleep, as in the full scan; a scan in which nothing new appeared does not sleep.

Everything the index concludes comes from the same functions the full scan uses, which stays the
fallback (``launcher plan`` is one-shot and uses it) and the cross-check in the tests. The inotify
half lives in :mod:`launcher.restore.ckptwatch`; digest checks in :mod:`launcher.restore.digests`.
"""

import logging
import os
import threading
import time
from typing import AbstractSet, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from launcher.common.filewatch import shared_file_system
from launcher.common.gcpause import paused
from launcher.restore.checkpoints import (DEFAULT_PATTERNS, DEFAULT_SETTLE_SECONDS, Candidate, Checkpoint,
                                          CheckpointPattern, Notes, ScanResult, list_rank_dirs, probed_map,
                                          rank_checkpoints, scan_rank, settle, unreadable_root)
from launcher.restore.ckptentry import NO_KINDS, QUIET, RankEntry, View, kept, same_kinds
from launcher.restore.ckptnames import by_kind
from launcher.restore.ckptreports import DirStamp, Reports, dir_stamp
from launcher.restore.ckptsaves import ReportedSaves
from launcher.restore.ckptwatch import _REPORTS, _ROOT, Indexer, IndexWatches, locked
from launcher.restore.digests import DigestCache, DigestWorker

logger = logging.getLogger(__name__)

#: A directory modified this recently (seconds) at the look is listed again at the next scan.
RACY_SECONDS = 2.0
_ANY_RANK = 1 << 62  # world size for listing: the index keeps every rank_<r>, scan() filters


class CheckpointIndex(IndexWatches, ReportedSaves):
    """The checkpoints under ``<root>/rank_<r>/``, re-read incrementally (see the module docstring).

    Args:
        root: the checkpoint directory (``--checkpoint-dir``).
        patterns: from :func:`launcher.restore.checkpoints.compile_patterns`.
        settle_seconds: as for the full scan.
        watch: use inotify (False: directory mtimes only, as on a shared file system).
        racy_seconds: see ``RACY_SECONDS``.
        background: keep the index up to date from its own thread (``ckpt-index``) as files appear.
        hash_ranks: the ranks whose new files the digest worker reads ahead (this node's: every
            node hashing every rank's saves would read each save round once per node); None: all.
        gc_freeze: with ``background``, the thread takes each absorbed round out of the garbage
            collector's passes (:meth:`launcher.restore.ckptwatch.IndexWatches.refreeze`; process-wide).
    """

    def __init__(self, root: str, patterns: Sequence[CheckpointPattern] = DEFAULT_PATTERNS,
                 settle_seconds: float = DEFAULT_SETTLE_SECONDS, watch: bool = True,
                 racy_seconds: float = RACY_SECONDS,
                 background: bool = False, hash_ranks: Optional[AbstractSet[int]] = None, gc_freeze: bool = False):
        self.root, self.patterns, self.settle_seconds = root, tuple(patterns), settle_seconds
        self._hash_ranks = hash_ranks
        self._racy_ns = int(racy_seconds * 1e9)
        self._root_stamp: DirStamp = None
        self._root_notes = Notes()
        self._ranks: Dict[int, RankEntry] = {}
        self._dirty: Set[int] = set()  # ranks whose directory must be listed again
        # Per rank, the names inotify saw change since the last look: name -> (event number, state).
        self._touched: Dict[int, Dict[str, Tuple[int, str]]] = {}
        self._events = 0  # inotify events read so far (their order across the directories)
        self._complete: Set[str] = set()  # paths closed after writing or renamed in, untouched since
        self._settled: Dict[str, Tuple[int, int]] = {}  # path -> (size, mtime_ns) seen settled
        self._unsettled: Set[int] = set()  # ranks with a file still being written at the last scan
        self._unresolved: Set[int] = set()  # ranks whose entry has no result (to compute at the next scan)
        self._view: Optional[View] = None  # the last scan's per-rank lists, updated for changed ranks only
        self._gc_freeze, self._freeze_due = gc_freeze and background, False
        self.absorbed_steps = 0  # updates, polls and scans that changed some rank (the indexer thread reads it)
        self._shared: Optional[bool] = None  # root on a file system other machines write to
        self._inotify, self._fd = None, None
        self._lock = threading.RLock()  # the indexer thread's steps and the plan's scan take turns
        self._all_watched = True  # every rank directory has its inotify watch
        self._wds: Dict[int, int] = {}  # watch descriptor -> rank (-1: the root)
        self.digests = DigestWorker(DigestCache())  # checks completed files' sidecars off the event loop
        self._digest_new = False  # after the first listing (that tree is left to the planner, not hashed whole)
        self._found: List[str] = []  # files new since the last batch for the digest worker
        # Rank-reported saves; a completion marker is proof only the directory listing can give.
        self._reports = Reports(root) if not any(p.marker for p in self.patterns) else None
        if watch:
            self._start_inotify()
        self.indexer = Indexer(self) if background else None

    def close(self) -> None:
        """Stop the indexer thread and watching (idempotent); the index keeps working from
        directory mtimes."""
        if self.indexer is not None:
            self.indexer.stop()  # before the descriptor it selects on is closed
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = None
            self._wds.clear()
            if self._reports is not None:
                self._reports.follow(False)
        self.digests.stop()

    def polls(self) -> bool:
        """Whether :meth:`poll` has anything to look at (saves reported in ``.saves/`` are used)."""
        return self._reports is not None

    def verify_digest(self, rank: int, path: str) -> Optional[bool]:
        """:func:`launcher.restore.ckptnames.verify_digest` of one file of the last scan: None without
        opening anything when its listing had no sidecar, else from the digest cache (hashing on a miss).

        Called from the planner's threads without the index's lock: the indexer replaces an entry's
        candidate list, never changes it in place, so the list read here is one listing's."""
        entry = self._ranks.get(rank)
        if entry is not None and any(c.sidecar is False for c in entry.candidates if c.checkpoint.path == path):
            return None
        return self.digests.cache.check(path)

    # -- scanning -----------------------------------------------------------------------------
    @locked
    def scan(self, world_size: int) -> ScanResult:
        """The same result as ``scan_checkpoints(root, world_size, patterns, settle_seconds)``,
        reading only the rank directories that changed since the last scan."""
        self.drain()
        try:
            self._refresh_root()
        except OSError as exc:
            self._root_stamp, self._ranks, self._unresolved, self._view = None, {}, set(), None
            return unreadable_root(self.root, world_size, exc)
        self._absorb_reports()
        self._explain()
        stale = self._stale(world_size)
        parallel = self._relist(stale)
        notes = Notes()
        notes.merge(self._root_notes)
        if self._ranks and max(self._ranks) >= world_size:
            for rank in sorted(self._ranks):
                if rank >= world_size:
                    notes.add(f"rank directories beyond world size {world_size} ignored", f"rank_{rank}")
        pending = sorted(rank for rank in self._unresolved if rank < world_size)
        self._settle_pending(pending, notes, parallel)
        if stale or pending:
            self._absorbed_here()
        view = self._current_view(world_size)
        for rank in sorted(view.noted):
            notes.merge(self._ranks[rank].notes)
        for rank in self._unsettled:
            self._ranks[rank].result = None  # a file was still being written: look again next time
            self._unresolved.add(rank)
        return ScanResult(tuple(view.per_rank), notes.lines(), kinds=view.scan_kinds(), keys=view.keys())

    def _absorbed_here(self) -> None:
        """The plan's scan read changes itself (the job's first full listing, a round the thread had
        not absorbed yet): the indexer thread takes them out of the collector's passes once the job
        runs quietly, so that no later pass (in the event loop, in the plan before the first restart)
        traverses the whole index (``REFREEZE_QUIET``; :meth:`refreeze`)."""
        self.absorbed_steps += 1
        self._freeze_due = self._gc_freeze
        if self.indexer is not None:
            self.indexer.nudge()

    def _current_view(self, world_size: int) -> "View":
        """The per-rank lists of the scan result, brought up to date for the ranks that changed since
        the last scan (all 16,384 only when the world size changed)."""
        view = self._view
        if view is None or len(view.per_rank) != world_size:
            view = self._view = View(world_size)
            changed: Iterable[int] = self._ranks
        else:
            changed = view.changed
        for rank in changed:
            if rank >= world_size:
                continue
            entry = self._ranks.get(rank)
            view.per_rank[rank] = entry.result if entry else ()
            view.set_kinds(rank, entry.kinds if entry else NO_KINDS)
            (view.noted.add if entry is not None and entry.notes.by_reason else view.noted.discard)(rank)
        view.changed = set()
        return view

    @locked
    @paused  # reading a save round allocates thousands of objects: see launcher.common.gcpause
    def update(self) -> None:
        """Read the queued events and list the changed rank directories now, from the indexer
        thread, so that the scan before a restart finds little left to do. Only on a local file
        system (a listing there takes microseconds); never sleeps: files that need settling wait
        for :meth:`scan`."""
        self.drain()
        if self._shared is not False:
            return
        try:
            self._refresh_root()  # new rank directories and .saves/ get their watches now
        except OSError:
            return  # the scan reports it
        reported = self._absorb_reports()
        reported.update(self._explain())
        ranks = sorted(self._dirty.intersection(self._ranks))
        self._dirty.difference_update(ranks)
        self._relist(ranks)
        self._settle_changed(reported.union(ranks))

    @locked
    @paused  # reading a save round allocates thousands of objects: see launcher.common.gcpause
    def poll(self) -> None:
        """From the indexer thread, every ``POLL_SECONDS``: absorb the saves reported since the
        last look (one ``stat`` of ``.saves/`` when nothing changed; nothing at all while inotify
        follows it), so that on a shared file system too the plan before a restart reads only what
        changed since. Never lists a rank directory and never sleeps."""
        if self._ranks:  # before the first scan there is nothing to bring up to date
            self._settle_changed(self._absorb_reports(eager=False))

    def _settle_changed(self, ranks: Set[int]) -> None:
        """Recompute the result of those ``ranks`` that changed, without sleeping (see update), and
        bring the scan's lists up to date for them here rather than in the plan."""
        self._settle_pending(sorted(rank for rank in ranks if self._ranks[rank].result is None), Notes(), False,
                             sleep=False)
        if ranks:
            self.absorbed_steps += 1
            self._freeze_due = self._gc_freeze
        if self._view is not None:
            self._current_view(len(self._view.per_rank))

    def _settle_pending(self, ranks: List[int], notes: Notes, parallel: bool, sleep: bool = True) -> None:
        """Compute the result of every rank in ``ranks``: settle what is new (one sleep for all of
        them, none when every file was reported complete or seen settled before). Without
        ``sleep``, ranks with files to settle are left without a result."""
        known, fresh = self._seen_settled(ranks)
        if not sleep:
            waiting = {candidate.checkpoint.rank for candidate in fresh}
            ranks, fresh = [rank for rank in ranks if rank not in waiting], []
        settle_notes = Notes()
        checked = settle(fresh, self.settle_seconds, settle_notes, parallel)
        notes.merge(settle_notes)
        stamps = {candidate.checkpoint.path: candidate.stamp for candidate in fresh}
        for checkpoint in checked:
            self._settled[checkpoint.path] = stamps[checkpoint.path]
            known[checkpoint.rank].append(checkpoint)
        # A rank with a file dropped as still being written (or left to settle) is looked at again.
        self._unsettled = {rank for rank in ranks if len(known[rank]) < len(self._ranks[rank].candidates)}
        for rank in ranks:
            self._set_result(rank, known[rank])
        self.digests.submit(self._found)  # one batch: hashed now, not before the restart
        self._found, self._digest_new = [], True

    def _seen_settled(self, ranks: List[int]) -> Tuple[Dict[int, List[Checkpoint]], List[Candidate]]:
        """Per rank, its candidates known complete (reported, or seen settled with this stamp), and
        the others, which need the settle check."""
        known: Dict[int, List[Checkpoint]] = {rank: [] for rank in ranks}
        fresh = []
        for rank in ranks:
            for candidate in self._ranks[rank].candidates:
                path = candidate.checkpoint.path
                if path in self._complete or self._settled.get(path) == candidate.stamp:
                    known[rank].append(candidate.checkpoint)
                else:
                    fresh.append(candidate)
        return known, fresh

    def _set_result(self, rank: int, checkpoints: List[Checkpoint]) -> None:
        """``rank``'s result from its complete ``checkpoints``, with the notes of its listing."""
        entry = self._ranks[rank]
        entry.notes = Notes()
        entry.notes.merge(entry.list_notes)
        entry.result = rank_checkpoints(checkpoints, entry.notes)
        self._resolved(rank)
        if not entry.notes.by_reason:
            entry.notes = QUIET
        entry.kinds = same_kinds(entry.kinds, by_kind(entry.result))

    def _hash_ahead(self, rank: int, candidates: List[Candidate]) -> None:
        """Queue the new or changed ``candidates`` of ``rank`` for the digest worker (this node's
        ranks, after the first listing; not files listed without a sidecar)."""
        if self._digest_new and (self._hash_ranks is None or rank in self._hash_ranks):
            self._found.extend(c.checkpoint.path for c in candidates if c.sidecar is not False)

    def _refresh_root(self) -> None:
        """List the checkpoint directory again when it changed: rank directories come and go."""
        stamp = dir_stamp(self.root)
        if stamp is not None and stamp == self._root_stamp:
            return
        self._watch(self.root, _ROOT)  # the same descriptor again when already watched
        if self._shared is None:
            self._shared = shared_file_system(self.root)
        if self._reports is not None and self._shared is False and _REPORTS not in self._wds.values():
            if self._watch(self._reports.path, _REPORTS):
                self._reports.follow(True)  # from now on its events say what changed, not a listing
        notes = Notes()
        dirs = list_rank_dirs(self.root, _ANY_RANK, notes)
        self._root_stamp, self._root_notes = self._trusted(stamp), notes
        for rank in set(self._ranks) - set(dirs):
            del self._ranks[rank]
            self._resolved(rank)
        watched = set(self._wds.values())
        for rank, path in dirs.items():
            if rank not in self._ranks or self._ranks[rank].path != path:
                self._ranks[rank] = RankEntry(path)
                self._unresolved.add(rank)
                self._dirty.add(rank)
            elif self._fd is not None and rank not in watched:
                self._dirty.add(rank)  # re-created since its watch was lost: what happened before is unseen
            self._watch(path, rank)

    def _resolved(self, rank: int) -> None:
        """``rank``'s entry got its result, or was removed: the scan's view of it changes."""
        self._unresolved.discard(rank)
        if self._view is not None:
            self._view.changed.add(rank)

    def _trusted(self, stamp: DirStamp) -> DirStamp:
        """``stamp``, or None when the directory changed too recently for its mtime to prove the
        next change (None never equals a later stamp, so the directory is listed again)."""
        if stamp is None or stamp[0] >= time.time_ns() - self._racy_ns:
            return None
        return stamp

    def _stale(self, world_size: int) -> List[int]:
        """The ranks below ``world_size`` whose directory must be listed again: inotify events, and,
        where inotify cannot see every write (a shared file system, or no watches), a changed
        directory mtime."""
        dirty, self._dirty = self._dirty, set()
        if self._fd is not None and self._all_watched and not self._shared:
            return sorted(rank for rank in dirty if rank < world_size and rank in self._ranks)
        ranks = [rank for rank in sorted(self._ranks) if rank < world_size]
        stale = dirty & set(ranks)
        skip = stale.union(self._reports.reporting()) if self._reports is not None else stale
        stale.update(self._moved_dirs([rank for rank in ranks if rank not in skip]))
        return sorted(stale)

    def _moved_dirs(self, ranks: List[int]) -> Set[int]:
        """Those of ``ranks`` whose directory's ``(mtime, inode)`` is not the one of its last listing
        (or cannot be trusted): one ``stat`` each, from threads on a slow file system."""
        def check(batch: List[int]) -> List[Tuple[int, DirStamp]]:
            return [(rank, dir_stamp(self._ranks[rank].path)) for rank in batch]

        moved: Set[int] = set()
        for batch in probed_map(check, ranks, self._shared is not False)[0]:
            moved.update(rank for rank, stamp in batch if stamp is None or stamp != self._ranks[rank].stamp)
        return moved

    def _relist(self, ranks: List[int]) -> bool:
        """List and classify the given rank directories again (what the full scan does for each).
        Returns whether the file system was found slow."""
        def scan(batch: List[int]) -> List[Tuple[int, DirStamp, List[Candidate], Notes]]:
            out = []
            for rank in batch:
                notes, path = Notes(), self._ranks[rank].path
                stamp = self._trusted(dir_stamp(path))  # before the listing: a later change shows
                out.append((rank, stamp, scan_rank(rank, path, self.patterns, notes), notes))
            return out

        results, parallel = probed_map(scan, ranks, self._shared is not False)
        for batch in results:
            for rank, stamp, candidates, notes in batch:
                entry = self._ranks[rank]
                candidates = kept(entry.candidates, candidates)
                notes = notes if notes.by_reason else QUIET
                present = {candidate.checkpoint.path for candidate in candidates}
                # Forget deleted files (rotation): the index stays bounded.
                self._forget(old.checkpoint.path for old in entry.candidates if old.checkpoint.path not in present)
                before = {(old.checkpoint.path, old.stamp) for old in entry.candidates}
                self._hash_ahead(rank, [c for c in candidates if (c.checkpoint.path, c.stamp) not in before])
                entry.stamp, entry.candidates, entry.list_notes, entry.result = stamp, candidates, notes, None
                self._unresolved.add(rank)
                entry.reported = self._reports.files(rank) if self._reports else {}  # the listing saw them
                self._complete.update(c.checkpoint.path for c in candidates  # reported: no settle sleep
                                      if entry.reported.get(os.path.basename(c.checkpoint.path)) == c.stamp[0])
        return parallel
