"""Why a rank failed, from what it left behind: torch's error file, else a traceback in its log.

torch's ``@record`` (``torch.distributed.elastic.multiprocessing.errors``) writes the uncaught
exception as JSON to ``$TORCHELASTIC_ERROR_FILE``; torchrun prints that traceback in its failure
summary. The launcher sets the same variable per rank and attempt and reads the file the same way,
so a script written for torchrun explains itself under the launcher too. Scripts without ``@record``
still print their traceback to stderr, which is in the rank's log: the last one found is the next
best explanation. Every read is bounded: a rank can leave a huge file or log behind.
"""

import logging
import os
from typing import List, Optional, Sequence, Tuple

from launcher.common.inputfiles import loads_json, read_bytes
from launcher.common.records import record

log = logging.getLogger(__name__)

#: The first line of every Python traceback.
TRACEBACK_HEADER = "Traceback (most recent call last):"
#: At most this much of an error file is read (torch's are a few KiB).
MAX_ERROR_FILE_BYTES = 1 << 20
#: How far back from the end of a rank's log a traceback is looked for.
LOG_WINDOW_BYTES = 1 << 16
#: Longest traceback shown; the frames nearest the exception are kept.
MAX_TRACEBACK_LINES = 40


@record(frozen=True)
class RankError:
    """A rank's exception as it recorded or printed it.

    Attributes:
        message: ``ExceptionType: text``, or torch's plain message for the newer string format.
        traceback: The traceback's lines, header to exception (empty when the file has none).
        source: The file it was read from.
    """

    message: str
    traceback: Tuple[str, ...]
    source: str


def read_error_file(path: str) -> Optional[RankError]:
    """torch's error file at ``path``, or None when missing, empty, oversized or not torch's format.

    Both of torch's formats are understood: ``{"message": {"message": ..., "extraInfo":
    {"py_callstack": ...}}}`` (what ``@record`` writes) and ``{"message": "text"}``.
    """
    try:  # the one reader: a FIFO or device is refused at once, the size is bounded
        data = read_bytes(path, "error file", MAX_ERROR_FILE_BYTES)
    except (OSError, ValueError):
        return None
    if not data:
        return None
    try:
        message = loads_json(data.decode("utf-8", "replace").encode(), path, "error file")["message"]
        if isinstance(message, str):
            return RankError(message, (), path)
        callstack = message.get("extraInfo", {}).get("py_callstack", "")
        text = str(message["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.debug("ignoring %s: not torch's error-file format", path)
        return None
    return RankError(text, clip(str(callstack).splitlines()), path)


def last_traceback(path: str, window: int = LOG_WINDOW_BYTES) -> Optional[RankError]:
    """The last complete Python traceback in the final ``window`` bytes of a log, or None."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - window))
            lines = fh.read(window).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK_HEADER)]
    for start in reversed(starts):
        block = _traceback_block(lines, start)
        if block:
            return RankError(block[-1], clip(block), path)
    return None


def _traceback_block(lines: Sequence[str], start: int) -> List[str]:
    """Header, indented frames, then the first unindented line (the exception); [] if cut short."""
    for end in range(start + 1, len(lines)):
        line = lines[end]
        if line and not line[0].isspace():
            return list(lines[start:end + 1])
    return []


def clip(lines: Sequence[str], limit: int = MAX_TRACEBACK_LINES) -> Tuple[str, ...]:
    """At most ``limit`` lines: the header and the frames nearest the exception, with a marker."""
    if len(lines) <= limit:
        return tuple(lines)
    kept = limit - 2
    return (lines[0], f"... {len(lines) - 1 - kept} line(s) omitted ...", *lines[-kept:])


def explain_failure(error_file: Optional[str], log_path: Optional[str]) -> Optional[RankError]:
    """The best explanation a failed rank left: its error file, else the last traceback in its log."""
    found = read_error_file(error_file) if error_file else None
    if found is None and log_path:
        found = last_traceback(log_path)
    return found
