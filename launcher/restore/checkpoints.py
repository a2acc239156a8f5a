"""Find the complete checkpoints under ``<checkpoint_dir>/rank_<r>/``.

A file is a checkpoint when its name fully matches a pattern with a named group ``step`` (and
optionally ``epoch``; a ``breakpoint`` group that matched makes it a breakpoint checkpoint). The
defaults recognise MindSpore's ``{prefix}-{epoch}_{step}.ckpt`` and
``{prefix}-{epoch}_{step}_breakpoint.ckpt`` and the PyTorch example's ``ckpt-{epoch}_{step}.pt`` and
``ckpt-{epoch}_{step}_breakpoint.pt``. MindSpore's ``OnRequestExit`` file ``{name}_train.ckpt`` is
recognised but never chosen: its name carries no step, so nothing proves it is newer than, or
consistent with, any other checkpoint.

A checkpoint counts only when it is provably finished, as far as the file system can tell:

* temporary names (``*.tmp``, ``*.part``, dot files) are writes in progress; the PyTorch example
  writes ``<name>.tmp`` and renames it, so a final name is complete by construction;
* empty files are not checkpoints;
* a pattern may name a completion marker (a file in the same directory written after the checkpoint,
  e.g. ``{name}.done``); without it the checkpoint does not count;
* every candidate is stat-ed twice, ``settle_seconds`` apart (one sleep for the whole scan); a file
  whose size or modification time changed is still being written. This catches writers on other
  nodes of a shared file system that the local launcher cannot see.

"Newest" is decided by ``(epoch, step)`` parsed from the name, never by modification time. Epoch
comes first because MindSpore's step is the step within the epoch.

On the shared file systems checkpoints live on (NFS, SFS, OBS mounts) each listing and stat costs a
round trip of a millisecond or more, and a job of thousands of ranks would wait minutes for its plan
before every restart. The scan times its first rank directories: when they are that slow, the rest
are listed and stat-ed from a thread pool (12x faster with 1 ms round trips); on a local disk, where
threads only fight over the GIL (2x slower), it stays in one thread.
"""

import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

# Re-exported: the scan's callers name patterns and checkpoints from here.
from launcher.restore.ckptnames import (DEFAULT_PATTERNS, DEFAULT_SETTLE_SECONDS, DIGEST_SUFFIX,
                                        KIND_BREAKPOINT, KIND_EXIT, KIND_PERIODIC, UNEXPECTED, Checkpoint,
                                        CheckpointPattern, ScanResult, classify_name, compile_patterns,
                                        verify_digest)
from launcher.restore.ckptreports import REPORTS_DIR
from launcher.restore.dcpsteps import DCP_DIR
from launcher.restore.mssteps import MANIFESTS_DIR
from launcher.restore.mstransform import CONVERTED_DIR

__all__ = ["DEFAULT_PATTERNS", "DEFAULT_SETTLE_SECONDS", "DIGEST_SUFFIX", "KIND_BREAKPOINT", "KIND_EXIT",
           "KIND_PERIODIC", "Candidate", "Checkpoint", "CheckpointPattern", "Notes", "ScanResult",
           "compile_patterns", "finish_scan", "list_rank_dirs", "probed_map", "rank_checkpoints", "scan_checkpoints",
           "scan_rank", "settle", "unreadable_root", "verify_digest"]

logger = logging.getLogger(__name__)

_RANK_DIR = re.compile(r"rank_(0|[1-9]\d*)")
_EXAMPLES = 5
#: Threads listing and stat-ing rank directories on a slow file system (the calls release the GIL).
SCAN_THREADS = 16
#: Rank directories scanned first, in the calling thread, to time the file system.
PROBE_RANKS = 32
#: Seconds per rank directory (a listing and a stat per file) above which the scan goes parallel.
SLOW_RANK_SECONDS = 0.0005
T = TypeVar("T")
R = TypeVar("R")


class Notes:
    """Ignored names by reason, reported as one warning line per reason."""

    def __init__(self) -> None:
        self.by_reason: Dict[str, List[str]] = {}

    def add(self, reason: str, name: str) -> None:
        self.by_reason.setdefault(reason, []).append(name)

    def merge(self, other: "Notes") -> None:
        for reason, names in other.by_reason.items():
            self.by_reason.setdefault(reason, []).extend(names)

    def lines(self) -> Tuple[str, ...]:
        out = []
        for reason in sorted(self.by_reason):
            names = sorted(self.by_reason[reason])
            shown = ", ".join(names[:_EXAMPLES])
            more = f" and {len(names) - _EXAMPLES} more" if len(names) > _EXAMPLES else ""
            out.append(f"checkpoints: {len(names)} {reason}: {shown}{more}")
        return tuple(out)


@dataclass(frozen=True)
class Candidate:
    checkpoint: Checkpoint
    stamp: Tuple[int, int]  # (size, mtime_ns) at the first look
    #: Whether the listing had its ``<name>.sha256`` (written before the file); None: not listed.
    sidecar: Optional[bool] = None


def _stamp(path: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def scan_rank(rank: int, rank_dir: str, patterns: Sequence[CheckpointPattern],
               notes: Notes) -> List[Candidate]:
    """Candidate checkpoints in one rank directory (first look; not yet settled)."""
    try:
        with os.scandir(rank_dir) as it:
            entries = sorted((entry.name, entry.is_file()) for entry in it)
    except OSError as exc:
        notes.add("rank directories unreadable", f"rank_{rank} ({exc.strerror})")
        return []
    names = frozenset(name for name, _ in entries)
    claimed_markers = set()
    unexpected = []
    found: List[Candidate] = []
    for name, is_file in entries:
        reason, parsed = classify_name(name, patterns, names) if is_file else (UNEXPECTED, None)
        if parsed is None:
            if reason == UNEXPECTED:
                unexpected.append(name)
            elif reason:
                notes.add(reason, f"rank_{rank}/{name}")
            continue
        kind, epoch, step, marker = parsed
        if marker:
            claimed_markers.add(marker)
        path = os.path.join(rank_dir, name)
        stamp = _stamp(path)
        if stamp is None:  # deleted since the listing (keep_checkpoint_max rotation)
            continue
        if stamp[0] == 0:
            notes.add("empty files ignored", f"rank_{rank}/{name}")
            continue
        found.append(Candidate(Checkpoint(rank, path, kind, epoch, step, stamp[0]), stamp,
                               name + DIGEST_SUFFIX in names))
    for name in unexpected:
        if name not in claimed_markers:
            notes.add(UNEXPECTED, f"rank_{rank}/{name}")
    return found


def settle(candidates: List[Candidate], settle_seconds: float, notes: Notes,
            parallel: bool) -> List[Checkpoint]:
    """Drop the candidates whose size or mtime changes within ``settle_seconds`` (still written)."""
    if settle_seconds <= 0:
        return [candidate.checkpoint for candidate in candidates]
    if candidates:
        time.sleep(settle_seconds)
    paths = [candidate.checkpoint.path for candidate in candidates]
    stamps = [stamp for batch in _map(lambda part: [_stamp(path) for path in part], paths, parallel)
              for stamp in batch]
    settled = []
    for candidate, stamp in zip(candidates, stamps):
        checkpoint = candidate.checkpoint
        if stamp != candidate.stamp:
            notes.add("files still being written ignored",
                      f"rank_{checkpoint.rank}/{os.path.basename(checkpoint.path)}")
            continue
        settled.append(checkpoint)
    return settled


def _map(func: Callable[[List[T]], R], items: List[T], parallel: bool) -> List[R]:
    """``func`` over ``items`` in order: in one call, or over about four batches per scan thread
    from a pool (one task per item would cost the pool more bookkeeping than a system call)."""
    if not items:
        return []
    if not parallel:
        return [func(items)]
    size = -(-len(items) // (SCAN_THREADS * 4))
    with ThreadPoolExecutor(max_workers=SCAN_THREADS, thread_name_prefix="ckpt-scan") as pool:
        return list(pool.map(func, [items[i:i + size] for i in range(0, len(items), size)]))


def _drop_ambiguous(checkpoints: List[Checkpoint], notes: Notes) -> List[Checkpoint]:
    """Remove every checkpoint sharing its rank, kind and (epoch, step) with another one.

    Two files for one step (e.g. MindSpore's ``prefix_1-`` files from a rerun) cannot both be the
    state at that step, and nothing in the names says which is.
    """
    if len({(ckpt.rank, ckpt.kind, ckpt.key) for ckpt in checkpoints}) == len(checkpoints):
        return checkpoints  # the usual case, before every restart for each rank that saved
    counts: Dict[Tuple[int, str, Tuple[int, int]], int] = {}
    for ckpt in checkpoints:
        ident = (ckpt.rank, ckpt.kind, ckpt.key)
        counts[ident] = counts.get(ident, 0) + 1
    kept = []
    for ckpt in checkpoints:
        if counts[(ckpt.rank, ckpt.kind, ckpt.key)] > 1:
            notes.add("files naming the same step as another file of their rank ignored",
                      f"rank_{ckpt.rank}/{os.path.basename(ckpt.path)}")
        else:
            kept.append(ckpt)
    return kept


def list_rank_dirs(checkpoint_dir: str, world_size: int, notes: Notes) -> Dict[int, str]:
    """``rank -> directory`` for the ``rank_<r>`` entries of the checkpoint directory."""
    with os.scandir(checkpoint_dir) as it:
        entries = sorted((entry.name, entry.is_dir()) for entry in it)
    dirs = {}
    for name, is_dir in entries:
        match = _RANK_DIR.fullmatch(name)
        if name in (REPORTS_DIR, DCP_DIR, MANIFESTS_DIR, CONVERTED_DIR) and is_dir:
            continue  # saves reported (ckptreports.py), DCP steps, step manifests, conversions (reshard.py)
        if not (match and is_dir):
            notes.add(UNEXPECTED, name)
        elif int(match.group(1)) >= world_size:
            notes.add(f"rank directories beyond world size {world_size} ignored", name)
        else:
            dirs[int(match.group(1))] = os.path.join(checkpoint_dir, name)
    return dirs


def scan_checkpoints(checkpoint_dir: str, world_size: int,
                     patterns: Sequence[CheckpointPattern] = DEFAULT_PATTERNS,
                     settle_seconds: float = DEFAULT_SETTLE_SECONDS) -> ScanResult:
    """The complete checkpoints of every rank. Never raises for file-system problems.

    Args:
        checkpoint_dir: the directory holding ``rank_<r>/``. A missing directory means no checkpoints.
        world_size: number of ranks; other ``rank_<r>`` directories are ignored with a warning.
        patterns: from :func:`compile_patterns`.
        settle_seconds: the interval between the two looks at each file; 0 skips the second look.

    Returns:
        Per rank, its complete checkpoints sorted by kind, (epoch, step) and path.
    """
    notes = Notes()
    try:
        dirs = list_rank_dirs(checkpoint_dir, world_size, notes)
    except OSError as exc:
        return unreadable_root(checkpoint_dir, world_size, exc)

    def scan(ranks: List[int]) -> Tuple[List[Candidate], Notes]:
        batch_notes, found = Notes(), []  # per batch: no shared state between the threads
        for rank in ranks:
            found.extend(scan_rank(rank, dirs[rank], patterns, batch_notes))
        return found, batch_notes

    results, parallel = probed_map(scan, sorted(dirs))
    candidates: List[Candidate] = []
    for found, batch_notes in results:
        candidates.extend(found)
        notes.merge(batch_notes)
    return finish_scan(world_size, settle(candidates, settle_seconds, notes, parallel), notes)


def unreadable_root(checkpoint_dir: str, world_size: int, exc: OSError) -> ScanResult:
    """The scan result when the checkpoint directory itself cannot be listed: no checkpoints."""
    if isinstance(exc, FileNotFoundError):
        # Normal for a job's first start; the plan's reason says it, since it is also what a mistyped
        # path does.
        return ScanResult(tuple(() for _ in range(world_size)), absent=f"{checkpoint_dir} does not exist yet")
    return ScanResult(tuple(() for _ in range(world_size)),
                      (f"checkpoints: {checkpoint_dir} is unreadable: {exc}",))


def probed_map(func: Callable[[List[T]], R], ranks: List[T], probe: bool = True) -> Tuple[List[R], bool]:
    """``func`` over batches of ``ranks``: the first ``PROBE_RANKS`` in this thread, timed; the rest
    from the thread pool when those were slow (a shared file system). Returns the results and
    whether the file system was found slow. Without ``probe`` (a file system known to be local) all
    run in this thread: there threads only contend for the GIL, and a probe timed while the CPUs
    are busy would take a loaded machine for a slow file system."""
    if not probe:
        return _map(func, ranks, False), False
    began = time.monotonic()
    results = _map(func, ranks[:PROBE_RANKS], False)
    parallel = len(ranks) > PROBE_RANKS and time.monotonic() - began > SLOW_RANK_SECONDS * PROBE_RANKS
    return results + _map(func, ranks[PROBE_RANKS:], parallel), parallel


def finish_scan(world_size: int, settled: List[Checkpoint], notes: Notes) -> ScanResult:
    """The scan result from the settled checkpoints of ranks below ``world_size``: ambiguous steps
    dropped, each rank's checkpoints sorted by kind, (epoch, step) and path."""
    per_rank: List[List[Checkpoint]] = [[] for _ in range(world_size)]
    for ckpt in settled:
        per_rank[ckpt.rank].append(ckpt)
    ordered = tuple(rank_checkpoints(items, notes) for items in per_rank)
    logger.debug("%d complete checkpoints of %d ranks", sum(len(items) for items in ordered), world_size)
    return ScanResult(ordered, notes.lines())


def rank_checkpoints(settled: List[Checkpoint], notes: Notes) -> Tuple[Checkpoint, ...]:
    """One rank's settled checkpoints as the scan reports them: ambiguous steps dropped, sorted by
    kind, (epoch, step) and path."""
    return tuple(sorted(_drop_ambiguous(settled, notes), key=lambda c: (c.kind, c.key, c.path)))
