"""The one reader for every file the cluster or the user hands the launcher.

Rank tables and their ``version`` file, ``reset.json``, ``fault-npus``, ``--config``, ``--groups-file``,
``group_info.pb`` and checkpoint digests all come through here, because each way a file can be wrong
used to crash or hang the launcher somewhere else:

* not a regular file: ``open`` of a FIFO blocks until a writer appears (forever, and SIGTERM cannot
  interrupt it); ``/dev/zero`` never ends. The file is opened with ``O_NONBLOCK`` (so a FIFO opens at
  once) and refused unless ``fstat`` says it is a regular file; symlinks are followed, since ConfigMap
  volumes are made of them;
* too big: every kind of file has a size cap, and at most cap + 1 bytes are ever read;
* too deep: ``[[[...]]]`` made ``json.loads`` and everything walking the result raise RecursionError.
  The nesting is measured on the raw bytes before parsing (JSON) or bounded while composing (YAML);
* not UTF-8 (UTF-16 from a Windows editor, Latin-1), or an integer of more digits than Python converts.

* a number out of range: ``1e999`` is ``inf`` to ``json.loads`` and OverflowError to ``int()``; every
  number read must be finite and within +-2**63 (:data:`MAX_NUMBER`), so that any sum or conversion
  of a few of them stays finite;
* following what it should not: in a directory someone else may control (a run dir read by root,
  a shared ``--sync-dir``), ``follow=False`` opens with ``O_NOFOLLOW`` (a symlink is refused).

Records that do not come from a file (etcd values) go through :func:`loads_json` with the same
bounds. :mod:`launcher.common.inputrecords` adds JSON-lines files (``events.jsonl``: a long line is
skipped, never loaded) and the type checks of the fields a reader uses. docs/inputs.md lists every
reader and what it does with what it cannot use.

Every problem is an :class:`InputFileError` (a ValueError) whose text is one line naming the file.
A missing file is ``FileNotFoundError`` and other system errors are ``OSError``, unchanged: callers
decide what absence means (often: nothing reported yet).
"""

import errno
import os
import re
import stat
import sys
from array import array
from itertools import accumulate
from typing import Any, Optional

KIB = 1024
MIB = 1024 * KIB
#: Size caps. A rank table of 512 servers x 16 devices is 0.7 MiB indented; the reports list at most
#: one entry per rank; ``version``, ``restartType`` and digests are one short line.
LIMIT_RANK_TABLE = 16 * MIB
LIMIT_REPORT = 16 * MIB
LIMIT_CONFIG = 1 * MIB
LIMIT_BINARY = 16 * MIB
LIMIT_LINE = 4 * KIB
#: A record of another node (``--sync-dir`` file, etcd value) or a run-dir state file.
LIMIT_RECORD = 1 * MIB
#: One line of ``events.jsonl`` (a ``gasp_done`` of 1,000 ranks is about 100 KiB).
LIMIT_EVENT_LINE = 1 * MIB
#: Numbers: finite, and ``-MAX_NUMBER <= n <= MAX_NUMBER``.
MAX_NUMBER = 2 ** 63
#: Deepest nesting accepted (rank tables nest 5 levels, reports 3, configs 1-2).
MAX_DEPTH = 64

#: Reasons a writer that has not finished yet can explain (a reader may retry on these).
INCOMPLETE = "incomplete"
#: Every other reason: retrying cannot help.
MALFORMED = "malformed"

_FILE_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))
_UTF8_BOM = b"\xef\xbb\xbf"
_ESCAPE = re.compile(rb"\\.", re.S)
#: Deletes every byte but the JSON nesting brackets and the string quote.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
#: Openers become +1 and closers -1 (as signed bytes) for the running depth.
_SIGNS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")
_TOO_DEEP_RUN = b"\x01" * (MAX_DEPTH + 1)
#: What could be a number out of range: 19+ digits, an exponent of 10 or more, or any positive exponent
#: with a run of 10+ digits (``12345678901.5e9``). Only text with a match is parsed with the (slower)
#: checking hooks; a match inside a string costs time, not a refusal. One ``translate`` and a few
#: substring searches: 10x faster than a regular expression.
_NUMBER_SHAPE = bytes(ord("1") if chr(b).isdigit() and b < 128 else ord("e") if chr(b) in "eE" else
                      ord("+") if b == ord("+") else ord(".") for b in range(256))
_HUGE_SHAPES = (b"1" * 19, b"e11", b"e+11")


def maybe_huge(data: bytes) -> bool:
    """Whether the JSON text ``data`` may hold a number out of range (see :data:`MAX_NUMBER`)."""
    shape = data.translate(_NUMBER_SHAPE)
    if any(pattern in shape for pattern in _HUGE_SHAPES):
        return True
    return (b"e1" in shape or b"e+1" in shape) and b"1" * 10 in shape


class InputFileError(ValueError):
    """A file that cannot be used; ``str(error)`` is one line: ``<what> <path> <problem>``.

    Attributes:
        what: the kind of file, for people (``rank table``, ``config file``).
        path: the file.
        problem: what is wrong, starting with a verb (``is a FIFO (named pipe), not a regular file``).
        reason: :data:`INCOMPLETE` when a writer still busy with the file explains it (empty, cut short),
            else :data:`MALFORMED`.
    """

    def __init__(self, what: str, path: str, problem: str, reason: str = MALFORMED):
        super().__init__(f"{what} {path} {problem}")
        self.what, self.path, self.problem, self.reason = what, path, problem, reason


def brief(text: object, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters: a message must not carry a whole file."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB and limit % MIB == 0 else f"{limit // KIB} KiB"


def open_regular(path: str, what: str, follow: bool = True, dir_fd: Optional[int] = None) -> int:
    """A read-only descriptor of the regular file ``path``; the caller closes it.

    Args:
        path: The file (relative to ``dir_fd`` when given).
        what: The kind of file, for messages.
        follow: Follow a symlink at ``path`` itself (ConfigMap volumes are made of them). False for a
            file in a directory someone else may control: a symlink there is refused.
        dir_fd: A directory descriptor ``path`` is relative to (``openat``).

    Raises:
        FileNotFoundError: there is no such file.
        OSError: it cannot be opened.
        InputFileError: it is not a regular file (a FIFO is refused without waiting for a writer), or
            a symlink and not ``follow``.
    """
    # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; no effect on regular files.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise InputFileError(what, os.fspath(path), "is a symlink, refused here") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _FILE_TYPES if test(mode)), "not a file")
        raise InputFileError(what, os.fspath(path), f"is {kind}, not a regular file")
    return fd


def read_bytes(path: str, what: str, limit: int, follow: bool = True, dir_fd: Optional[int] = None) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes (``follow``, ``dir_fd``: as
    :func:`open_regular`).

    Raises:
        FileNotFoundError: there is no such file.
        OSError: it cannot be opened or read.
        InputFileError: it is not a regular file, or it is larger than ``limit``.
    """
    path = os.fspath(path)
    fd = open_regular(path, what, follow, dir_fd)
    try:
        size = os.fstat(fd).st_size
        too_big = InputFileError(what, path, f"is larger than {_size(limit)}, the limit for a {what}")
        if size > limit:
            raise too_big
        chunks, total = [], 0
        while total <= limit:  # st_size is only a hint: the file may grow, or be a /proc file (0)
            chunk = os.read(fd, min(max(size + 1 - total, 64 * KIB), limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise too_big
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode_text(data: bytes, path: str, what: str) -> str:
    """``data`` as strict UTF-8 (a UTF-8 byte-order mark is skipped).

    Raises:
        InputFileError: UTF-16/UTF-32 text, or bytes that are not UTF-8; the message says which
            byte and line. A multi-byte character cut by the end of the data is :data:`INCOMPLETE`.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise InputFileError(what, path, f"is {encoding} text (it starts with a {encoding} byte-order "
                                 "mark); save it as UTF-8")
    try:
        return data.decode("utf-8-sig" if data.startswith(_UTF8_BOM) else "utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        cut = exc.end == len(data) and exc.reason == "unexpected end of data"
        raise InputFileError(what, path, f"is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}, "
                             f"line {line}: {exc.reason})", INCOMPLETE if cut else MALFORMED) from None


def nests_too_deep(data: bytes) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects deeper than :data:`MAX_DEPTH` levels.

    Brackets inside strings do not count. Linear and mostly in C (about a millisecond for a rank
    table of 8,192 devices): the parser itself recurses, so this must run before it. For malformed
    text the answer still holds for whatever prefix a parser would accept.
    """
    if b"\\" in data:  # an escaped quote must not end a string
        data = _ESCAPE.sub(b"", data)
    skeleton = data.translate(None, _NOT_STRUCTURE)
    # Once string contents are deleted, '""' is an empty string or the end of one string and the
    # start of the next with no bracket in between: dropping it never moves a bracket in or out.
    skeleton = skeleton.replace(b'""', b"")
    if b'"' in skeleton:  # some strings hold brackets: keep what lies outside them
        skeleton = b"".join(skeleton.split(b'"')[0::2])
    if len(skeleton) <= MAX_DEPTH:
        return False
    signs = skeleton.translate(_SIGNS)
    return _TOO_DEEP_RUN in signs or max(accumulate(array("b", signs)), default=0) > MAX_DEPTH


def loads_json(data: bytes, path: str, what: str) -> Any:
    """Parse the JSON ``data`` read from ``path``, within :data:`MAX_DEPTH` levels and number bounds.

    Raises:
        InputFileError: empty, not UTF-8, nested too deep, not JSON (with line and column), an
            integer too long to convert, or a number out of range (``1e999``, ``NaN``, 2**64).
    """
    import json

    text = decode_text(data, path, what)
    if not text.strip():
        raise InputFileError(what, path, "is empty", INCOMPLETE)
    if nests_too_deep(data):
        raise InputFileError(what, path, f"nests arrays or objects deeper than {MAX_DEPTH} levels")
    try:
        if not maybe_huge(data):  # the C parser's own number conversion is 2-3x faster
            return json.loads(text, parse_constant=refuse_constant)
        return json.loads(text, parse_int=_checked_int, parse_float=_checked_float, parse_constant=refuse_constant)
    except json.JSONDecodeError as exc:
        # A writer cut short and a real mistake look alike; the caller decides whether to wait.
        raise InputFileError(what, path, f"is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}",
                             INCOMPLETE) from None
    except OutOfRange as exc:
        raise InputFileError(what, path, str(exc)) from None
    except ValueError as exc:  # int(): more digits than sys.get_int_max_str_digits()
        raise InputFileError(what, path, value_problem(text, exc)) from None


class OutOfRange(ValueError):
    """A number JSON or YAML can write that the launcher refuses; the text is the problem."""

    def __init__(self, number: str):
        super().__init__(f"holds a number out of range ({brief(number, 40)}): numbers must be finite and "
                         f"within +-2**63")


def _checked_int(text: str) -> int:
    value = int(text)  # ValueError beyond sys.get_int_max_str_digits(): reported as such
    if -MAX_NUMBER <= value <= MAX_NUMBER:
        return value
    raise OutOfRange(text)


def _checked_float(text: str) -> float:
    value = float(text)
    if -MAX_NUMBER <= value <= MAX_NUMBER:  # False for inf and nan
        return value
    raise OutOfRange(text)


def refuse_constant(text: str) -> None:
    raise OutOfRange(text)  # NaN, Infinity, -Infinity: not JSON, but json.loads takes them


def value_problem(text: str, exc: ValueError) -> str:
    """One line for a ValueError of a parser's value conversion (usually an over-long integer)."""
    limit = sys.get_int_max_str_digits()
    match = re.search(r"\d{%d,}" % (limit + 1), text)
    if match is None:
        return f"holds a value that cannot be converted ({brief(exc)})"
    return f"has an integer of more than {limit} digits at line {text.count(chr(10), 0, match.start()) + 1}"


def read_json(path: str, what: str, limit: int, follow: bool = True, dir_fd: Optional[int] = None) -> Any:
    """The parsed JSON file ``path`` (see :func:`read_bytes` and :func:`loads_json`)."""
    return loads_json(read_bytes(path, what, limit, follow, dir_fd), os.fspath(path), what)


def loads_record(data: bytes, where: str, what: str) -> Any:
    """A JSON record that does not come from a file (an etcd value): as :func:`loads_json`, within
    :data:`LIMIT_RECORD` bytes.

    Raises:
        InputFileError: too big, or as :func:`loads_json`.
    """
    if len(data) > LIMIT_RECORD:
        raise InputFileError(what, where, f"is larger than {_size(LIMIT_RECORD)}, the limit for a {what}")
    return loads_json(data, where, what)


def read_record(path: str, what: str, dir_fd: Optional[int] = None) -> Any:
    """A JSON record in a directory someone else may control (a run dir, ``--sync-dir``): as
    :func:`read_json` within :data:`LIMIT_RECORD`, a symlink refused.

    Raises:
        FileNotFoundError, OSError, InputFileError: as :func:`read_json`.
    """
    return read_json(path, what, LIMIT_RECORD, follow=False, dir_fd=dir_fd)


def read_line(path: str, what: str, limit: int = LIMIT_LINE) -> Optional[str]:
    """The stripped one-line text file ``path``; None when it is empty.

    Raises:
        FileNotFoundError, OSError: as :func:`read_bytes`.
        InputFileError: not a regular file, too big, not UTF-8, or holding control characters
            (several lines, NUL bytes) after stripping.
    """
    path = os.fspath(path)
    text = decode_text(read_bytes(path, what, limit), path, what).strip()
    if not text.isprintable():
        bad = next(ch for ch in text if not ch.isprintable())
        raise InputFileError(what, path, f"is not one line of text (it holds {bad!r})")
    return text or None
