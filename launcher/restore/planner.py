"""Compute the restore plan: which checkpoint every rank resumes from.

1. Breakpoint restore. For each replica group, ``usable = group - fault ranks``. The newest
   ``(epoch, step)`` at which every group has a usable rank with a complete breakpoint checkpoint is
   chosen; each group's source is its lowest usable rank that has one; the usable ranks' breakpoint
   files at that step must have one size per group (replicas are byte-identical). When the fault
   reports could not be fully read, breakpoint restore is off: an unnamed faulty rank could be chosen.
2. Periodic restore (``RESTORE_RANKS=-1``): the newest ``(epoch, step)`` at which every group has a
   complete periodic checkpoint on some rank. A rank loads its own file, except that a faulty rank
   prefers a healthy replica's and a rank without one borrows a replica's (healthy ones first), which
   requires the group's files at that step to have one size.
3. Breakpoint wins unless it is older than the periodic choice (stale dying-gasp files from an earlier
   failure must not roll training back).
4. Otherwise nothing to resume from.
5. A MindSpore step with a launcher manifest at least as new, written by another world, is converted
   for this one (with ``strategy_file``; without it its files are left out of steps 1-3).
6. A complete ``torch.distributed.checkpoint`` step under ``dcp/`` at least as new as that choice
   wins: every rank loads the one global directory, whatever world wrote it (``reshard.py``).

Every choice depends only on sorted data, never on listing order or modification times.
"""

import logging
import os
from dataclasses import dataclass, replace
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.gcpause import collector_paused
from launcher.jobspec.runspec import RestoreSpec
from launcher.restore.checkpoints import (DEFAULT_SETTLE_SECONDS, DIGEST_SUFFIX, KIND_BREAKPOINT,
                                          KIND_PERIODIC, Checkpoint, ScanResult, compile_patterns,
                                          probed_map, scan_checkpoints, verify_digest)
from launcher.restore.ckptindex import CheckpointIndex
from launcher.restore.ckptnames import by_kind
from launcher.restore.dcpsteps import newest_dcp_step
from launcher.restore.faults import FaultReport, collect_faults
from launcher.restore.groups import ReplicaGroups, resolve_groups
from launcher.restore.plan import KIND_NONE, RestorePlan
from launcher.restore.mssteps import newest_ms_step
from launcher.restore.reshard import target_layout, unconvertible, with_dcp, with_ms

logger = logging.getLogger(__name__)

Key = Tuple[int, int]
Group = Tuple[int, ...]
Index = Sequence[Dict[Key, Checkpoint]]
_EXAMPLES = 3


@dataclass(frozen=True, kw_only=True)
class PlanInputs(RestoreSpec):
    """Everything the plan is computed from: the restore options (``RestoreSpec``, the same for
    ``launcher run`` and ``launcher plan``) and the run's own facts. Paths may be None to skip that source.

    Attributes:
        world_size: number of ranks.
        previous_failed_ranks: ranks that failed in the previous attempt.
        settle_seconds: interval of the "still being written" check; 0 disables it.
    """

    world_size: int
    previous_failed_ranks: Tuple[int, ...] = ()
    settle_seconds: float = DEFAULT_SETTLE_SECONDS


@dataclass(frozen=True)
class _Choice:
    """A candidate outcome: per rank (index = rank) the checkpoint it loads."""

    kind: str
    key: Key
    picks: Tuple[Checkpoint, ...]


def compute_plan(inputs: PlanInputs, index: Optional[CheckpointIndex] = None) -> RestorePlan:
    """Read every input and compute the plan. Bad file contents only add warnings.

    Args:
        inputs: what to read.
        index: the launcher's index of the checkpoint directory; used when it indexes
            ``inputs.checkpoint_dir`` with the same patterns and settle interval, else the tree is
            scanned in full.

    Raises:
        UsageError: the options themselves are wrong (world size < 1, two group sources, a layout that
            does not match the world size, ``--fault-ranks`` out of range, a bad pattern).
    """
    with collector_paused():  # tens of thousands of short-lived containers, none in cycles
        return _compute_plan(inputs, index)


def _compute_plan(inputs: PlanInputs, index: Optional[CheckpointIndex]) -> RestorePlan:
    """:func:`compute_plan` with the collector paused."""
    if inputs.world_size < 1:
        raise UsageError(f"world size must be at least 1, not {inputs.world_size}")
    patterns = compile_patterns(inputs.checkpoint_pattern, inputs.checkpoint_marker)
    groups = resolve_groups(inputs.world_size, inputs.group_info_root, inputs.groups_file,
                            inputs.dp, inputs.tp, inputs.pp)
    faults = collect_faults(inputs.world_size, inputs.fault_npus_path, inputs.reset_json_path,
                            inputs.extra_fault_ranks, inputs.previous_failed_ranks)
    scan, ms_step, ms_warnings = None, None, ()
    verify: Callable[[int, str], Optional[bool]] = lambda _rank, path: verify_digest(path)
    if inputs.checkpoint_dir is not None:
        if index is not None and (index.root, index.patterns, index.settle_seconds) == (
                inputs.checkpoint_dir, patterns, inputs.settle_seconds):
            scan, verify = index.scan(inputs.world_size), index.verify_digest  # digests cached
        else:
            scan = scan_checkpoints(inputs.checkpoint_dir, inputs.world_size, patterns,
                                    inputs.settle_seconds)
        ms_step, ms_warnings = newest_ms_step(inputs.checkpoint_dir)
        if unconvertible(ms_step, inputs.world_size, inputs.strategy_file):
            # Its files hold another world's shards: never a per-rank source here.
            scan = _without(scan, [path for _, path in ms_step.files])
    plan = build_plan(inputs.world_size, groups, faults, scan)
    # A file that fails its digest sidecar is left out and the plan recomputed; each round removes
    # at least one file, and only the files a plan picks are read (one per replica group for a
    # breakpoint plan).
    rejected: List[str] = []
    while scan is not None:
        bad = _mismatched(plan.files, verify)
        if not bad:
            break
        rejected.extend(bad)
        scan = _without(scan, bad)
        plan = build_plan(inputs.world_size, groups, faults, scan)
    if rejected:
        names = ", ".join(os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p))
                          for p in sorted(rejected))
        plan = replace(plan, warnings=plan.warnings + (
            f"checkpoints: {len(rejected)} whose {DIGEST_SUFFIX} digest does not match ignored: {names}",))
    if inputs.checkpoint_dir is not None:
        layout = target_layout(inputs.world_size, inputs.dp, inputs.tp, inputs.pp)
        plan = with_ms(plan, ms_step, ms_warnings, inputs.checkpoint_dir, inputs.strategy_file, layout)
        plan = with_dcp(plan, *newest_dcp_step(inputs.checkpoint_dir), layout)
    logger.debug("restore plan: %s (%s)", plan.kind, plan.reason)
    return plan


def _mismatched(files: Sequence[Tuple[int, str]], verify: Callable[[int, str], Optional[bool]]) -> List[str]:
    """The paths of ``files`` whose digest check fails: in this thread, or from the scan's thread pool
    when the first checks show a slow file system (a ``stat`` of each file and sidecar, 1 ms each there)."""
    batches, _ = probed_map(lambda part: [verify(rank, path) is False for rank, path in part], list(files))
    failed = [flag for batch in batches for flag in batch]
    return [path for (_, path), flag in zip(files, failed) if flag]


def _without(scan: ScanResult, paths: Sequence[str]) -> ScanResult:
    drop = {os.path.normpath(path) for path in paths}
    return ScanResult(tuple(tuple(c for c in items if os.path.normpath(c.path) not in drop)
                            for items in scan.checkpoints),
                      scan.warnings, scan.absent)


def build_plan(world_size: int, groups: ReplicaGroups, faults: FaultReport,
               scan: Optional[ScanResult]) -> RestorePlan:
    """The plan from already-read inputs (pure: no I/O).

    Args:
        world_size: number of ranks.
        groups: a partition of ``range(world_size)``.
        faults: the merged fault ranks.
        scan: complete checkpoints per rank, or None when no checkpoint directory was given.
    """
    warnings = list(groups.warnings) + list(faults.warnings)
    base = dict(world_size=world_size, groups=groups.groups, groups_source=groups.source,
                fault_ranks=tuple(sorted(faults.ranks)), fault_origins=faults.origins)
    if scan is None:
        return RestorePlan(kind=KIND_NONE, reason="no checkpoint directory given", epoch=None,
                           step=None, sources=(), files=(), warnings=tuple(warnings), **base)
    warnings.extend(scan.warnings)
    if scan.absent:
        return RestorePlan(kind=KIND_NONE, reason=f"no checkpoints: {scan.absent}", epoch=None, step=None,
                           sources=(), files=(), warnings=tuple(warnings), **base)
    (breakpoint_index, breakpoint_keys), (periodic_index, periodic_keys) = _index(scan)
    breakpoint_choice, reason = _breakpoint(groups.groups, faults, breakpoint_index, breakpoint_keys, warnings)
    periodic = _periodic(groups.groups, faults.ranks, periodic_index, periodic_keys, warnings,
                         breakpoint_choice.key if breakpoint_choice else None)
    choice = breakpoint_choice
    if periodic and (not choice or periodic.key > choice.key):
        if choice:
            warnings.append(f"breakpoint checkpoints at {_at(choice.key)} are older than the "
                            f"periodic ones at {_at(periodic.key)}; resuming from the periodic ones")
            reason = "stale breakpoint checkpoints"
        choice = periodic
    if choice is None:
        return RestorePlan(kind=KIND_NONE, reason=f"{reason}; no step has a complete periodic "
                           "checkpoint for every replica group", epoch=None, step=None,
                           sources=(), files=(), warnings=tuple(warnings), **base)
    if choice.kind == KIND_PERIODIC:
        reason = f"{reason}; periodic checkpoints at {_at(choice.key)} cover every replica group"
    # A group's ranks share one pick object: deduplicated by identity first (16,384 -> 2,048 here).
    files = tuple(sorted({(pick.rank, pick.path) for pick in {id(p): p for p in choice.picks}.values()}))
    plan = RestorePlan(kind=choice.kind, reason=reason, epoch=choice.picks[0].epoch,
                       step=choice.key[1], sources=tuple([p.rank for p in choice.picks]),
                       files=files, warnings=tuple(warnings), **base)
    if not plan.full_env_maps:
        plan = replace(plan, warnings=plan.warnings + (
            f"{envnames.RESTORE_RANKS}/{envnames.RESTORE_RANKS_MAP} for the whole world exceed the "
            "environment's per-variable limit; each rank gets only its own group's entry",))
    return plan


def _at(key: Key) -> str:
    return f"epoch {key[0]} step {key[1]}"


def _groups_text(groups: Sequence[Group]) -> str:
    shown = ", ".join("{" + ",".join(map(str, g)) + "}" for g in groups[:_EXAMPLES])
    return shown + (f" and {len(groups) - _EXAMPLES} more" if len(groups) > _EXAMPLES else "")


def _index(scan: ScanResult) -> Tuple[Tuple[Index, Sequence[Key]], Tuple[Index, Sequence[Key]]]:
    """Breakpoint and periodic: per rank ``(epoch, step) -> checkpoint`` (keys are unique per kind),
    and every key of any rank, newest first (the index keeps both as ranks change)."""
    if scan.kinds is None:
        kinds = [by_kind(items) for items in scan.checkpoints]
        indexes: Tuple[Index, Index] = ([pair[0] for pair in kinds], [pair[1] for pair in kinds])
    else:
        indexes = scan.kinds  # type: ignore[assignment]
    keys = scan.keys if scan.keys is not None and scan.kinds is not None else tuple(map(_keys, indexes))
    return (indexes[0], keys[0]), (indexes[1], keys[1])


def _keys(index: Index) -> List[Key]:
    """Every key of ``index``, newest first (one union of 16,384 dicts per kind)."""
    return sorted(set().union(*index), reverse=True)


def _common_keys(members: Sequence[Sequence[int]], index: Index, keys: Sequence[Key]) -> Iterator[Key]:
    """Keys, newest first, that at least one rank of every member list has. Lazy: the caller
    usually takes the first (the newest step, complete), and a key is rejected at the first member
    list without it; unions of every rank's keys per group cost 16,384 set operations per plan."""
    for key in keys:
        if all(any(key in index[r] for r in ranks) for ranks in members):
            yield key


def _missing_groups(members: Sequence[Sequence[int]], groups: Sequence[Group], index: Index,
                    key: Key) -> List[Group]:
    return [g for g, ranks in zip(groups, members) if not any(key in index[r] for r in ranks)]


def _majority(files: Sequence[Checkpoint]) -> Tuple[List[Checkpoint], List[Checkpoint]]:
    """Split replicas' files of one step into (kept, dropped). Replicas are byte-identical in size,
    so when sizes disagree the files of a strict majority size are kept and the others (truncated,
    torn, or padded copies) dropped. Without a strict majority nothing is provable: all dropped."""
    if len({c.size for c in files}) <= 1:
        return list(files), []  # the usual case, without a dict per replica group
    sizes: Dict[int, int] = {}
    for c in files:
        sizes[c.size] = sizes.get(c.size, 0) + 1
    if len(sizes) <= 1:
        return list(files), []
    size, count = max(sizes.items(), key=lambda item: (item[1], -item[0]))
    if count * 2 <= len(files):
        return [], list(files)
    return [c for c in files if c.size == size], [c for c in files if c.size != size]


def _sizes_text(files: Sequence[Checkpoint]) -> str:
    return ", ".join(f"rank {c.rank}: {c.size} B" for c in files)


def _breakpoint(groups: Sequence[Group], faults: FaultReport, index: Index, keys: Sequence[Key],
                warnings: List[str]) -> Tuple[Optional[_Choice], str]:
    """The breakpoint choice, or None and the reason there is none (``keys``: ``index``'s, newest first)."""
    newest = keys[0] if keys else None
    if newest is None:
        return None, "no breakpoint checkpoints"
    if not faults.trusted:
        warnings.append("breakpoint restore disabled: the fault reports could not be fully read, "
                        "so a faulty rank might be chosen as a source")
        return None, "fault reports unreadable"
    usable = [g if faults.ranks.isdisjoint(g) else tuple(r for r in g if r not in faults.ranks) for g in groups]
    for key in _common_keys(usable, index, keys):
        picks = _breakpoint_picks(groups, usable, index, key, warnings)
        if picks is not None:
            return _Choice(KIND_BREAKPOINT, key, picks), (
                f"breakpoint checkpoints at {_at(key)} on a healthy rank of every replica group")
    lacking = _missing_groups(usable, groups, index, newest)
    if lacking:
        warnings.append(f"no breakpoint restore: at the newest breakpoint step ({_at(newest)}) "
                        f"replica groups {_groups_text(lacking)} have no healthy rank with a "
                        "breakpoint checkpoint, and no older step is complete")
    return None, "breakpoint checkpoints incomplete"


def _breakpoint_picks(groups: Sequence[Group], usable: Sequence[Group], index: Index, key: Key,
                      warnings: List[str]) -> Optional[Tuple[Checkpoint, ...]]:
    """Per rank, the breakpoint checkpoint at ``key`` it loads (its group's usable replicas' file of
    the majority size); None when some group's files at ``key`` have no majority size."""
    picks: List[Optional[Checkpoint]] = [None] * len(index)
    for group, ranks in zip(groups, usable):
        having = [index[r][key] for r in ranks if key in index[r]]
        kept, dropped = _majority(having)
        if not kept:
            warnings.append(f"breakpoint checkpoints at {_at(key)} differ in size within replica "
                            f"group {_groups_text([group])} with no majority: " + _sizes_text(having))
            return None
        if dropped:
            warnings.append(f"breakpoint checkpoints at {_at(key)} in replica group "
                            f"{_groups_text([group])} whose size differs from the majority's "
                            f"({kept[0].size} B) ignored: " + _sizes_text(dropped))
        for rank in group:
            picks[rank] = kept[0]
    return tuple(picks)  # type: ignore[arg-type]  # the groups partition the world


def _periodic(groups: Sequence[Group], faults: FrozenSet[int], index: Index, keys: Sequence[Key],
              warnings: List[str], newer_than: Optional[Key] = None) -> Optional[_Choice]:
    """The newest periodic choice, or None (``keys``: ``index``'s, newest first); only steps after
    ``newer_than`` (the breakpoint choice: an older periodic step would not be used, and its warnings
    would describe a plan not taken)."""
    newest = keys[0] if keys else None
    if newer_than is not None and (newest is None or newest <= newer_than):
        return None  # the common case at scale: no pass over every group for a choice not taken
    for key in _common_keys(groups, index, keys):
        if newer_than is not None and key <= newer_than:
            break
        picks: List[Optional[Checkpoint]] = [None] * len(index)
        for group in groups:
            chosen = _pick_periodic(group, faults, index, key, warnings)
            if chosen is None:
                warnings.append(f"periodic checkpoints at {_at(key)} differ in size within replica "
                                f"group {_groups_text([group])} and some rank has no own file")
                break
            for rank, checkpoint in zip(group, chosen):
                picks[rank] = checkpoint
        else:
            lacking = _missing_groups(groups, groups, index, newest) if key != newest else []
            if lacking:
                warnings.append(f"the newest periodic checkpoints ({_at(newest)}) are missing for "
                                f"replica groups {_groups_text(lacking)}; using {_at(key)}")
            return _Choice(KIND_PERIODIC, key, tuple(picks))
    return None


def _pick_periodic(group: Group, faults: FrozenSet[int], index: Index, key: Key,
                   warnings: List[str]) -> Optional[Tuple[Checkpoint, ...]]:
    """Per rank of ``group``, the periodic checkpoint at ``key`` it loads; None if unprovable.

    A healthy rank loads its own file, else the lowest healthy replica's, else the lowest faulty
    replica's. A faulty rank prefers the lowest healthy replica's file to its own.
    """
    having = [r for r in group if key in index[r]]
    if len({index[r][key].size for r in having}) > 1:
        kept = _majority_ranks(group, index, key, having, warnings)
        if kept is None:
            # No majority: none may stand in for another, so each rank needs its own file (groups
            # declared by --dp that really hold different shards end up here).
            return None if len(having) < len(group) else tuple(index[r][key] for r in group)
        having = kept
    healthy = next((r for r in having if r not in faults), None)
    fallback = having[0] if healthy is None else healthy
    has_own = set(having)
    return tuple(index[rank][key] if rank in has_own and (rank not in faults or healthy is None)
                 else index[fallback][key] for rank in group)


def _majority_ranks(group: Group, index: Index, key: Key, having: List[int],
                    warnings: List[str]) -> Optional[List[int]]:
    """Of ``having`` (the ranks of ``group`` with a file at ``key``, whose sizes differ), those whose
    file has the majority size, with a warning about the others (damaged copies: their ranks borrow
    a majority replica's file); None without a strict majority."""
    kept, _ = _majority([index[r][key] for r in having])
    if not kept:
        return None
    dropped = [index[r][key] for r in having if index[r][key].size != kept[0].size]
    warnings.append(f"periodic checkpoints at {_at(key)} in replica group {_groups_text([group])} "
                    f"whose size differs from the majority's ({kept[0].size} B) ignored: " + _sizes_text(dropped))
    return [c.rank for c in kept]
