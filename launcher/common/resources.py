"""Locate the data files shipped with the launcher (JSON Schemas, the group_info .proto).

The canonical copies live in the repository's top-level ``schemas/``; an installed wheel carries them
as package data under ``launcher/schemas`` (a symlink in the source tree).
"""

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # launcher/, above common/


def schema_dir() -> Path:
    """Directory holding the JSON Schemas and .proto files."""
    for candidate in (_PACKAGE_DIR / "schemas", _PACKAGE_DIR.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("launcher schemas directory not found; reinstall the package")


def schema_path(name: str) -> Path:
    """Path of the schema file ``name`` (e.g. ``ranktable-1.0.schema.json``)."""
    return schema_dir() / name


@lru_cache(maxsize=None)
def load_schema(name: str) -> Dict[str, Any]:
    """Parsed JSON Schema ``name``, cached for the life of the process."""
    with open(schema_path(name), encoding="utf-8") as fh:
        return json.load(fh)
