"""What checkpoint files are called and what they hold: the patterns, the :class:`Checkpoint`
record, the classification of one file name, and the optional digest sidecar.

The scan (:mod:`launcher.restore.checkpoints`), the index (:mod:`launcher.restore.ckptindex`) and
the rank-reported saves (:mod:`launcher.restore.ckptreports`) classify names with the same
:func:`classify_name`, so they agree on what is a checkpoint.
"""

import hashlib
import os
import re
import string
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Pattern, Sequence, Tuple

from launcher.common.errors import UsageError
from launcher.common.inputfiles import open_regular, read_line

KIND_PERIODIC = "periodic"
KIND_BREAKPOINT = "breakpoint"
KIND_EXIT = "exit"
DEFAULT_SETTLE_SECONDS = 0.05
TEMP_SUFFIXES = (".tmp", ".part")
DIGEST_SUFFIX = ".sha256"  # <checkpoint>.sha256: "<hex digest>  <file name>", written before the file
SIDE_FILE_SUFFIXES = (".meta", ".mindir", DIGEST_SUFFIX)  # MindSpore's graph meta and exported model, digests
UNEXPECTED = "unexpected names ignored"


@dataclass(frozen=True)
class CheckpointPattern:
    """How checkpoint files are named.

    Attributes:
        regex: matched against the whole file name.
        marker: completion-marker file name template (``str.format`` with ``name`` = the checkpoint's
            file name and the regex's named groups), or None when the file alone proves completion.
        kind: a fixed kind (``exit``), or None to derive periodic/breakpoint from the match.
    """

    regex: Pattern[str]
    marker: Optional[str] = None
    kind: Optional[str] = None


DEFAULT_PATTERNS = (
    CheckpointPattern(re.compile(
        r"(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)(?P<breakpoint>_breakpoint)?\.ckpt")),
    CheckpointPattern(re.compile(
        r"ckpt-(?P<epoch>\d+)_(?P<step>\d+)(?P<breakpoint>_breakpoint)?\.pt")),
    CheckpointPattern(re.compile(r"(?P<name>.+)_train\.ckpt"), kind=KIND_EXIT),
)


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint file of one rank."""

    rank: int
    path: str
    kind: str
    epoch: Optional[int]
    step: int
    size: int
    #: Order of recency: ``(epoch, step)``, a missing epoch counting as 0. Set once here: the planner
    #: reads it several times per file, and a ``cached_property`` would give each of the index's
    #: 49k checkpoints an instance dict for the garbage collector to traverse.
    key: Tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.epoch or 0, self.step))


@dataclass(frozen=True)
class ScanResult:
    """Complete checkpoints per rank (index = rank) and what was ignored, and why.

    ``absent`` says why there was nothing to scan when that is normal (a job's first start, before
    the directory exists): not a warning, the plan's reason.
    """

    checkpoints: Tuple[Tuple[Checkpoint, ...], ...]
    warnings: Tuple[str, ...] = ()
    absent: str = ""
    #: Breakpoints and periodics: per rank, ``by_kind`` of its checkpoints, when the producer kept it
    #: (the index does, per rank, so the planner does not rebuild 16,384 ranks' dicts before every
    #: restart); derived data.
    kinds: Optional[Tuple[Tuple["StepIndex", ...], Tuple["StepIndex", ...]]] = field(
        default=None, compare=False, repr=False)
    #: With ``kinds``: per kind (breakpoint, periodic), every ``(epoch, step)`` of some rank, newest first.
    keys: Optional[Tuple[Tuple[Tuple[int, int], ...], Tuple[Tuple[int, int], ...]]] = field(
        default=None, compare=False, repr=False)


StepIndex = Dict[Tuple[int, int], Checkpoint]
KindIndex = Tuple[StepIndex, StepIndex]


def by_kind(items: Sequence[Checkpoint]) -> KindIndex:
    """One rank's checkpoints as ``(breakpoints, periodics)``, each ``(epoch, step) -> checkpoint``
    (keys are unique per kind once the scan dropped ambiguous steps). Read-only for its users."""
    on_break: Dict[Tuple[int, int], Checkpoint] = {}
    on_period: Dict[Tuple[int, int], Checkpoint] = {}
    for ckpt in items:
        (on_break if ckpt.kind == KIND_BREAKPOINT else on_period)[ckpt.key] = ckpt
    return on_break, on_period


def compile_patterns(pattern: Optional[str],
                     marker: Optional[str] = None) -> Tuple[CheckpointPattern, ...]:
    """The patterns to scan with: the user's single regex, or the defaults.

    Args:
        pattern: a regex with a named group ``step`` (and optionally ``epoch``, ``breakpoint``).
        marker: completion-marker template, e.g. ``{name}.done``; with the defaults it applies to all.

    Raises:
        UsageError: the regex does not compile, lacks a ``step`` group, or the marker template names
            a field the regex does not define, formats a field, or points outside the rank directory.
    """
    patterns = DEFAULT_PATTERNS if pattern is None else (CheckpointPattern(_user_regex(pattern)),)
    if marker is None:
        return tuple(patterns)
    _check_marker(marker, patterns)
    return tuple(CheckpointPattern(p.regex, marker, p.kind) for p in patterns)


def _user_regex(pattern: str) -> Pattern[str]:
    """``--checkpoint-pattern`` compiled; UsageError when it does not compile or has no ``step``."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--checkpoint-pattern {pattern!r} is not a valid regex: {exc}") from exc
    if "step" not in regex.groupindex:
        raise UsageError(f"--checkpoint-pattern {pattern!r} has no named group (?P<step>...)")
    return regex


def _check_marker(marker: str, patterns: Sequence[CheckpointPattern]) -> None:
    """UsageError when ``--checkpoint-marker`` points outside the rank directory, formats a field,
    or names a field one of ``patterns`` (other than a fixed-kind one) does not define."""
    if "/" in marker or marker.startswith("."):
        raise UsageError(f"--checkpoint-marker {marker!r} must be a plain name in the rank directory")
    parsed = [item for item in string.Formatter().parse(marker) if item[1] is not None]
    if any(spec or conversion for _, _, spec, conversion in parsed):
        # Every field is substituted as the matched text; a spec like {step:08d} would fail later.
        raise UsageError(f"--checkpoint-marker {marker!r}: fields take no format spec or conversion")
    fields = {field for _, field, _, _ in parsed}
    for item in patterns:
        unknown = fields - set(item.regex.groupindex) - {"name"}
        if unknown and item.kind is None:
            raise UsageError(f"--checkpoint-marker {marker!r} uses {sorted(unknown)}, which the "
                             f"pattern {item.regex.pattern!r} does not define")


def verify_digest(path: str) -> Optional[bool]:
    """Check ``path`` against its ``<path>.sha256`` sidecar: True if it matches, False if it does not
    (or the file cannot be read), None when there is no (readable, well-formed) sidecar."""
    try:
        expected = (read_line(path + DIGEST_SUFFIX, "checkpoint digest") or "").split()[0].lower()
    except (OSError, ValueError, IndexError):  # InputFileError is a ValueError (FIFO, too big, not text)
        return None
    if len(expected) != 64 or any(ch not in "0123456789abcdef" for ch in expected):
        return None
    digest = hashlib.sha256()
    try:
        with os.fdopen(open_regular(path, "checkpoint"), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except (OSError, ValueError):
        return False
    return digest.hexdigest() == expected


def classify_name(name: str, patterns: Sequence[CheckpointPattern], names: FrozenSet[str]
              ) -> Tuple[str, Optional[Tuple[str, Optional[int], int, Optional[str]]]]:
    """Classify one file name of a rank directory.

    Returns:
        ``("", (kind, epoch, step, marker))`` for a checkpoint, else ``(reason, None)``: the reason it
        is ignored (``UNEXPECTED`` when no pattern matched, ``""`` for known side files).
    """
    if name.startswith(".") or name.endswith(TEMP_SUFFIXES):
        return "temporary files (writes in progress or abandoned) ignored", None
    if name.endswith(SIDE_FILE_SUFFIXES):
        return "", None
    for pattern in patterns:
        match = pattern.regex.fullmatch(name)
        if not match:
            continue
        if pattern.kind == KIND_EXIT:
            return "graceful-exit checkpoints not used (their names carry no step)", None
        groups = match.groupdict()
        marker = pattern.marker.format(name=name, **groups) if pattern.marker else None
        if marker is not None and marker not in names:
            return "checkpoints without their completion marker ignored", None
        kind = KIND_BREAKPOINT if groups.get("breakpoint") else KIND_PERIODIC
        epoch = int(groups["epoch"]) if groups.get("epoch") else None
        return "", (kind, epoch, int(groups["step"]), marker)
    return UNEXPECTED, None
