"""Replica groups: sets of ranks whose checkpoints are identical.

Exactly one source is used:

* ``group_info.pb`` files under a root directory, one per rank at ``<root>/device<r>/group_info.pb``
  (the layout the legacy scripts create for ``GROUP_INFO_FILE``); each file's
  ``ckpt_restore_rank_list`` is that rank's group.
* a JSON or YAML groups file, ``{"groups": [[0, 8, 16], [1, 9, 17], ...]}``
  (``schemas/groups.schema.json``).
* a parallel layout ``dp x tp x pp``. Ranks are numbered tensor-parallel fastest, then data-parallel,
  then pipeline stage (Megatron's order): ``rank = (pp_i * dp + dp_i) * tp + tp_i``. The replica group
  of ``(pp_i, tp_i)`` is its ``dp`` data-parallel ranks. This is only right when data-parallel replicas
  hold identical checkpoints, i.e. without optimizer-state sharding (ZeRO / MindSpore's
  ``optimizer_shard``); otherwise use group_info.pb or no source.
* none: every rank is its own group (no replicas), always correct but never lets one rank stand in
  for another.

Bad input never raises: ranks no group covers become their own group, and groups that overlap
inconsistently or name ranks outside the world make the whole source untrustworthy, so every rank
becomes its own group. Both cases add a warning.
"""

import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from launcher.common.errors import UsageError
from launcher.common.inputfiles import LIMIT_BINARY, LIMIT_REPORT, InputFileError, brief, read_bytes
from launcher.common.inputyaml import read_yaml
from launcher.common.resources import load_schema

logger = logging.getLogger(__name__)

GROUPS_SCHEMA = "groups.schema.json"
GROUP_INFO_NAME = "group_info.pb"
NO_GROUPS = "none (every rank its own group)"
_IGNORED = "replica groups ignored, every rank restores only from its own checkpoints"
_EXAMPLES = 5

Group = Tuple[int, ...]


@dataclass(frozen=True)
class ReplicaGroups:
    """A partition of ``range(world_size)`` into replica groups.

    Attributes:
        groups: sorted tuples of ranks, ordered by their lowest rank; every rank in exactly one.
        source: where the groups came from, for people.
        warnings: why some or all ranks fell back to being their own group.
    """

    groups: Tuple[Group, ...]
    source: str
    warnings: Tuple[str, ...] = ()


def singletons(world_size: int) -> Tuple[Group, ...]:
    """Every rank its own group."""
    return tuple((rank,) for rank in range(world_size))


def _examples(items: Sequence[object]) -> str:
    shown = ", ".join(str(item) for item in items[:_EXAMPLES])
    return shown + (f" and {len(items) - _EXAMPLES} more" if len(items) > _EXAMPLES else "")


def _discarded(world_size: int, what: str, problem: str,
               earlier: Sequence[str] = ()) -> ReplicaGroups:
    """Every rank its own group, because the source ``what`` cannot be trusted at all."""
    return ReplicaGroups(singletons(world_size), f"{NO_GROUPS}; {what} unusable",
                         tuple(earlier) + (f"{what}: {problem}; {_IGNORED}",))


def partition(world_size: int, candidates: Iterable[Iterable[int]], what: str,
              earlier: Sequence[str] = ()) -> ReplicaGroups:
    """Validate candidate groups into a partition of the world, falling back safely.

    Args:
        world_size: number of ranks.
        candidates: groups in any order, possibly repeated (each rank's file repeats its group).
        what: the source's name, for messages.
        earlier: warnings already collected about the source, kept first.

    Returns:
        The groups. Out-of-range ranks or a rank in two different groups discard the whole source
        (all singletons); uncovered ranks become singletons. Either adds a warning.
    """
    unique = sorted({tuple(sorted(set(group))) for group in candidates if group})
    bad = sorted({r for group in unique for r in group if not 0 <= r < world_size})
    if bad:
        return _discarded(world_size, what, f"ranks {_examples(bad)} are outside "
                          f"0..{world_size - 1}", earlier)
    owner: Dict[int, Group] = {}
    clashes: List[str] = []
    for group in unique:
        for rank in group:
            if rank in owner:
                clashes.append(f"rank {rank} in {_join(owner[rank])} and {_join(group)}")
            owner[rank] = group
    if clashes:
        return _discarded(world_size, what, f"groups overlap inconsistently "
                          f"({_examples(clashes)})", earlier)
    uncovered = [rank for rank in range(world_size) if rank not in owner]
    warnings = list(earlier)
    if uncovered:
        warnings.append(f"{what}: ranks {_examples(uncovered)} are in no group; each is its own group")
    return ReplicaGroups(tuple(sorted(unique + [(rank,) for rank in uncovered])), what,
                         tuple(warnings))


def _join(group: Group) -> str:
    return "{" + ",".join(str(rank) for rank in group) + "}"


# Every plan before a restart asks for the same layout: 16,384 ranks' groups are built once, not
# per plan (16 ms each). The result is frozen, so sharing it is safe.
@lru_cache(maxsize=4)
def groups_from_layout(world_size: int, dp: Optional[int], tp: Optional[int],
                       pp: Optional[int]) -> ReplicaGroups:
    """Data-parallel replica groups of a ``dp x tp x pp`` layout (order in the module docstring).

    An omitted ``tp`` or ``pp`` is 1; an omitted ``dp`` is whatever makes the product the world size.

    Raises:
        UsageError: a size is not positive or the sizes do not multiply to ``world_size``.
    """
    tp, pp = tp or 1, pp or 1
    if dp is None and world_size % (tp * pp) == 0:
        dp = world_size // (tp * pp)
    sizes = {"--dp": dp, "--tp": tp, "--pp": pp}
    not_positive = [name for name, size in sizes.items() if size is None or size < 1]
    if not_positive or dp * tp * pp != world_size:
        raise UsageError(f"parallel layout dp={dp} x tp={tp} x pp={pp} does not match world size "
                         f"{world_size} (an omitted --tp or --pp is 1; only --dp is derived)")
    groups = tuple(tuple((stage * dp + d) * tp + t for d in range(dp))
                   for stage in range(pp) for t in range(tp))
    return ReplicaGroups(groups=tuple(sorted(groups)), source=f"layout dp={dp} tp={tp} pp={pp}")


def read_groups_file(path: str, world_size: int) -> ReplicaGroups:
    """Replica groups from a JSON or YAML file; falls back to singletons with a warning."""
    # Imported here so that a run without a groups file never loads jsonschema.
    import jsonschema

    what = f"groups file {path}"
    try:
        # YAML is a superset of JSON, so one loader reads both.
        payload = read_yaml(path, "groups file", LIMIT_REPORT)
        jsonschema.validate(payload, load_schema(GROUPS_SCHEMA))
    except (OSError, InputFileError, jsonschema.ValidationError) as exc:
        if isinstance(exc, InputFileError):
            reason = exc.problem
        elif isinstance(exc, jsonschema.ValidationError):
            reason = exc.message
        else:
            reason = exc.strerror or str(exc)
        return _discarded(world_size, what, f"unreadable or invalid ({brief(reason)})")
    return partition(world_size, payload["groups"], what)


def read_group_info_root(root: str, world_size: int) -> ReplicaGroups:
    """Replica groups from ``<root>/device<r>/group_info.pb``, one file per rank.

    A missing or bad file only loses that rank's own list; the rank still joins the group other ranks'
    files put it in, or becomes its own group. A list that leaves out its own rank means the files
    are not what this module understands, so all of them are ignored.
    """
    # Imported here so that a run without group_info.pb files never loads protobuf.
    from launcher.restore.groupinfo import parse_restore_rank_list

    what = f"group_info.pb files under {root}"
    lists: List[Group] = []
    missing: List[int] = []
    broken: List[str] = []
    omitting: List[str] = []
    for rank in range(world_size):
        path = os.path.join(root, f"device{rank}", GROUP_INFO_NAME)
        try:
            ranks = parse_restore_rank_list(read_bytes(path, GROUP_INFO_NAME, LIMIT_BINARY))
        except FileNotFoundError:
            missing.append(rank)
            continue
        except (OSError, ValueError) as exc:  # InputFileError is a ValueError: not a regular file, too big
            broken.append(f"device{rank}: {brief(exc.problem if isinstance(exc, InputFileError) else exc)}")
            continue
        if rank not in ranks:
            omitting.append(f"device{rank} lists {list(ranks)}")
        lists.append(ranks)
    warnings = []
    if missing:
        warnings.append(f"{what}: no file for ranks {_examples(missing)}")
    if broken:
        warnings.append(f"{what}: unusable files: {_examples(broken)}")
    if omitting:
        return _discarded(world_size, what, "restore lists leave out their own rank "
                          f"({_examples(omitting)})", warnings)
    return partition(world_size, lists, what, warnings)


def resolve_groups(world_size: int, group_info_root: Optional[str] = None,
                   groups_file: Optional[str] = None, dp: Optional[int] = None,
                   tp: Optional[int] = None, pp: Optional[int] = None) -> ReplicaGroups:
    """Replica groups from whichever single source is given (none: every rank its own group).

    Raises:
        UsageError: more than one source is given, or the layout does not match the world size.
    """
    given = [name for name, value in (("--group-info-root", group_info_root),
                                      ("--groups-file", groups_file)) if value is not None]
    if any(size is not None for size in (dp, tp, pp)):
        given.append("--dp/--tp/--pp")
    if len(given) > 1:
        raise UsageError(f"give one replica-group source, not {' and '.join(given)}")
    if group_info_root is not None:
        groups = read_group_info_root(group_info_root, world_size)
    elif groups_file is not None:
        groups = read_groups_file(groups_file, world_size)
    elif given:
        groups = groups_from_layout(world_size, dp, tp, pp)
    else:
        groups = ReplicaGroups(singletons(world_size), NO_GROUPS)
    logger.debug("%d replica groups from %s", len(groups.groups), groups.source)
    return groups
