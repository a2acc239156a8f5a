"""The checkpoint index's records (:mod:`launcher.restore.ckptindex`): one per rank directory, and the
per-rank lists the index's scan hands the planner.

The index lives as long as the launcher and holds tens of thousands of objects: every object a save
round leaves behind is one more for the cyclic garbage collector to traverse, in whichever thread
allocates next, the plan before a restart included (issue #19). So what did not change is kept, not
rebuilt: a listing's unchanged candidates, a rank's unchanged per-kind dicts, one shared empty
:class:`Notes`, and the scan's lists updated only for the ranks that changed.
"""

from typing import Dict, List, Optional, Set, Tuple

from launcher.restore.checkpoints import Candidate, Checkpoint, Notes
from launcher.restore.ckptnames import KindIndex, StepIndex
from launcher.restore.ckptreports import DirStamp

Key = Tuple[int, int]
NO_KINDS: KindIndex = ({}, {})  # shared by every rank without checkpoints; never written to
QUIET = Notes()  # shared by every entry with nothing to say; never written to


class RankEntry:
    """What the last listing of one rank directory found, and its result once every file settled."""

    __slots__ = ("path", "stamp", "candidates", "list_notes", "notes", "result", "kinds", "reported")

    def __init__(self, path: str):
        self.path = path
        self.reported: Dict[str, Optional[int]] = {}  # the rank's reports the candidates account for
        self.stamp: DirStamp = None
        self.candidates: List[Candidate] = []
        self.list_notes = self.notes = QUIET  # of the listing; of the listing and the result
        self.result: Optional[Tuple[Checkpoint, ...]] = None
        self.kinds: KindIndex = NO_KINDS  # by_kind(result), kept for the planner


class View:
    """The scan result's per-rank lists as of the last scan, and the ranks changed since.

    It also counts, per kind, how many ranks hold each ``(epoch, step)``: the planner needs every
    step of the world newest first, a union of 16,384 dicts per plan otherwise.
    """

    __slots__ = ("per_rank", "by_kind", "noted", "changed", "counts")

    def __init__(self, world_size: int):
        self.per_rank: List[Tuple[Checkpoint, ...]] = [()] * world_size
        # Per kind (breakpoint, periodic), each rank's ``(epoch, step) -> checkpoint``: what the planner takes.
        self.by_kind: Tuple[List[StepIndex], List[StepIndex]] = ([NO_KINDS[0]] * world_size,
                                                                 [NO_KINDS[1]] * world_size)
        self.noted: Set[int] = set()  # ranks whose entry has notes (warnings)
        self.changed: Set[int] = set()  # ranks whose entry changed since the lists were updated
        self.counts: Tuple[Dict[Key, int], Dict[Key, int]] = ({}, {})  # per kind: step -> ranks having it

    def set_kinds(self, rank: int, kinds: KindIndex) -> None:
        """Record ``rank``'s per-kind dicts, keeping :attr:`counts` in step."""
        for kind, counts in enumerate(self.counts):
            old = self.by_kind[kind][rank]
            if old is kinds[kind]:
                continue  # the index keeps an unchanged dict (same_kinds): nothing to count
            self.by_kind[kind][rank] = kinds[kind]
            for key in old:
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]
            for key in kinds[kind]:
                counts[key] = counts.get(key, 0) + 1

    def scan_kinds(self) -> Tuple[Tuple[StepIndex, ...], Tuple[StepIndex, ...]]:
        """``ScanResult.kinds``: per kind, each rank's dict."""
        return tuple(self.by_kind[0]), tuple(self.by_kind[1])

    def keys(self) -> Tuple[Tuple[Key, ...], Tuple[Key, ...]]:
        """Per kind (breakpoint, periodic), every step some rank holds, newest first."""
        return tuple(sorted(self.counts[0], reverse=True)), tuple(sorted(self.counts[1], reverse=True))


def kept(old: List[Candidate], new: List[Candidate]) -> List[Candidate]:
    """``new`` (a listing), with each candidate equal to one in ``old`` replaced by that one."""
    if not old:
        return new
    by_path = {candidate.checkpoint.path: candidate for candidate in old}
    return [same if (same := by_path.get(c.checkpoint.path)) == c else c for c in new]


def same_kinds(old: KindIndex, new: KindIndex) -> KindIndex:
    """``new``, reusing ``old`` and its dicts where they are equal: the planner may take an identical
    entry as unchanged (only a hint: equal content is what matters)."""
    breakpoints = old[0] if old[0] == new[0] else new[0]
    periodics = old[1] if old[1] == new[1] else new[1]
    if breakpoints is old[0] and periodics is old[1]:
        return old
    return (breakpoints, periodics)
