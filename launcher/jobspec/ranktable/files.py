"""Rank table files: read ``hccl.json`` and its sibling ``version`` file, report unreadable ones.

Both go through :mod:`launcher.common.inputfiles` (regular files only, size and nesting bounds, strict
UTF-8). The cluster rewrites the table in place, so a read can meet a half-written file: the
low-level :func:`read_rank_table_file` lets those errors through for :mod:`launcher.jobspec.ranktable.wait`
to retry; :func:`load_rank_table_document` turns each into one clear :class:`RankTableError`.
"""

from pathlib import Path
from typing import Any, Optional, Tuple, Union

from launcher.common.inputfiles import LIMIT_RANK_TABLE, InputFileError, read_json, read_line
from launcher.jobspec.ranktable.model import RankTable
from launcher.jobspec.ranktable.parse import RankTableError, parse_rank_table

RANK_TABLE = "rank table"
VERSION_FILE = "version"
VERSION = "rank table version file"


def read_version(table_path: Union[str, Path]) -> Optional[str]:
    """The stripped content of the ``version`` file beside ``table_path``; None when there is none.

    Raises:
        InputFileError: it cannot be read, is not a regular file, too big, not UTF-8 or not one
            line; the message names the version file, not the table.
    """
    path = Path(table_path).parent / VERSION_FILE
    try:
        return read_line(path, VERSION)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputFileError(VERSION, str(path), f"cannot be read ({exc.strerror or exc})") from None


def read_rank_table_file(path: Union[str, Path]) -> Tuple[Any, Optional[str]]:
    """Decode the JSON file ``path`` and read its sibling ``version`` file.

    Returns:
        The decoded document and the stripped content of ``version`` (None when there is none).

    Raises:
        OSError: the file cannot be read (FileNotFoundError when it does not exist).
        InputFileError: the table or its version file is not a regular file, too big, not UTF-8
            (or was cut inside a character mid-write), too deeply nested, or not JSON (or is
            half-written); ``reason`` says whether a writer still at work can explain it.
    """
    # The revision is read first: if the table is rewritten in between, we pair a newer table with
    # an older revision (a later reload is merely redundant), never the reverse (a missed reload).
    revision = read_version(path)
    return read_json(path, RANK_TABLE, LIMIT_RANK_TABLE), revision


def load_rank_table_document(path: Union[str, Path]) -> Tuple[Any, Optional[str]]:
    """Like :func:`read_rank_table_file`, with every failure reported as a RankTableError.

    Raises:
        RankTableError: the file (or its version file) is missing, unreadable, not UTF-8 or not
            JSON (the message gives the line and column), too big or too deep.
    """
    try:
        return read_rank_table_file(path)
    except FileNotFoundError:
        raise RankTableError(f"{RANK_TABLE} {path} not found") from None
    except OSError as exc:
        raise RankTableError(f"cannot read {RANK_TABLE} {path}: {exc.strerror or exc}") from None
    except InputFileError as exc:
        raise RankTableError(str(exc)) from None


def load_rank_table(path: Union[str, Path]) -> RankTable:
    """Read and parse the rank table file ``path`` (UTF-8 JSON) and its sibling ``version`` file.

    Raises:
        RankTableError: the file is missing, unreadable, not JSON (the message gives line and
            column) or not a valid table.
        RankTableNotReady: the table's ``status`` is not ``completed``.
    """
    data, revision = load_rank_table_document(path)
    return parse_rank_table(data, source=str(path), revision=revision)
