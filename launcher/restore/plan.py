"""The restore plan: what every rank resumes from, as data, JSON, environment and a table."""

import json
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Dict, List, Optional, Tuple

from launcher.common import envnames
from launcher.restore.mstransform import TransformJob

KIND_BREAKPOINT = "breakpoint"
KIND_PERIODIC = "periodic"
KIND_NONE = "none"
NO_RESTORE = "-1"
PLAN_FORMAT_VERSION = 1
# Linux refuses execve() when one "NAME=value" string exceeds MAX_ARG_STRLEN (32 pages).
ENV_STRING_LIMIT = 131072


def restore_map_json(mapping: Dict[str, int]) -> str:
    """The vendor's ``RESTORE_RANKS_MAP`` JSON, compact to stay under the environment limit."""
    return json.dumps(mapping, separators=(",", ":"))


def fits_env(name: str, value: str) -> bool:
    """Whether ``name=value`` can be passed to a child process."""
    return len(name) + 1 + len(value.encode("utf-8")) + 1 <= ENV_STRING_LIMIT


@dataclass(frozen=True)
class Conversion:
    """How a step written by one world is resumed by another (docs/resharding.md).

    Attributes:
        format: ``dcp`` or ``mindspore``.
        source: what was written: the DCP step directory, or the MindSpore checkpoint directory.
        source_world_size: ranks that wrote it.
        target_world_size: ranks that resume.
        source_layout: ``dp=4 tp=1 pp=1`` it was written with, or ``""`` when unknown.
        target_layout: the current layout, or ``""`` when not given.
        known_from: where ``source_world_size`` came from (manifest, shard names, strategy file).
        method: one line: what is done.
        output: the converted checkpoints' directory when the launcher converts (MindSpore), else None.
    """

    format: str
    source: str
    source_world_size: int
    target_world_size: int
    source_layout: str
    target_layout: str
    known_from: str
    method: str
    output: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """The plan record's ``conversion`` object."""
        return dict(self.__dict__)

    def summary(self) -> str:
        """``4 -> 2 ranks (dp=4 tp=1 pp=1 -> dp=2 tp=1 pp=1)``; the layouts that are known."""
        text = f"{self.source_world_size} -> {self.target_world_size} ranks"
        if self.source_layout and self.target_layout:
            return text + f" ({self.source_layout} -> {self.target_layout})"
        if self.source_layout or self.target_layout:
            return text + (f" (written as {self.source_layout})" if self.source_layout
                           else f" (now {self.target_layout})")
        return text


@dataclass(frozen=True)
class RestorePlan:
    """The outcome of restore planning; identical on every node given the same inputs.

    Attributes:
        world_size: number of ranks.
        kind: ``breakpoint`` (dying-gasp checkpoints, ``RESTORE_RANKS`` lists the sources),
            ``periodic`` (``RESTORE_RANKS=-1``; periodic checkpoints) or ``none`` (nothing to resume).
        reason: one line saying why this kind was chosen.
        epoch: the epoch every rank resumes from, when the names carry one.
        step: the step every rank resumes from (None for ``none``).
        groups: the replica groups used, sorted.
        groups_source: where the groups came from.
        fault_ranks: the merged fault ranks, sorted.
        fault_origins: ``(rank, (source, ...))`` for each fault rank.
        sources: per rank (index = rank), the rank whose checkpoint it loads; empty for ``none``.
        files: ``(source rank, checkpoint path)`` pairs, sorted.
        warnings: why inputs were ignored and plans fell back.
        dcp_dir: the global ``torch.distributed.checkpoint`` step directory every rank loads (then
            ``sources`` and ``files`` are empty), or None for per-rank checkpoints.
        saved_world_size: the number of ranks that wrote the chosen step, when known.
        conversion: how a step written by another world or layout is resumed; None when the world
            is the one it was written with (or that is unknown).
        transform: the MindSpore conversion the launcher runs before the ranks start (each rank
            loads ``transform.file_for(rank)``), or None.
    """

    world_size: int
    kind: str
    reason: str
    epoch: Optional[int]
    step: Optional[int]
    groups: Tuple[Tuple[int, ...], ...]
    groups_source: str
    fault_ranks: Tuple[int, ...]
    fault_origins: Tuple[Tuple[int, Tuple[str, ...]], ...]
    sources: Tuple[int, ...]
    files: Tuple[Tuple[int, str], ...]
    warnings: Tuple[str, ...] = ()
    dcp_dir: Optional[str] = None
    saved_world_size: Optional[int] = None
    conversion: Optional[Conversion] = None
    transform: Optional[TransformJob] = None

    @cached_property
    def restore_ranks(self) -> Tuple[int, ...]:
        """The breakpoint source ranks, sorted; empty unless ``kind`` is breakpoint."""
        return tuple(sorted(set(self.sources))) if self.kind == KIND_BREAKPOINT else ()

    @cached_property
    def restore_ranks_map(self) -> Dict[str, int]:
        """``{"0,8,16": 8, ...}``: each replica group (ranks joined by commas) to its source."""
        if self.kind != KIND_BREAKPOINT:
            return {}
        return dict(zip(_group_names(self.groups), (self.sources[group[0]] for group in self.groups)))

    @cached_property
    def _group_of(self) -> Tuple[Tuple[int, ...], ...]:
        owner: list = [()] * self.world_size
        for group in self.groups:
            for rank in group:
                owner[rank] = group
        return tuple(owner)

    @cached_property
    def _env_values(self) -> Tuple[str, str]:
        ranks = ",".join(str(r) for r in self.restore_ranks) or NO_RESTORE
        return ranks, restore_map_json(self.restore_ranks_map)

    @cached_property
    def full_env_maps(self) -> bool:
        """False when the whole-world ``RESTORE_RANKS``/``RESTORE_RANKS_MAP`` values are too long
        for the environment, so each rank gets only its own group's part of them."""
        ranks, mapping = self._env_values
        return fits_env(envnames.RESTORE_RANKS, ranks) and fits_env(envnames.RESTORE_RANKS_MAP,
                                                                     mapping)

    @cached_property
    def _paths(self) -> Dict[int, str]:
        return dict(self.files)

    def env_for(self, rank: int) -> Dict[str, str]:
        """The environment variables for one rank; empty when it has nothing to resume from.

        Raises:
            ValueError: ``rank`` is outside ``0..world_size-1``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        if self.kind == KIND_NONE:
            return {}
        if self.dcp_dir is not None or self.transform is not None:
            return self._global_env(rank)
        source = self.sources[rank]
        restore_ranks, restore_map = self._env_values
        if not self.full_env_maps and self.kind == KIND_BREAKPOINT:
            group = self._group_of[rank]
            restore_ranks = str(source)
            restore_map = restore_map_json({_join(group): source})
        return {
            envnames.RESTORE_RANKS: restore_ranks,
            envnames.RESTORE_RANKS_MAP: restore_map,
            envnames.LAUNCHER_RESUME_SOURCE_RANK: str(source),
            envnames.LAUNCHER_RESUME_CHECKPOINT: self._paths[source],
            envnames.LAUNCHER_RESUME_STEP: str(self.step),
            envnames.LAUNCHER_RESUME_KIND: self.kind,
        }

    def _global_env(self, rank: int) -> Dict[str, str]:
        """A rank's variables for a step no single source rank holds: the one global DCP directory,
        or the rank's file converted for this world."""
        env = {envnames.RESTORE_RANKS: NO_RESTORE, envnames.RESTORE_RANKS_MAP: restore_map_json({}),
               envnames.LAUNCHER_RESUME_STEP: str(self.step), envnames.LAUNCHER_RESUME_KIND: self.kind}
        if self.transform is not None:
            env[envnames.LAUNCHER_RESUME_CHECKPOINT] = self.transform.file_for(rank)
        else:
            env[envnames.LAUNCHER_RESUME_CHECKPOINT] = env[envnames.LAUNCHER_RESUME_DCP_DIR] = self.dcp_dir
        if self.saved_world_size is not None:
            env[envnames.LAUNCHER_RESUME_SAVED_WORLD_SIZE] = str(self.saved_world_size)
        return env

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict for the run directory and ``events.jsonl``."""
        return {
            "version": PLAN_FORMAT_VERSION,
            "kind": self.kind,
            "reason": self.reason,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "step": self.step,
            "restore_ranks": list(self.restore_ranks),
            "restore_ranks_map": dict(self.restore_ranks_map),
            "fault_ranks": list(self.fault_ranks),
            "fault_origins": {str(rank): list(origin) for rank, origin in self.fault_origins},
            "groups_source": self.groups_source,
            "groups": [list(group) for group in self.groups],
            "sources": list(self.sources),
            "checkpoints": {str(rank): path for rank, path in self.files},
            "full_env_maps": self.full_env_maps,
            "warnings": list(self.warnings),
            "dcp_dir": self.dcp_dir,
            "saved_world_size": self.saved_world_size,
            "conversion": None if self.conversion is None else self.conversion.to_json(),
            "transform": None if self.transform is None else self.transform.to_json(),
        }

    def format_table(self) -> str:
        """A human-readable summary with one row per replica group."""
        lines = [self._headline(), f"  {self.reason}"]
        if self.kind != KIND_NONE:
            lines.append(f"  {envnames.RESTORE_RANKS}={_shorten(self._env_values[0])}")
        lines.append(f"  fault ranks: {self._faults_text()}")
        if self.dcp_dir is not None:
            lines.append(f"  every rank loads the DCP checkpoint {self.dcp_dir}")
        if self.conversion is not None:
            lines.append(f"  resharding {self.conversion.summary()}: {self.conversion.method}")
            if self.conversion.output:
                lines.append(f"  converted checkpoints: {self.conversion.output}")
        lines.append(f"  replica groups: {len(self.groups)}, from {self.groups_source}")
        if self.dcp_dir is not None or self.transform is not None:
            return self._with_warnings(lines)
        rows = [("GROUP", "FAULTY", "SOURCE", "CHECKPOINT")]
        faults = set(self.fault_ranks)
        for group in self.groups:
            faulty = ",".join(str(r) for r in group if r in faults) or "-"
            rows.append((_shorten(_join(group)), faulty) + self._group_sources(group))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines.append("")
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row[:3], widths)] + [row[3]]
            lines.append("  ".join(cells).rstrip())
        return self._with_warnings(lines)

    def _with_warnings(self, lines: List[str]) -> str:
        if self.warnings:
            lines.append("")
            lines.append("warnings:")
            lines.extend(f"  - {warning}" for warning in self.warnings)
        return "\n".join(lines)

    def _headline(self) -> str:
        if self.kind == KIND_NONE:
            return "Restore plan: nothing to resume from (fresh start)"
        at = f"step {self.step}" if self.epoch is None else f"epoch {self.epoch} step {self.step}"
        return f"Restore plan: {self.kind} restore from {at}"

    def _faults_text(self) -> str:
        if not self.fault_origins:
            return "none"
        return ", ".join(f"{rank} ({', '.join(origin)})" for rank, origin in self.fault_origins)

    def _group_sources(self, group: Tuple[int, ...]) -> Tuple[str, str]:
        """The SOURCE and CHECKPOINT cells of one group's row."""
        if self.kind == KIND_NONE:
            return "-", "-"
        borrowed = [f"{r}<-{self.sources[r]}" for r in group if self.sources[r] != r]
        if self.kind == KIND_BREAKPOINT:
            source = str(self.sources[group[0]])
        elif not borrowed:
            source = "own"
        else:
            source = _shorten(" ".join(borrowed))
        return source, os.path.basename(self._paths[self.sources[group[0]]])


def _join(group: Tuple[int, ...]) -> str:
    return ",".join(str(rank) for rank in group)


# The groups rarely change between plans (the same tuple when they come from a layout): their
# names are joined once, not 16,384 ranks' worth per plan.
@lru_cache(maxsize=4)
def _group_names(groups: Tuple[Tuple[int, ...], ...]) -> Tuple[str, ...]:
    return tuple(_join(group) for group in groups)


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
