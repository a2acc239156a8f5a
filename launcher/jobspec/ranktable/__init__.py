"""Rank tables (``hccl.json``): parse, validate, wait for and generate them.

Parsing (:func:`parse_rank_table`, :func:`load_rank_table`) is fast and dependency-free; the full
JSON Schema check (:func:`validate_rank_table`) imports jsonschema only when called, and waiting
(:func:`wait_for_rank_table`) imports tenacity only when called.

The names below load their module on first use (PEP 562): a run without a rank table imports only
``model`` and ``generate`` on its way to the first rank, not the parser, the walk and the schema
check (about 5 ms of the launcher's start-up, docs/benchmarks.md, launch).

May import: ``launcher.common`` only; ``parse`` -> ``validate`` -> ``walk`` -> ``model``, no cycle.
"""

import importlib
from typing import Any

#: Exported name -> the module of this package that defines it.
_EXPORTS = {
    "load_rank_table": "files", "load_rank_table_document": "files", "read_rank_table_file": "files",
    "build_local_table": "generate", "generate_rank_table": "generate",
    "Device": "model", "RankTable": "model", "ServerEntry": "model",
    "SUPPORTED_VERSIONS": "parse", "RankTableError": "parse", "RankTableNotReady": "parse",
    "parse_rank_table": "parse",
    "validate_rank_table": "validate",
    "wait_for_rank_table": "wait",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
