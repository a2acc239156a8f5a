"""Rank tables (``hccl.json``): parse, validate, wait for and generate them.

Parsing (:func:`parse_rank_table`, :func:`load_rank_table`) is fast and dependency-free; the full
JSON Schema check (:func:`validate_rank_table`) imports jsonschema only when called, and waiting
(:func:`wait_for_rank_table`) imports tenacity only when called.

May import: ``launcher.common`` only; ``parse`` -> ``validate`` -> ``walk`` -> ``model``, no cycle.
"""

from launcher.jobspec.ranktable.files import load_rank_table, load_rank_table_document, read_rank_table_file
from launcher.jobspec.ranktable.generate import build_local_table, generate_rank_table
from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry
from launcher.jobspec.ranktable.parse import SUPPORTED_VERSIONS, RankTableError, RankTableNotReady, parse_rank_table
from launcher.jobspec.ranktable.validate import validate_rank_table
from launcher.jobspec.ranktable.wait import wait_for_rank_table

__all__ = [
    "SUPPORTED_VERSIONS",
    "Device",
    "RankTable",
    "RankTableError",
    "RankTableNotReady",
    "ServerEntry",
    "build_local_table",
    "generate_rank_table",
    "load_rank_table",
    "load_rank_table_document",
    "parse_rank_table",
    "read_rank_table_file",
    "validate_rank_table",
    "wait_for_rank_table",
]
