"""Fault ranks: merged from the cluster's reports, the previous attempt and the command line.

Sources (docs/ascend-reference.md section 3):

* ``fault-npus`` (the ``fault-config-<job>`` ConfigMap): ``{"status": "initializing"}`` (no faults
  yet), ``{"FaultRankIds": ["0", "3"], "CreatTime": ...}`` (either time spelling) or
  ``{"FaultRank": [0, 3], "UpdateTime": ...}``; the time and ``checkCode`` keys are not needed to know
  which ranks are faulty now, so they are ignored.
* ``reset.json`` (the ``reset-config-<job>`` ConfigMap): ``RankList`` entries whose ``Status`` is
  ``unrecovered``, ``fault`` or ``failed``.
* The ranks that failed in this launcher's previous attempt.
* ``--fault-ranks``.

A report that cannot be read or makes no sense (bad JSON, rank ids out of range) is not trusted: its
usable ids are still merged, and the plan refuses breakpoint restore, because a faulty rank it failed
to name could otherwise be chosen as a source.
"""

import logging
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from launcher.common.errors import UsageError
from launcher.common.inputfiles import LIMIT_REPORT, InputFileError, brief, read_json
from launcher.jobspec.options import DEFAULT_FAULT_NPUS, DEFAULT_RESET_JSON
from launcher.cluster.resetjson import FAULT_STATUSES, HEALTHY_STATUSES, int_rank, parse_reset

logger = logging.getLogger(__name__)

DEFAULT_FAULT_NPUS_PATH = DEFAULT_FAULT_NPUS
DEFAULT_RESET_JSON_PATH = DEFAULT_RESET_JSON

SOURCE_FAULT_NPUS = "fault-npus"
SOURCE_RESET_JSON = "reset.json"
SOURCE_PREVIOUS = "previous attempt"
SOURCE_OPTION = "--fault-ranks"


@dataclass(frozen=True)
class FaultReport:
    """The merged fault ranks.

    Attributes:
        ranks: every rank reported faulty by any source.
        origins: ``(rank, (source, ...))`` pairs, sorted, saying who reported each rank.
        warnings: one line per source that was unreadable or inconsistent.
        trusted: False when a source could not be fully read, so some faulty rank may be unknown.
    """

    ranks: FrozenSet[int]
    origins: Tuple[Tuple[int, Tuple[str, ...]], ...]
    warnings: Tuple[str, ...]
    trusted: bool


def parse_fault_npus(payload: Any) -> List[int]:
    """Fault rank ids from a parsed ``fault-npus`` payload of any generation.

    Raises:
        ValueError: the payload has none of the known shapes or a rank id is not an integer.
    """
    if not isinstance(payload, dict):
        raise ValueError("expected a JSON object")
    if "FaultRankIds" in payload:
        ids = payload["FaultRankIds"]
    elif "FaultRank" in payload:
        ids = payload["FaultRank"]
    elif payload.get("status") == "initializing":
        return []
    else:
        raise ValueError("no FaultRankIds or FaultRank key and status is not 'initializing'")
    if ids is None:
        return []
    if not isinstance(ids, list):
        raise ValueError("the fault rank list is not a JSON array")
    return [int_rank(value) for value in ids]


def parse_reset_json(payload: Any) -> Tuple[List[int], List[str]]:
    """Fault rank ids from a parsed ``reset.json`` (parsed by ``launcher.cluster.resetjson``, the one reader).

    Returns:
        The ranks whose status marks them faulty, plus those with an unknown status (a rank of
        unknown health is not a safe restore source), and notes about the latter.

    Raises:
        ValueError: the payload's shape is wrong or a rank id is not an integer.
    """
    state = parse_reset(payload)
    ranks, notes = [], []
    for rank, status in state.statuses:
        if status in FAULT_STATUSES:
            ranks.append(rank)
        elif status not in HEALTHY_STATUSES:
            ranks.append(rank)
            notes.append(f"rank {rank} has unknown status {status!r}; treated as faulty")
    return ranks, notes


def _read_json(path: str, what: str) -> Optional[Any]:
    """Parsed JSON of ``path``, or None when the file does not exist (not on a cluster).

    Raises:
        OSError: unreadable.
        InputFileError: not a regular file, too big, not UTF-8, too deep, empty or not JSON.
    """
    try:
        return read_json(path, what, LIMIT_REPORT)
    except FileNotFoundError:
        logger.debug("no fault report at %s", path)
        return None


class _Merger:
    """Accumulates ranks per source, range-checking each against the world size."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.origins: Dict[int, Set[str]] = {}
        self.warnings: List[str] = []
        self.trusted = True

    def distrust(self, message: str) -> None:
        self.warnings.append(message)
        self.trusted = False

    def add(self, source: str, ranks: Iterable[int]) -> None:
        bad = sorted({r for r in ranks if not 0 <= r < self.world_size})
        if bad:
            self.distrust(f"{source}: rank ids {brief(bad)} are outside 0..{self.world_size - 1}; "
                          "ignored, and the report is not trusted")
        for rank in ranks:
            if 0 <= rank < self.world_size:
                self.origins.setdefault(rank, set()).add(source)

    def read(self, source: str, path: Optional[str], parse) -> None:
        if path is None:
            return
        try:
            payload = _read_json(path, source)
            if payload is not None:
                self.add(source, parse(payload))
        except InputFileError as exc:  # already names the file
            self.distrust(f"{exc}; the report is not trusted")
        except (OSError, ValueError) as exc:
            self.distrust(f"{source} ({path}) is unreadable: {exc}")

    def report(self) -> FaultReport:
        origins = tuple((rank, tuple(sorted(self.origins[rank]))) for rank in sorted(self.origins))
        return FaultReport(ranks=frozenset(self.origins), origins=origins,
                           warnings=tuple(self.warnings), trusted=self.trusted)


def collect_faults(world_size: int, fault_npus_path: Optional[str], reset_json_path: Optional[str],
                   extra_fault_ranks: Iterable[int] = (),
                   previous_failed_ranks: Iterable[int] = ()) -> FaultReport:
    """Merge every fault source into one report. Never raises for bad file contents.

    Args:
        world_size: number of ranks; valid ids are ``0..world_size-1``.
        fault_npus_path: the ``fault-npus`` file, or None to skip it. A missing file means no faults.
        reset_json_path: the ``reset.json`` file, or None to skip it. A missing file means no faults.
        extra_fault_ranks: ranks the user named (``--fault-ranks``).
        previous_failed_ranks: ranks that failed in the launcher's previous attempt.

    Raises:
        UsageError: a rank in ``extra_fault_ranks`` is out of range (the user's option mistake).
    """
    extra = list(extra_fault_ranks)
    bad = sorted({r for r in extra if not 0 <= r < world_size})
    if bad:
        raise UsageError(f"--fault-ranks: {bad} outside 0..{world_size - 1}")
    merger = _Merger(world_size)
    merger.read(SOURCE_FAULT_NPUS, fault_npus_path, parse_fault_npus)

    def reset_ranks(payload: Any) -> List[int]:
        ranks, notes = parse_reset_json(payload)
        merger.warnings.extend(f"{SOURCE_RESET_JSON}: {note}" for note in notes)
        return ranks

    merger.read(SOURCE_RESET_JSON, reset_json_path, reset_ranks)
    merger.add(SOURCE_PREVIOUS, list(previous_failed_ranks))
    merger.add(SOURCE_OPTION, extra)
    return merger.report()
