"""Rank table files: read ``hccl.json`` and its sibling ``version`` file, report unreadable ones.

The cluster rewrites the file in place, so a read can meet a half-written file: the low-level
:func:`read_rank_table_file` lets those errors through for :mod:`launcher.ranktable.wait` to retry;
:func:`load_rank_table_document` turns each into one clear :class:`RankTableError`.
"""

import json
from pathlib import Path
from typing import Any, Optional, Tuple, Union

from launcher.ranktable.model import RankTable
from launcher.ranktable.parse import RankTableError, parse_rank_table


def read_rank_table_file(path: Union[str, Path]) -> Tuple[Any, Optional[str]]:
    """Decode the JSON file ``path`` and read its sibling ``version`` file.

    Returns:
        The decoded document and the stripped content of ``version`` (None when there is none).

    Raises:
        OSError: the file cannot be read.
        UnicodeDecodeError: the file is not UTF-8 (or was cut inside a character mid-write).
        json.JSONDecodeError: the file is not JSON (or is half-written).
    """
    path = Path(path)
    # The revision is read first: if the table is rewritten in between, we pair a newer table with
    # an older revision (a later reload is merely redundant), never the reverse (a missed reload).
    try:
        revision: Optional[str] = (path.parent / "version").read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        revision = None
    return json.loads(path.read_bytes().decode("utf-8-sig")), revision


def load_rank_table_document(path: Union[str, Path]) -> Tuple[Any, Optional[str]]:
    """Like :func:`read_rank_table_file`, with every failure reported as a RankTableError.

    Raises:
        RankTableError: the file is missing, unreadable, not UTF-8 or not JSON (the message gives
            the line and column).
    """
    try:
        return read_rank_table_file(path)
    except FileNotFoundError:
        raise RankTableError(f"rank table {path} not found") from None
    except OSError as exc:
        raise RankTableError(f"cannot read rank table {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RankTableError(f"rank table {path} is not UTF-8 (bad byte at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        if not exc.doc.strip():
            raise RankTableError(f"rank table {path} is empty") from None
        raise RankTableError(f"rank table {path} is not valid JSON: line {exc.lineno} column {exc.colno}: "
                             f"{exc.msg}") from None


def load_rank_table(path: Union[str, Path]) -> RankTable:
    """Read and parse the rank table file ``path`` (UTF-8 JSON) and its sibling ``version`` file.

    Raises:
        RankTableError: the file is missing, unreadable, not JSON (the message gives line and
            column) or not a valid table.
        RankTableNotReady: the table's ``status`` is not ``completed``.
    """
    data, revision = load_rank_table_document(path)
    return parse_rank_table(data, source=str(path), revision=revision)
