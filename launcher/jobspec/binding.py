"""CPU binding of the local ranks (``--bind-cores auto|none|LIST``): which CPUs each rank may run on.

The plan is a pure function (:func:`plan_auto`) of the CPUs this launcher may use, the NUMA node of
each rank's device and the CPUs of each NUMA node; the machine facts are read from sysfs by
:func:`machine_facts` (a root other than ``/sys`` in tests). ``auto`` chooses, in this order:

* ``device``: every rank's device has a NUMA node (``numa_node`` of the NPU's PCI function, reached
  through its ``davinci<N>`` class device): the ranks of a node share that node's CPUs, so a rank
  never runs on the other socket. Nodes that hold no rank's device are left to other jobs;
* ``numa``: NUMA nodes without device facts: the ranks are spread over the nodes in order (ranks
  0..k-1 on the first node, ...) and share their node's CPUs;
* ``even``: one node (or none known): the CPUs split into equal contiguous blocks.

Each rank's set is a contiguous share of its node's allowed CPUs, sets never overlap, and a rank gets
at least one CPU; when there are fewer CPUs than ranks there is nothing sensible to bind (None).
"""

import os
import re
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from launcher.common.errors import UsageError
from launcher.common.inputfiles import InputFileError, read_line
from launcher.common.records import record

AUTO, NONE = "auto", "none"
#: ``--bind-cores LIST``: the local ranks' CPU sets separated by ``;``, each a Linux cpulist.
RANK_SEPARATOR = ";"
#: Where the NUMA node of NPU ``N`` is read, relative to the sysfs root, first found wins: the
#: ``davinci<N>`` class device's ``device`` link is the NPU's PCI function, whose ``numa_node`` is the
#: kernel's (-1: the platform does not say).
DEVICE_NUMA_PATHS = ("class/davinci/davinci{n}/device/numa_node", "class/devdrv-class/davinci{n}/device/numa_node")
NODE_DIR = "devices/system/node"
_CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_NODE = re.compile(r"^node(\d+)$")

CpuSets = Tuple[FrozenSet[int], ...]


def parse_cpulist(text: str) -> FrozenSet[int]:
    """``0-3,8,10-11`` (the kernel's cpulist format) -> the CPU numbers; ValueError if malformed."""
    text = text.replace(" ", "")
    if not _CPULIST.match(text):
        raise ValueError(f"{text!r} is not a CPU list such as 0-3,8")
    cpus = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low or high >= 1 << 16:
            raise ValueError(f"{part!r}: not a CPU range")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpulist(cpus: FrozenSet[int]) -> str:
    """The shortest cpulist of ``cpus``: ``{0, 1, 2, 5}`` -> ``0-2,5``."""
    parts: List[str] = []
    ordered = sorted(cpus)
    start = prev = None
    for cpu in ordered + [None]:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def parse_bind_cores(value: str) -> Optional[CpuSets]:
    """``--bind-cores``: None for ``auto`` and ``none``, else one CPU set per local rank.

    Raises:
        UsageError: not ``auto``, ``none`` or ``;``-separated non-empty cpulists.
    """
    if value.strip().lower() in (AUTO, NONE):
        return None
    try:
        sets = tuple(parse_cpulist(part) for part in value.split(RANK_SEPARATOR))
    except ValueError as exc:
        raise UsageError(f"--bind-cores {value!r}: {exc}",
                         ["use auto, none, or one CPU list per local rank separated by ';', e.g. '0-3;4-7'"]) \
            from None
    return sets


def _split(cpus: Sequence[int], parts: int) -> List[FrozenSet[int]]:
    """``cpus`` (sorted) in ``parts`` contiguous blocks whose sizes differ by at most one."""
    size, extra = divmod(len(cpus), parts)
    blocks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        blocks.append(frozenset(cpus[start:end]))
        start = end
    return blocks


def _share_nodes(rank_nodes: Sequence[int], node_cpus: Mapping[int, FrozenSet[int]]) -> Optional[CpuSets]:
    """Each node's CPUs split among the ranks placed on it; None when a node has fewer CPUs than ranks."""
    sets: List[FrozenSet[int]] = [frozenset()] * len(rank_nodes)
    for node in sorted(set(rank_nodes)):
        ranks = [i for i, n in enumerate(rank_nodes) if n == node]
        cpus = sorted(node_cpus.get(node, ()))
        if len(cpus) < len(ranks):
            return None
        for rank, block in zip(ranks, _split(cpus, len(ranks))):
            sets[rank] = block
    return tuple(sets)


@record(frozen=True)
class Plan:
    """What ``auto`` chose: one CPU set per local rank, and how (``device``, ``numa`` or ``even``)."""

    sets: CpuSets
    how: str

    def cpus(self, local_rank: int) -> Optional[FrozenSet[int]]:
        """The CPUs of ``local_rank``; None for the MindSpore scheduler (-1), which is left unbound."""
        return self.sets[local_rank] if 0 <= local_rank < len(self.sets) else None

    def describe(self) -> str:
        """``local rank 0: 0-3; local rank 1: 4-7`` for the log line."""
        return "; ".join(f"local rank {i}: {format_cpulist(cpus)}" for i, cpus in enumerate(self.sets))


def plan_auto(allowed: FrozenSet[int], device_nodes: Sequence[Optional[int]],
              node_cpus: Mapping[int, FrozenSet[int]]) -> Optional[Plan]:
    """The ``auto`` binding of ``len(device_nodes)`` local ranks.

    Args:
        allowed: The CPUs the launcher may use (``os.sched_getaffinity(0)``).
        device_nodes: Per local rank, the NUMA node of its device, None when unknown.
        node_cpus: NUMA node -> its CPUs (all of them: the plan keeps only ``allowed`` ones).

    Returns:
        The plan, or None when there are fewer allowed CPUs than ranks (nothing to bind).
    """
    count = len(device_nodes)
    if count == 0 or len(allowed) < count:
        return None
    nodes = {node: cpus & allowed for node, cpus in node_cpus.items() if cpus & allowed}
    for how, share in (("device", _by_device), ("numa", _by_numa)):
        sets = share(device_nodes, nodes)
        if sets is not None:
            return Plan(sets, how)
    return Plan(tuple(_split(sorted(allowed), count)), "even")


def _by_device(device_nodes: Sequence[Optional[int]], nodes: Mapping[int, FrozenSet[int]]) -> Optional[CpuSets]:
    """Each rank on its device's NUMA node; None unless every device's node is known, has allowed CPUs
    and at least as many as the ranks placed on it."""
    if not all(n is not None and n in nodes for n in device_nodes):
        return None
    return _share_nodes(list(device_nodes), nodes)  # type: ignore[arg-type]


def _by_numa(device_nodes: Sequence[Optional[int]], nodes: Mapping[int, FrozenSet[int]]) -> Optional[CpuSets]:
    """The ranks spread over two or more NUMA nodes in order, whatever their devices; None with fewer
    nodes, or when a node has fewer CPUs than the ranks placed on it."""
    count, order = len(device_nodes), sorted(nodes)
    if len(order) < 2:
        return None
    if count >= len(order):  # consecutive ranks on the same node, as devices usually are
        return _share_nodes([order[i * len(order) // count] for i in range(count)], nodes)
    owner = [j * count // len(order) for j in range(len(order))]  # fewer ranks than nodes: whole nodes each
    return tuple(frozenset().union(*(nodes[order[j]] for j in range(len(order)) if owner[j] == rank))
                 for rank in range(count))


def _read(path: str) -> Optional[str]:
    try:
        return read_line(path, "sysfs attribute")
    except (OSError, InputFileError):
        return None


def device_numa_node(device_id: int, sysfs: str = "/sys") -> Optional[int]:
    """The NUMA node of NPU ``device_id`` as sysfs says, or None (no such file, -1, garbage)."""
    for pattern in DEVICE_NUMA_PATHS:
        text = _read(os.path.join(sysfs, pattern.format(n=device_id)))
        if text is not None:
            return int(text) if text.isdigit() else None
    return None


def numa_node_cpus(sysfs: str = "/sys") -> Dict[int, FrozenSet[int]]:
    """NUMA node -> its CPUs, from ``node<N>/cpulist``; empty when the machine shows no nodes."""
    root = os.path.join(sysfs, NODE_DIR)
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    nodes: Dict[int, FrozenSet[int]] = {}
    for name in names:
        match = _NODE.match(name)
        text = _read(os.path.join(root, name, "cpulist")) if match else None
        try:
            cpus = parse_cpulist(text) if text else frozenset()
        except ValueError:
            continue
        if cpus:
            nodes[int(match.group(1))] = cpus  # type: ignore[union-attr]
    return nodes


def resolve(value: str, device_ids: Sequence[int], sysfs: str = "/sys",
            allowed: Optional[FrozenSet[int]] = None) -> Optional[Plan]:
    """``--bind-cores value`` for local ranks whose devices are ``device_ids``: the plan, or None to
    leave the ranks unbound (``none``, or ``auto`` with fewer CPUs than ranks).

    Raises:
        UsageError: a LIST with a different number of sets than local ranks, or CPUs this process
            may not use.
    """
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    mode = value.strip().lower()
    if mode == NONE:
        return None
    if mode == AUTO:
        return plan_auto(allowed, [device_numa_node(d, sysfs) for d in device_ids], numa_node_cpus(sysfs))
    sets = parse_bind_cores(value) or ()
    problems = []
    if len(sets) != len(device_ids):
        problems.append(f"--bind-cores has {len(sets)} CPU list(s) for {len(device_ids)} local rank(s)")
    outside = frozenset().union(*sets) - allowed
    if outside:
        problems.append(f"--bind-cores names CPU(s) {format_cpulist(outside)} outside the ones this process "
                        f"may use ({format_cpulist(allowed)})")
    if problems:
        raise UsageError("; ".join(problems), ["give one CPU list per local rank, e.g. '0-3;4-7', or use auto"])
    return Plan(sets, "list")


def pin(pid: int, cpus: FrozenSet[int]) -> None:
    """Bind every thread of the running process ``pid`` to ``cpus`` (a standby taking over a rank).

    Raises:
        OSError: the process is gone or the set is not allowed.
    """
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            if tid == pid:
                raise
