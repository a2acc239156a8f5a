"""The one reader's part for records: JSON-lines files and the types of a record's fields.

:mod:`launcher.common.inputfiles` opens, bounds and parses one file; this adds what records need on
top: ``events.jsonl`` read in blocks of whole lines (a 200 MB line is skipped while it is read, never
held: ``launcher status`` took 795 MB on one), and :func:`typed`, the one check that a field a reader
uses has the type it converts (``{"rank": [1]}`` made ``set.discard`` raise TypeError in
``goodput``; ``"ts": "x"`` a ValueError in ``float``). Kept light: ``launcher status`` and
``launcher prestop`` import it (json and os only).
"""

import os
from typing import Any, Dict, Iterator, List, Optional

from launcher.common.inputfiles import (LIMIT_EVENT_LINE, MIB, InputFileError, loads_json, nests_too_deep,
                                        maybe_huge, open_regular, refuse_constant)


class JsonLines:
    """The JSON objects of a JSON-lines file (``events.jsonl``), read in blocks of whole lines.

    Memory stays bounded whatever the file holds: a line longer than ``line_limit`` is skipped while
    it is read, never held whole. Lines that are not a JSON object within the bounds of
    :func:`loads_json` are skipped too; :attr:`skipped` counts both.

    Args:
        path: The file (relative to ``dir_fd`` when given); opened as :func:`open_regular` does.
        what: The kind of file, for messages.
        follow: Follow a symlink at ``path``.
        line_limit: The longest line kept, in bytes.
        block: Bytes read at a time.
    """

    def __init__(self, path: str, what: str, follow: bool = False, dir_fd: Optional[int] = None,
                 line_limit: int = LIMIT_EVENT_LINE, block: int = 4 * MIB):
        self.path, self.what, self.follow, self.dir_fd = os.fspath(path), what, follow, dir_fd
        self.line_limit, self.block = line_limit, block
        self.skipped = 0

    def blocks(self) -> Iterator[bytes]:
        """Blocks of whole lines (the last line of the file even without its newline), in file order.

        Raises:
            FileNotFoundError, OSError, InputFileError: as :func:`open_regular` (at once, not when
                the first block is asked for).
        """
        # A file object, not a bare fd: it is closed even if the blocks are never asked for.
        return self._blocks(os.fdopen(open_regular(self.path, self.what, self.follow, self.dir_fd), "rb", buffering=0))

    def _blocks(self, fh: Any) -> Iterator[bytes]:
        with fh:
            carry, dropping = b"", False
            while True:
                chunk = fh.read(self.block)
                if not chunk:
                    break
                if dropping:  # inside an over-long line: skip to its end
                    end = chunk.find(b"\n")
                    if end < 0:
                        continue
                    chunk, dropping = chunk[end + 1:], False
                data = carry + chunk
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if len(carry) > self.line_limit:
                    carry, dropping = b"", True
                    self.skipped += 1
                if cut:
                    yield data[:cut]
            if carry.strip() and not dropping:
                yield carry

    def parse(self, block: bytes) -> List[dict]:
        """The JSON objects of the lines of ``block`` (skipped lines counted in :attr:`skipped`)."""
        import json

        lines = [line for line in block.split(b"\n") if line and not line.isspace()]
        if not lines:
            return []
        if max(map(len, lines)) <= self.line_limit:
            joined = b"[" + b",".join(lines) + b"]"  # one json.loads for all: per line costs 3x more
            try:
                if not maybe_huge(joined) and not nests_too_deep(joined[1:-1]):
                    parsed = json.loads(joined.decode("utf-8"), parse_constant=refuse_constant)
                    if all(type(item) is dict for item in parsed):
                        return parsed
            except ValueError:  # also UnicodeDecodeError: some line needs a closer look
                pass
        found = []
        for line in lines:
            try:
                item = loads_json(line, self.path, self.what) if len(line) <= self.line_limit else None
            except InputFileError:
                item = None
            if type(item) is dict:
                found.append(item)
            else:
                self.skipped += 1
        return found

    def objects(self) -> List[dict]:
        """Every JSON object of the file, in order ([] without the file).

        Raises:
            OSError, InputFileError: as :func:`open_regular`.
        """
        try:
            blocks = self.blocks()
        except FileNotFoundError:
            return []
        return [item for block in blocks for item in self.parse(block)]


#: Field types for :func:`typed`: ``type(value)`` must be one of them exactly (``True`` is no int).
INT = (int,)
NUMBER = (int, float)
TEXT = (str,)
OR_NONE = (type(None),)
#: A list of integers.
INTS = "a list of integers"


def typed(record: Dict[str, Any], fields: Dict[str, Any]) -> Optional[str]:
    """Why ``record`` cannot be used, or None: each of ``fields`` it holds has one of its types.

    Args:
        record: A parsed JSON object.
        fields: Field -> a tuple of types (:data:`INT`, :data:`NUMBER`, :data:`TEXT`, ``+ OR_NONE``)
            or :data:`INTS`. Fields a record lacks are the reader's to default.
    """
    for name, value in record.items():  # records hold a few fields, tables more
        kinds = fields.get(name)
        if kinds is None:
            continue
        if kinds is INTS:
            if type(value) is not list or any(type(item) is not int for item in value):
                return f"its {name!r} is not {INTS}"
        elif type(value) not in kinds:
            wanted = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            return f"its {name!r} is {type(value).__name__}, not {wanted}"
    return None
