"""``launcher run`` without click: a parser of the command lines users type most, driven by the option
table's generated index (``launcher.commands.optionindex``), so that the ranks start sooner.

Importing click and building the command's options is about a tenth of the launcher's start-up
(docs/benchmarks.md, launch). This parser accepts the plain forms only: ``--opt VALUE``,
``--opt=VALUE``, flags, the table's short spellings (``-m``), torchrun's underscore spellings, values
its option's type takes as they are (digits for a number, one of the choices, a path click's ``Path``
accepts). Anything else (``--help``, a mistake, a value it would have to interpret, an option that
repeats or has a callback, a ``LAUNCHER_*`` variable or ``--config`` file that sets an option, a
launcher option after the command, which click warns about) returns None: the click command parses the
whole command line, so messages and exit codes are click's own. What it accepts it turns into the
same values click would (tests/unit/commands/test_fastrun.py compares the two on generated command
lines), and from there both go through ``launcher.commands.runargs``.
"""

import os
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from launcher.commands.optionindex import ROWS
from launcher.common.envnames import LAUNCHER_CONFIG

_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
#: The index's rows by each spelling, normalized as the click command normalizes (``_`` is ``-``).
_BY_SPELLING = {decl.replace("_", "-"): row for row in ROWS for decl in row["decls"]}


class _Defer(Exception):
    """The click command must parse this command line."""


def parse(args: Sequence[str], environ: Mapping[str, str]) -> Optional[Tuple[Dict[str, Any], List[str]]]:
    """``run``'s option values (every row's name -> value, and ``command``) and the names given (as click
    names them: ``command`` too), as click's ``run`` command would make them; None when the click command
    must parse ``args``."""
    if LAUNCHER_CONFIG in environ or any(row["env"] in environ for row in ROWS if row["env"]):
        return None  # click reads those (and their precedence): not here
    try:
        values, given, index = _options(args)
    except _Defer:
        return None
    marked = index < len(args) and args[index] == "--"
    command = tuple(args[index + 1:] if marked else args[index:])
    if not command or (not marked and any(_is_option(token) for token in command[1:])):
        return None  # no command (click's error), or launcher options after it (click's warning)
    values["command"] = command
    return values, list(dict.fromkeys(given + ["command"]))


def _options(args: Sequence[str]) -> Tuple[Dict[str, Any], List[str], int]:
    """Every option's value (given, else click's for not given), the names given, and where the options
    end in ``args``."""
    values = {row["name"]: row["value"] for row in ROWS if row["exposed"]}
    given: List[str] = []
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] not in ("-", "--"):
        row, value, index = _option(args, index)
        values[row["name"]] = value
        given.append(row["name"])
    return values, given, index


def _option(args: Sequence[str], index: int) -> Tuple[Dict[str, Any], Any, int]:
    """The row of the option at ``args[index]``, its value, and the index after it."""
    token = args[index]
    name, equals, text = token.partition("=") if token.startswith("--") else (token, "", "")
    row = _BY_SPELLING.get(name.replace("_", "-"))
    if row is None or row["kind"] is None:
        raise _Defer
    if row["kind"][0] == "flag":
        if equals:
            raise _Defer
        return row, True, index + 1
    if not equals:
        if index + 1 >= len(args):
            raise _Defer
        text, index = args[index + 1], index + 1
    return row, convert(row["kind"], text), index + 1


def _is_option(token: str) -> bool:
    return token.startswith("--") and token.partition("=")[0].replace("_", "-") in _BY_SPELLING


def convert(kind: Tuple[Any, ...], text: str) -> Any:
    """``text`` as an option of ``kind`` (``launcher.commands.indexgen.kind``) takes it, where click
    would take it the same way.

    Raises:
        _Defer: a value click would refuse, or one it is easier to leave to click.
    """
    if not text or text.startswith("-"):
        raise _Defer
    how = kind[0]
    if how == "text":
        return text
    if how == "count":
        if not _DIGITS.fullmatch(text) or int(text) < 1:
            raise _Defer
        return int(text)
    if how in ("int", "float"):
        return _number(int if how == "int" else float, kind[1:], text)
    if how == "choice":
        if text not in kind[1]:
            raise _Defer
        return text
    if how == "path":
        return _path(text, kind[1], kind[2])
    raise _Defer


def _number(type_: type, bounds: Tuple[Any, ...], text: str) -> Any:
    low, high, low_open, high_open = bounds
    if not (_DIGITS if type_ is int else _DECIMAL).fullmatch(text):
        raise _Defer
    value = type_(text)
    if low is not None and (value <= low if low_open else value < low):
        raise _Defer
    if high is not None and (value >= high if high_open else value > high):
        raise _Defer
    return value


def _path(text: str, file_okay: bool, dir_okay: bool) -> str:
    """click's ``Path`` (no ``exists``) refuses only a path that exists and is of the wrong kind or
    unreadable."""
    if os.path.exists(text):
        is_dir = os.path.isdir(text)
        if (is_dir and not dir_okay) or (not is_dir and not file_okay) or not os.access(text, os.R_OK):
            raise _Defer
    return text


def run(args: Sequence[str]) -> Optional[int]:
    """``launcher run ARGS`` without click: its exit status, or None when the click command must run it.

    The same steps and the same answers as the click command: the launcher's log lines set up as with
    no ``-v``, ``launcher.commands.runargs`` to ``RunOptions``, ``launcher.run.runner.execute``; a
    ``LauncherError`` prints its lines and exits with its code, Ctrl-C is 130.
    """
    parsed = parse(args, os.environ)
    if parsed is None:
        return None
    from launcher.commands.logsetup import setup_logging
    from launcher.common.errors import LauncherError

    setup_logging(0)
    try:
        from launcher.commands.runargs import build_run_options
        from launcher.run.runner import execute

        result = execute(build_run_options(*parsed, os.environ))
    except LauncherError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0
