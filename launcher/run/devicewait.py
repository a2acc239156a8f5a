"""Who else holds this node's NPUs, before a rank starts on one (``--device-wait-timeout``).

A device is held while another process has its ``/dev/davinci<N>`` open (found by a scan of
``/proc/*/fd``: processes of this container, say a leftover of the job before) or while ``npu-smi
info`` lists a process on it (processes of other containers on the same node, which the scan
cannot see). Processes of this launcher's own tree (warm standbys) never count. The scan costs
about 4 ms with 130 processes (docs/failures.md), so the supervisor asks for it only before the
first attempt and after an attempt that left processes behind; ``npu-smi`` is asked every time.

``npu-smi info`` ends with a process table; its rows look like (the tool's own layout)::

    | NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
    +===========================+===============+====================================================+
    | 0       0                 | 124528        | python3.8                | 17400                   |
    +===========================+===============+====================================================+
    | No running processes found in NPU 1                                                            |

The NPU column is compared with the device id (one chip per NPU, as on Atlas 800T A2 boards).
Every read is bounded: the scan skips what it cannot read, ``npu-smi`` gets ``NPU_SMI_TIMEOUT``
seconds and its first ``NPU_SMI_MAX_BYTES`` of output.
"""

import functools
import logging
import os
import re
import subprocess
from typing import Dict, Iterable, List, Mapping, Optional

from launcher.common import envnames
from launcher.common.programs import which
from launcher.supervision.jobtree import read_stat

log = logging.getLogger(__name__)

NPU_SMI_TIMEOUT = 10.0
NPU_SMI_MAX_BYTES = 1 << 20
#: A process row of ``npu-smi info``: NPU, chip, pid, name, memory. Text: ``re`` compiles it on the first
#: ``npu-smi`` output, which most machines never have (compiling it at import cost every launch 0.3 ms).
NPU_SMI_ROW = r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|\s*(.*?)\s*\|\s*(\d+)\s*\|\s*$"


def device_paths(device_ids: Iterable[int], environ: Mapping[str, str]) -> Dict[str, int]:
    """``/dev/davinci<N>`` (under ``LAUNCHER_DEV_DIR``) -> N, for the devices that exist here."""
    root = environ.get(envnames.LAUNCHER_DEV_DIR) or "/dev"
    paths = {os.path.realpath(os.path.join(root, f"davinci{d}")): d for d in device_ids}
    return {path: d for path, d in paths.items() if os.path.exists(path)}


def _ppid(pid: int) -> Optional[int]:
    stat = read_stat(pid)  # the supervision layer's /proc parser
    return stat.ppid if stat is not None else None


def _ours(pid: int, root: int) -> bool:
    """``pid`` is ``root`` or one of its descendants."""
    for _ in range(64):  # the depth of any real process tree
        if pid == root:
            return True
        parent = _ppid(pid)
        if not parent:
            return False
        pid = parent
    return False


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return fh.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def open_holders(paths: Mapping[str, int], root: int) -> Dict[int, List[str]]:
    """Device -> ``pid N (name)`` of each process outside ``root``'s tree with its file open."""
    held: Dict[int, List[str]] = {}
    if not paths:  # no device files here (a CPU machine): nothing to scan for
        return held
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        found = set()
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in paths:
                found.add(paths[target])
        pid = int(entry)
        if found and not _ours(pid, root):
            for device in found:
                held.setdefault(device, []).append(f"pid {pid} ({_name(pid)})")
    return held


def parse_npu_smi(text: str) -> Dict[int, List[int]]:
    """``npu-smi info`` output -> NPU id -> the pids its process table lists."""
    procs: Dict[int, List[int]] = {}
    for line in text.splitlines():
        match = re.match(NPU_SMI_ROW, line.strip())
        if match:
            procs.setdefault(int(match.group(1)), []).append(int(match.group(3)))
    return procs


@functools.lru_cache(maxsize=4)
def _which_npu_smi(path: Optional[str]) -> Optional[str]:
    """Where ``npu-smi`` is on ``path`` (looked up once per PATH: a restart should not walk it)."""
    return which("npu-smi", {} if path is None else {"PATH": path})


def npu_smi_holders(device_ids: Iterable[int], root: int) -> Dict[int, List[str]]:
    """Device -> ``pid N (npu-smi)`` of each process ``npu-smi info`` lists on it; {} without npu-smi."""
    tool = _which_npu_smi(os.environ.get("PATH"))
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool, "info"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=NPU_SMI_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("npu-smi info failed: %s", exc)
        return {}
    procs = parse_npu_smi(done.stdout[:NPU_SMI_MAX_BYTES].decode("utf-8", "replace"))
    wanted = set(device_ids)
    return {d: [f"pid {p} (npu-smi)" for p in pids if not _ours(p, root)]
            for d, pids in procs.items() if d in wanted and any(not _ours(p, root) for p in pids)}


def busy_devices(device_ids: Iterable[int], environ: Mapping[str, str], here: bool = True) -> Dict[int, List[str]]:
    """Device -> who else holds it, for the devices among ``device_ids`` that are held; ``here``:
    scan this container's processes too (else ask only ``npu-smi``)."""
    ids = list(device_ids)
    root = os.getpid()
    held = open_holders(device_paths(ids, environ), root) if here else {}
    for device, holders in npu_smi_holders(ids, root).items():
        held.setdefault(device, []).extend(h for h in holders if h not in held.get(device, ()))
    return held
