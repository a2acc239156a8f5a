"""The one walk over a rank table's raw data, shared by the parser and the validator.

Strict (:mod:`.parse`): stops at the first problem with :class:`Invalid`. Lenient (:mod:`.validate`):
skips entries the JSON Schema already reports and records the problems a schema cannot express
(duplicate or missing rank ids, duplicate devices on a server, counts that disagree, unknown servers
in a 1.2 ``super_pod_list``). Both modules import this one and neither imports the other's callers,
so parse -> validate -> walk has no cycle.
"""

from collections import abc
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from launcher.jobspec.ranktable.model import Device

SUPPORTED_VERSIONS = ("1.0", "1.2", "2.0")
COMPLETED = "completed"
_MISSING = object()


class Invalid(Exception):
    """The first problem met by a strict walk; parse_rank_table turns it into RankTableError."""


class Walk:
    """One pass over a table's raw data, strict (parse) or lenient (validate)."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.problems: List[str] = []
        self.clean = True  # no entry skipped so far

    def malformed(self, path: str, message: str) -> None:
        """A problem the JSON Schema reports too: strict walks stop, lenient ones skip the entry."""
        if self.strict:
            raise Invalid(f"{path}: {message}")
        self.clean = False

    def problem(self, path: str, message: str) -> None:
        """A problem only code can see: strict walks stop, lenient ones record it."""
        if self.strict:
            raise Invalid(f"{path}: {message}")
        self.problems.append(f"{path}: {message}")

    def _expected(self, path: str, value: Any, expected: str) -> None:
        self.malformed(path, "missing" if value is _MISSING else f"expected {expected}, got {value!r}")

    def mapping(self, value: Any, path: str) -> Optional[Mapping]:
        # The type() test is the fast path: json.loads only makes dicts.
        if type(value) is dict or isinstance(value, abc.Mapping):
            return value
        self._expected(path, value, "an object")
        return None

    def array(self, value: Any, path: str, non_empty: bool = True) -> Optional[list]:
        if type(value) is list and (value or not non_empty):
            return value
        self._expected(path, value, "a non-empty array" if non_empty else "an array")
        return None

    def text(self, obj: Mapping, key: str, path: str, required: bool = True) -> Optional[str]:
        value = obj.get(key, _MISSING)
        if type(value) is str and value:
            return value
        if value is not _MISSING or required:
            self._expected(f"{path}.{key}", value, "a non-empty string")
        return None

    def uint(self, obj: Mapping, key: str, path: str, allow_int: bool,
             required: bool = True) -> Optional[int]:
        """A non-negative integer in decimal digits (or, where ``allow_int``, a JSON integer)."""
        value = obj.get(key, _MISSING)
        if type(value) is str:
            if value.isdigit() and value.isascii():
                return int(value)
        # JSON Schema counts 2.0 as an integer, so the parser must too.
        elif allow_int and (type(value) is int or (type(value) is float and value.is_integer())) and value >= 0:
            return int(value)
        if value is not _MISSING or required:
            self._expected(f"{path}.{key}", value, "a decimal string")
        return None


class Draft:
    """A server being assembled; ``paths`` holds each device's JSON path for messages."""

    __slots__ = ("server_id", "host_ip", "container_ip", "devices", "paths")

    def __init__(self, server_id: str, host_ip: Optional[str] = None, container_ip: Optional[str] = None):
        self.server_id = server_id
        self.host_ip = host_ip
        self.container_ip = container_ip
        self.devices: List[Device] = []
        self.paths: List[str] = []


def kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def version_problem(data: Mapping) -> Optional[str]:
    """The problem with ``data``'s ``version`` field, or None when it names a supported format."""
    version = data.get("version", _MISSING)
    supported = ", ".join(SUPPORTED_VERSIONS)
    if version is _MISSING:
        return f"$: 'version' is a required property (supported: {supported})"
    if type(version) is not str or version not in SUPPORTED_VERSIONS:
        return f"$.version: unsupported rank table version {version!r} (supported: {supported})"
    return None


def semantic_problems(data: Mapping) -> List[str]:
    """Problems a JSON Schema cannot express, for a table whose ``version`` is supported."""
    walk = Walk(strict=False)
    extract(walk, data)
    return walk.problems


def extract(walk: Walk, data: Mapping) -> Tuple[str, List[Draft], Dict[str, str]]:
    """Walk ``data``: its version, server drafts and (1.2) server_id -> super_pod_id."""
    problem = version_problem(data)
    if problem:
        raise Invalid(problem)
    version = data["version"]
    _check_status(walk, data, version)
    pods: Dict[str, str] = {}
    if version == "2.0":
        drafts = _servers_v2(walk, data)
        _check_count(walk, data, ("rank_count", "rank_list", "ranks"), allow_int=True)
    else:
        drafts = _servers_v1(walk, data, version)
        _check_count(walk, data, ("server_count", "server_list", "servers"), allow_int=False)
        if version == "1.2":
            pods = _super_pods(walk, data)
    _check_ranks(walk, drafts, "$.rank_list" if version == "2.0" else "$.server_list")
    _check_devices(walk, drafts)
    return version, drafts, pods


def _check_status(walk: Walk, data: Mapping, version: str) -> None:
    status = data.get("status", _MISSING)
    if status is _MISSING and version == "2.0":
        return  # optional in 2.0: the CANN documentation treats a table without it as usable
    if type(status) is not str or not status:
        walk.malformed("$.status", "missing" if status is _MISSING else f"expected a string, got {status!r}")
    elif status != COMPLETED:
        walk.problem("$.status", f'the table is not ready: status "{status}" (expected "{COMPLETED}")')


def _servers_v1(walk: Walk, data: Mapping, version: str) -> List[Draft]:
    drafts: List[Draft] = []
    for si, raw in enumerate(walk.array(data.get("server_list", _MISSING), "$.server_list") or ()):
        spath = f"$.server_list[{si}]"
        server = walk.mapping(raw, spath)
        if server is None:
            continue
        server_id = walk.text(server, "server_id", spath)
        host_ip = walk.text(server, "host_ip", spath, required=False)
        container_ip = walk.text(server, "container_ip", spath, required=False)
        devices = walk.array(server.get("device", _MISSING), f"{spath}.device")
        if server_id is None or devices is None:
            continue
        draft = Draft(server_id, host_ip, container_ip)
        for di, raw_device in enumerate(devices):
            dpath = f"{spath}.device[{di}]"
            device = walk.mapping(raw_device, dpath)
            if device is not None:
                _add_v1_device(walk, draft, device, dpath, version)
        drafts.append(draft)
    return drafts


def _add_v1_device(walk: Walk, draft: Draft, device: Mapping, path: str, version: str) -> None:
    rank_id = walk.uint(device, "rank_id", path, allow_int=False)
    device_id = walk.uint(device, "device_id", path, allow_int=False)
    device_ip = walk.text(device, "device_ip", path, required=False)
    super_device_id = None
    # Only 1.2 defines super_device_id; reading it elsewhere would reject what the schema allows.
    if version == "1.2" and walk.uint(device, "super_device_id", path, False, required=False) is not None:
        super_device_id = device["super_device_id"]
    if rank_id is not None and device_id is not None:
        draft.devices.append(Device(rank_id, device_id, device_ip, super_device_id))
        draft.paths.append(path)


def _servers_v2(walk: Walk, data: Mapping) -> List[Draft]:
    """Group 2.0 ranks into servers by the ``net_instance_id`` of their ``net_layer`` 0 entry."""
    by_instance: Dict[str, Draft] = {}
    for ri, raw in enumerate(walk.array(data.get("rank_list", _MISSING), "$.rank_list") or ()):
        rpath = f"$.rank_list[{ri}]"
        rank = walk.mapping(raw, rpath)
        if rank is None:
            continue
        rank_id = walk.uint(rank, "rank_id", rpath, allow_int=True)
        device_id = walk.uint(rank, "device_id", rpath, allow_int=True)
        local_id = walk.uint(rank, "local_id", rpath, allow_int=True, required=False)
        instance = _node_instance(walk, rank, rpath)
        if rank_id is None or device_id is None or instance is None:
            continue
        draft = by_instance.get(instance)
        if draft is None:
            draft = by_instance[instance] = Draft(instance)
        draft.devices.append(Device(rank_id, device_id, local_id=local_id))
        draft.paths.append(rpath)
    return list(by_instance.values())


def _node_instance(walk: Walk, rank: Mapping, path: str) -> Optional[str]:
    levels = walk.array(rank.get("level_list", _MISSING), f"{path}.level_list")
    if levels is None:
        return None
    clean = True
    for li, raw in enumerate(levels):
        lpath = f"{path}.level_list[{li}]"
        level = walk.mapping(raw, lpath)
        layer = None if level is None else walk.uint(level, "net_layer", lpath, allow_int=True)
        if layer == 0:
            return walk.text(level, "net_instance_id", lpath)
        clean = clean and layer is not None
    if clean:  # otherwise the schema already reports the entry that may have been layer 0
        walk.problem(f"{path}.level_list", "no entry with net_layer 0 (its net_instance_id names the server)")
    walk.clean = False  # the rank is skipped either way
    return None


def _check_count(walk: Walk, data: Mapping, names: Tuple[str, str, str], allow_int: bool) -> None:
    key, list_key, noun = names
    declared = walk.uint(data, key, "$", allow_int=allow_int, required=False)
    entries = data.get(list_key)
    if declared is not None and type(entries) is list and declared != len(entries):
        walk.problem(f"$.{key}", f"says {declared} but {list_key} has {len(entries)} {noun}")


def _check_ranks(walk: Walk, drafts: List[Draft], list_path: str) -> None:
    first_seen: Dict[int, str] = {}
    total = 0
    for draft in drafts:
        for device, path in zip(draft.devices, draft.paths):
            total += 1
            first = first_seen.setdefault(device.rank_id, path)
            if first != path:
                walk.problem(f"{path}.rank_id", f"duplicate rank_id {device.rank_id} (also at {first})")
    # With entries skipped, the count is unknown: gaps would be noise next to the schema's problems.
    if not walk.clean or not first_seen or (len(first_seen) == total and max(first_seen) == total - 1):
        return
    missing = [r for r in range(total) if r not in first_seen]
    beyond = sorted(r for r in first_seen if r >= total)
    details = [f"missing {_few(missing)}"] if missing else []
    details += [f"out of range {_few(beyond)}"] if beyond else []
    walk.problem(list_path, f"rank_ids must be 0..{total - 1} without gaps for {total} ranks: "
                            f"{'; '.join(details)}")


def _check_devices(walk: Walk, drafts: List[Draft]) -> None:
    for draft in drafts:
        first_seen: Dict[int, str] = {}
        for device, path in zip(draft.devices, draft.paths):
            first = first_seen.setdefault(device.device_id, path)
            if first != path:
                walk.problem(f"{path}.device_id", f"duplicate device_id {device.device_id} on server "
                                                  f"{draft.server_id!r} (also at {first})")


def _super_pods(walk: Walk, data: Mapping) -> Dict[str, str]:
    """Map server_id -> super_pod_id from a 1.2 ``super_pod_list``, which names servers a second time."""
    raw_pods = data.get("super_pod_list", _MISSING)
    if raw_pods is _MISSING:
        return {}
    known = _listed_servers(data)
    membership: Dict[str, str] = {}
    for pi, raw in enumerate(walk.array(raw_pods, "$.super_pod_list", non_empty=False) or ()):
        ppath = f"$.super_pod_list[{pi}]"
        pod = walk.mapping(raw, ppath)
        if pod is None:
            continue
        pod_id = walk.text(pod, "super_pod_id", ppath)
        for mpath, server_id in _members(walk, pod, ppath):
            if server_id is not None and pod_id is not None:
                _join(walk, membership, known, (server_id, pod_id), f"{mpath}.server_id")
    return membership


def _listed_servers(data: Mapping) -> set:
    """The server ids of the raw ``server_list``: a server skipped for another problem is still not
    "unknown" to a super pod."""
    raw_servers = data.get("server_list")
    return {s.get("server_id") for s in (raw_servers if type(raw_servers) is list else ())
            if isinstance(s, abc.Mapping) and type(s.get("server_id")) is str}


def _members(walk: Walk, pod: Mapping, ppath: str) -> Iterator[Tuple[str, Optional[str]]]:
    """Each member of a super pod: its path and server_id (None: malformed, skipped). Lazily, so that a
    strict walk stops at the first problem in document order."""
    members = walk.array(pod.get("server_list", _MISSING), f"{ppath}.server_list", non_empty=False)
    for mi, raw in enumerate(members or ()):
        mpath = f"{ppath}.server_list[{mi}]"
        member = walk.mapping(raw, mpath)
        yield mpath, None if member is None else walk.text(member, "server_id", mpath)


def _join(walk: Walk, membership: Dict[str, str], known: set, member: Tuple[str, str], path: str) -> None:
    """Put server ``member[0]`` in super pod ``member[1]``: a problem when the server is unknown or
    already in a pod."""
    server_id, pod_id = member
    if server_id not in known:
        walk.problem(path, f"unknown server {server_id!r} (not in $.server_list)")
    elif server_id in membership:
        walk.problem(path, f"server {server_id!r} is already in super pod {membership[server_id]!r}")
    else:
        membership[server_id] = pod_id


def _few(values: List[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown if len(values) <= limit else f"{shown} ... ({len(values) - limit} more)"
