"""``reset.json``: MindCluster's recovery instructions for the job, read and parsed.

MindCluster (ClusterD / the Volcano plugin) writes the ``reset-config-<job>`` ConfigMap, mounted at
``/user/restore/reset/config/``: key ``reset.json`` (docs/ascend-reference.md section 3), key ``checkCode``
and, beside them, ``restartType`` (``podReschedule`` | ``hotReset``). Here:
:func:`parse_reset` / :func:`read_reset`: content -> :class:`ResetState` (ValueError if malformed).
Following the file during a run and deciding on its changes is :mod:`launcher.cluster.resetfollow`.

The fault-rank reader of the restore planner (:mod:`launcher.restore.faults`) shares the rank id
rule and the status vocabulary with this module.
"""

import logging
import os
from dataclasses import field
from typing import Any, Iterable, List, Optional, Set, Tuple, Union

from launcher.common.inputfiles import LIMIT_LINE, LIMIT_REPORT, InputFileError, brief, loads_json, read_bytes
from launcher.common.records import record
from launcher.jobspec.options import DEFAULT_RESET_JSON as DEFAULT_RESET_JSON_PATH

#: Statuses that make a rank faulty (not a restore source, stopped when local) / healthy.
FAULT_STATUSES = frozenset({"unrecovered", "fault", "failed"})
HEALTHY_STATUSES = frozenset({"recovered"})


def int_rank(value: Any) -> int:
    """A rank id from a JSON number or a decimal string; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"rank id {brief(repr(value), 60)} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ValueError(f"rank id {brief(repr(value), 60)} is not an integer")



log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RESET_JSON_PATH", "RESTART_TYPE_FILE", "KNOWN_STATUSES", "ResetState", "EMPTY", "parse_reset",
           "loads_reset", "read_snapshot", "read_reset"]

#: The sibling key/file saying how the job is restarted (``podReschedule`` | ``hotReset``).
RESTART_TYPE_FILE = "restartType"
#: What the files are called in messages.
RESET_JSON = "reset.json"
STATUS_FAULT = "fault"
STATUS_RECOVERED = "recovered"
#: Every ``Status`` MindCluster writes; another value is kept, with a warning, as neither faulty nor healthy.
KNOWN_STATUSES = FAULT_STATUSES | HEALTHY_STATUSES

_SNAPSHOT_ATTEMPTS = 3

Snapshot = Tuple[Optional[bytes], Optional[bytes]]


@record(frozen=True)
class ResetState:
    """One good ``reset.json`` (plus ``restartType``).

    Attributes:
        statuses: ``(global rank id, status)`` pairs sorted by rank; status lower-cased.
        retry_time: ``RetryTime``: MindCluster increases it to ask every process to restart.
        update_time: ``UpdateTime`` (unix seconds of the last write).
        fault_flushing: ``FaultFlushing``: a fault is being handled; do not (re)start yet.
        graceful_exit: ``GracefulExit == 1``: stop every worker gracefully and exit.
        restart_fault_process: ``RestartFaultProcess``: restart only the faulty processes (recover-in-place).
        restart_type: content of ``restartType``, stripped; None if missing or empty.
        warnings: what was odd but usable (unknown statuses, unknown GracefulExit values); not compared.
    """

    statuses: Tuple[Tuple[int, str], ...] = ()
    retry_time: int = 0
    update_time: int = 0
    fault_flushing: bool = False
    graceful_exit: bool = False
    restart_fault_process: bool = False
    restart_type: Optional[str] = None
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    def ranks(self) -> Set[int]:
        """Every rank listed in ``RankList``."""
        return {rank for rank, _status in self.statuses}

    def status_of(self, rank: int) -> Optional[str]:
        """The status of ``rank``, or None when it is not listed."""
        return dict(self.statuses).get(rank)

    def faulty(self, ranks: Optional[Iterable[int]] = None) -> Set[int]:
        """Ranks among ``ranks`` (all listed when None) whose status is unrecovered, fault or failed."""
        wanted = None if ranks is None else set(ranks)
        return {rank for rank, status in self.statuses
                if status in FAULT_STATUSES and (wanted is None or rank in wanted)}

    def all_recovered(self) -> bool:
        """True when at least one rank is listed and every listed rank is ``recovered``."""
        return bool(self.statuses) and all(status == STATUS_RECOVERED for _rank, status in self.statuses)

    def hold(self, local_ranks: Iterable[int]) -> bool:
        """True while workers must not be (re)started: ``FaultFlushing``, or a local rank is ``fault``."""
        if self.fault_flushing:
            return True
        local = set(local_ranks)
        return any(status == STATUS_FAULT and rank in local for rank, status in self.statuses)


#: The state before any ``reset.json`` content exists (the ConfigMap starts empty).
EMPTY = ResetState()


# -- parsing --------------------------------------------------------------------------------------
def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, name in names.items():
        if type(value) is kind:  # exact: bool is not an int here
            return name
    return "a number" if isinstance(value, (int, float)) else type(value).__name__


def _int_field(payload: dict, key: str) -> int:
    """An integer field; absent or null is 0."""
    value = payload.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, not {_json_type(value)} ({brief(repr(value), 60)})")
    return value


def _bool_field(payload: dict, key: str) -> bool:
    """A boolean field; absent or null is False."""
    value = payload.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {_json_type(value)} ({brief(repr(value), 60)})")
    return value


def _graceful_exit(payload: dict, warnings: List[str]) -> bool:
    """``GracefulExit``: 0 or 1 (a boolean is accepted); another integer is a warning and means 0."""
    value = payload.get("GracefulExit")
    if value is None or isinstance(value, bool):
        return bool(value)
    if not isinstance(value, int):
        raise ValueError(f"GracefulExit must be 0 or 1, not {_json_type(value)} ({brief(repr(value), 60)})")
    if value not in (0, 1):
        warnings.append(f"GracefulExit {value} is neither 0 nor 1; no graceful exit is requested")
        return False
    return value == 1


def _rank_entry(index: int, entry: Any) -> Tuple[int, str, str]:
    """``(rank, normalised status, raw status)`` of ``RankList[index]``."""
    where = f"RankList[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object, not {_json_type(entry)}")
    if "RankId" not in entry:
        raise ValueError(f"{where} has no RankId")
    try:
        rank = int_rank(entry["RankId"])
    except ValueError as exc:
        raise ValueError(f"{where}.RankId: {exc}") from None
    if rank < 0:
        raise ValueError(f"{where}.RankId {rank} is negative")
    status = entry.get("Status")
    if not isinstance(status, str):
        raise ValueError(f"{where}.Status must be a string, not {_json_type(status)}")
    return rank, status.strip().lower(), status


def _rank_list(entries: Any, warnings: List[str]) -> Tuple[Tuple[int, str], ...]:
    """Sorted ``(rank, status)`` pairs of ``RankList`` (absent or null: none)."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ValueError(f"RankList must be an array, not {_json_type(entries)}")
    found = {}
    for index, entry in enumerate(entries):
        rank, status, raw = _rank_entry(index, entry)
        if found.get(rank, status) != status:
            raise ValueError(f"rank {rank} is listed with two statuses: {found[rank]!r} and {status!r}")
        if status not in KNOWN_STATUSES and rank not in found:
            warnings.append(f"rank {rank} has unknown Status {raw!r}; treated as neither faulty nor recovered")
        found[rank] = status
    return tuple(sorted(found.items()))


def parse_reset(payload: Any, restart_type: Optional[str] = None) -> ResetState:
    """The state described by a parsed ``reset.json`` payload.

    Unknown keys (``Policy``, ``LogicId``, ``ErrorCode``, ...) are ignored; an unknown ``Status`` or a
    ``GracefulExit`` other than 0/1 is usable and only recorded in ``warnings``.

    Args:
        payload: The decoded JSON.
        restart_type: Content of the ``restartType`` sibling, if any.

    Raises:
        ValueError: not an object, a field of the wrong type, a RankId that is not a non-negative
            integer (or decimal string), an entry without RankId or Status, or one rank listed twice with
            different statuses. The message names the field.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, not {_json_type(payload)}")
    warnings: List[str] = []
    statuses = _rank_list(payload.get("RankList"), warnings)
    return ResetState(
        statuses=statuses,
        retry_time=_int_field(payload, "RetryTime"),
        update_time=_int_field(payload, "UpdateTime"),
        fault_flushing=_bool_field(payload, "FaultFlushing"),
        graceful_exit=_graceful_exit(payload, warnings),
        restart_fault_process=_bool_field(payload, "RestartFaultProcess"),
        restart_type=(restart_type or "").strip() or None,
        warnings=tuple(warnings))


def loads_reset(data: Union[str, bytes, None], restart_type: Union[str, bytes, None] = None,
                path: str = RESET_JSON) -> Optional[ResetState]:
    """The state in raw ``reset.json`` content; None when there is none (missing, empty or blank).

    Raises:
        InputFileError: the content is not UTF-8, nested too deep or not JSON (one line naming ``path``).
        ValueError: :func:`parse_reset` rejects it.
    """
    if isinstance(restart_type, bytes):
        restart_type = restart_type.decode("utf-8", errors="replace")
    if data is None or not data.strip():
        return None
    payload = loads_json(data.encode("utf-8") if isinstance(data, str) else data, path, RESET_JSON)
    return parse_reset(payload, restart_type)


def _read_optional(path: str, what: str, limit: int) -> Optional[bytes]:
    try:
        return read_bytes(path, what, limit)
    except FileNotFoundError:
        return None


def read_snapshot(path: str) -> Snapshot:
    """``(reset.json bytes, restartType bytes)``, each None if missing, from one ConfigMap generation.

    Both are read beside the file ``path`` resolves to (the timestamped directory of a ConfigMap
    volume, which never changes once visible); if ``..data`` was swapped during the reads they are read
    again, so the two never come from different updates. ``restartType`` is also looked for beside
    ``path`` itself when the resolved directory has none.

    Raises:
        OSError: a file exists but cannot be read.
        InputFileError: a file is not a regular file, or too big.
    """
    for _attempt in range(_SNAPSHOT_ATTEMPTS):
        real = os.path.realpath(path)
        try:
            data = _read_optional(real, RESET_JSON, LIMIT_REPORT)
        except InputFileError as exc:  # named as configured: the resolved path alone is a riddle
            raise InputFileError(RESET_JSON, path if real == os.path.abspath(path) else f"{path} (-> {real})",
                                 exc.problem) from None
        restart_type = _read_optional(os.path.join(os.path.dirname(real), RESTART_TYPE_FILE), RESTART_TYPE_FILE,
                                      LIMIT_LINE)
        if restart_type is None and os.path.dirname(real) != os.path.dirname(os.path.abspath(path)):
            restart_type = _read_optional(os.path.join(os.path.dirname(os.path.abspath(path)), RESTART_TYPE_FILE),
                                          RESTART_TYPE_FILE, LIMIT_LINE)
        if os.path.realpath(path) == real:
            break
    return data, restart_type


def read_reset(path: str = DEFAULT_RESET_JSON_PATH) -> Optional[ResetState]:
    """The state in ``path`` (with its ``restartType`` sibling).

    Returns:
        None when the file is missing or empty (the ConfigMap starts empty; not on a cluster).

    Raises:
        ValueError: the content is malformed (an :class:`InputFileError` for a file that is not a
            regular file, too big, not UTF-8, too deep or not JSON; see :func:`parse_reset` for the
            rest); the message names ``path``.
        OSError: the file exists but cannot be read.
    """
    data, restart_type = read_snapshot(path)
    try:
        return loads_reset(data, restart_type, path)
    except InputFileError:
        raise
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
