"""What this container sees of the machine: its NPUs and its addresses, read once per launcher run.

``rankenv.build_rank_env`` is pure; the facts it needs from the system are gathered here by
``runner.execute`` and handed over in the ``EnvContext``.
"""

import os
import re
from typing import Mapping, Optional, Tuple

from launcher.common import envnames
from launcher.common.errors import UsageError

DAVINCI = re.compile(r"davinci(\d+)")
# One item of ASCEND_VISIBLE_DEVICES: "3", a range "0-3" (Ascend Docker Runtime), or a device name
# "Ascend910-3" (the pod annotation the Ascend Operator copies into the variable).
_ITEM = re.compile(r"(?:(?P<low>\d+)-(?P<high>\d+)|(?:[A-Za-z][\w.]*-)?(?P<id>\d+))")


def parse_visible_devices(text: str) -> Tuple[int, ...]:
    """``ASCEND_VISIBLE_DEVICES`` -> the physical NPU ids, ascending, each once.

    Accepts ``0,3``, ranges ``0-2,4`` and device names ``Ascend910-0,Ascend910-3``.

    Raises:
        ValueError: an item that is none of these, or a range whose end is below its start.
    """
    ids = set()
    for item in (part.strip() for part in text.split(",")):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ValueError(item)
        if match.group("id") is not None:
            ids.add(int(match.group("id")))
            continue
        low, high = int(match.group("low")), int(match.group("high"))
        if high < low:
            raise ValueError(item)
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


def davinci_devices(dev_dir: str = "/dev") -> Tuple[int, ...]:
    """The ``/dev/davinci<N>`` NPUs this container sees (N physical), ascending; () when none."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return ()
    return tuple(sorted(int(m.group(1)) for m in map(DAVINCI.fullmatch, names) if m))


def visible_devices(environ: Mapping[str, str], dev_dir: str = "/dev") -> Optional[Tuple[int, ...]]:
    """The physical NPU ids this container sees: ``ASCEND_VISIBLE_DEVICES``, else ``/dev/davinci<N>``,
    else None (no NPU, e.g. a CPU test machine).

    Raises:
        UsageError: a malformed ``ASCEND_VISIBLE_DEVICES``.
    """
    text = environ.get(envnames.ASCEND_VISIBLE_DEVICES, "").strip()
    if text:
        try:
            return parse_visible_devices(text)
        except ValueError as exc:
            raise UsageError(f"{envnames.ASCEND_VISIBLE_DEVICES}={text!r}: cannot read item {str(exc)!r}",
                             ["expected ids, ranges or device names, like 0,3 / 0-3 / Ascend910-0,Ascend910-3"]) from None
    return davinci_devices(dev_dir) or None


def local_addresses(environ: Mapping[str, str]) -> Tuple[str, ...]:
    """This container's addresses, read only when they decide something: ``XDL_IP`` set and not
    already known to be this pod's own address (``POD_IP``)."""
    node_ip = environ.get(envnames.XDL_IP)
    if not node_ip or environ.get(envnames.POD_IP) == node_ip:
        return ()
    from launcher.jobspec.topology import host_addresses

    return tuple(host_addresses())
