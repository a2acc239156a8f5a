"""Read rank tables (``hccl.json``, formats 1.0, 1.2 and 2.0) into :class:`RankTable`.

Parsing is plain Python and never imports jsonschema: the launcher parses the table on every start
and every rewrite, and a 512-server table must cost milliseconds. When the strict walk meets a problem
it stops and asks :func:`launcher.jobspec.ranktable.validate.validate_rank_table` for the full list, so the
user sees every problem with its JSON path, not just the first (validate imports jsonschema only when
it runs). The walk itself, shared with the validator, is :mod:`launcher.jobspec.ranktable.walk`.
"""

from collections import abc
from typing import Dict, List, Mapping, Optional, Tuple

from launcher.common.errors import LauncherError, UsageError
from launcher.jobspec.ranktable.model import RankTable, ServerEntry
from launcher.jobspec.ranktable.validate import validate_rank_table
from launcher.jobspec.ranktable.walk import COMPLETED, SUPPORTED_VERSIONS, Draft, Invalid, Walk, extract, kind

__all__ = ["MAX_REPORTED_PROBLEMS", "SUPPORTED_VERSIONS", "RankTableError", "RankTableNotReady", "parse_rank_table"]

# parse_rank_table reports at most this many problems; `launcher ranktable validate` shows them all.
MAX_REPORTED_PROBLEMS = 50


class RankTableError(UsageError):
    """The rank table is malformed (exit 2); each problem starts with its JSON path."""


class RankTableNotReady(LauncherError):
    """The cluster has not finished writing the table: ``status`` is not ``completed``.

    Attributes:
        status: The table's ``status`` value.
    """

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


def parse_rank_table(data: Mapping, source: Optional[str] = None,
                     revision: Optional[str] = None) -> RankTable:
    """Parse a rank table already loaded from JSON.

    Args:
        data: The decoded JSON document.
        source: Path the table came from, kept in ``RankTable.source`` and used in messages.
        revision: Content of the sibling ``version`` file, kept in ``RankTable.revision``.

    Returns:
        The table, servers ordered by their first rank and devices by rank.

    Raises:
        RankTableNotReady: ``status`` is a string other than ``completed``.
        RankTableError: anything else is wrong; ``problems`` lists every problem with its JSON path.
    """
    try:
        if not isinstance(data, abc.Mapping):
            raise Invalid(f"$: expected a JSON object, got {kind(data)}")
        status = data.get("status")
        if type(status) is str and status != COMPLETED:
            raise RankTableNotReady(f'rank table{_where(source)} is not ready: status "{status}"', status)
        version, drafts, pods = extract(Walk(strict=True), data)
    except Invalid as exc:
        problems = validate_rank_table(data) or [str(exc)]
        if len(problems) > MAX_REPORTED_PROBLEMS:
            extra = len(problems) - MAX_REPORTED_PROBLEMS
            problems = problems[:MAX_REPORTED_PROBLEMS] + [
                f"... and {extra} more (`launcher ranktable validate` lists them all)"]
        raise RankTableError(f"invalid rank table{_where(source)}", problems) from None
    return RankTable(servers=_assemble(drafts, pods), format_version=version, status=COMPLETED,
                     source=source, revision=revision)


def _where(source: Optional[str]) -> str:
    return f" {source}" if source else ""


def _assemble(drafts: List[Draft], pods: Dict[str, str]) -> Tuple[ServerEntry, ...]:
    servers = []
    for draft in drafts:
        devices = tuple(sorted(draft.devices, key=lambda d: d.rank_id))
        servers.append(ServerEntry(draft.server_id, devices, draft.host_ip, draft.container_ip,
                                   pods.get(draft.server_id)))
    servers.sort(key=lambda s: s.devices[0].rank_id)
    return tuple(servers)
