"""Writes ``launcher/commands/optionindex.py``: the option table (``launcher.commands.optiontable``)
as plain data, which ``launcher run`` reads without importing click.

Derived from the rows and their click options, never written by hand:
``python -m launcher.commands.indexgen > launcher/commands/optionindex.py`` after a change to the table
(tests/unit/commands/test_fastrun.py checks that the file is what this prints). Each row says how the
fast parser (``launcher.commands.fastrun``) converts a value given on the command line (``kind``; None:
it hands the whole command line to click), what click makes of it when not given (``value``), and what
``launcher.commands.runargs`` needs of a torchrun or msrun spelling.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

import click

from launcher.commands.optionrow import FLAG, Row
from launcher.commands.optiontypes import NnodesType, NprocType

_HEAD = '''"""Generated from launcher/commands/optiontable.py by ``python -m launcher.commands.indexgen``: do not edit.

The option table as plain data for ``launcher run``'s fast parser (``launcher.commands.fastrun``) and
``launcher.commands.runargs``, importable without click (launcher.commands.indexgen says what each key means).
"""

ROWS = (
'''


def kind(row: Row, option: click.Option) -> Optional[Tuple[Any, ...]]:
    """How the fast parser converts the row's value: ``("flag",)``, ``("text",)``, ``("count",)`` (a number
    at least 1), ``("int" | "float", min, max, min_open, max_open)``, ``("choice", choices)``,
    ``("path", file_okay, dir_okay)``; None: only click parses it (a callback checks it, it repeats, it
    is parsed by a type of its own)."""
    if option.callback is not None or option.multiple or option.is_eager or option.count:
        return None
    kind_of = option.type
    if row.type is FLAG:
        return ("flag",)
    if isinstance(kind_of, (NprocType, NnodesType)):
        return ("count",)
    if isinstance(kind_of, click.types.StringParamType):
        return ("text",)
    if isinstance(kind_of, (click.IntRange, click.FloatRange)):
        return ("int" if isinstance(kind_of, click.IntRange) else "float", kind_of.min, kind_of.max,
                kind_of.min_open, kind_of.max_open)
    if isinstance(kind_of, click.types.IntParamType):
        return ("int", None, None, False, False)
    if isinstance(kind_of, click.Choice):
        return ("choice", tuple(kind_of.choices))
    if isinstance(kind_of, click.Path):
        return ("path", kind_of.file_okay, kind_of.dir_okay)
    return None


def defaults() -> Dict[str, Any]:
    """What click makes of every option that is not given: its default, through its type and callback
    (``console_ranks``' ``all`` is None), in an environment without ``LAUNCHER_*`` variables."""
    from launcher.commands.run import run

    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("LAUNCHER_")}
    try:
        params = dict(run.make_context("run", ["x"]).params)
    finally:
        os.environ.update(saved)
    params.pop("command")
    return params


def rows() -> List[Dict[str, Any]]:
    """Every row of the table as the index holds it."""
    from launcher.commands.optiontable import ROWS

    values = defaults()
    index = []
    for row in ROWS:
        option = row.option()
        index.append({"name": row.name, "decls": tuple(option.opts + option.secondary_opts),
                      "kind": kind(row, option), "env": row.envvar(), "value": values.get(row.name),
                      "exposed": option.expose_value, "default": row.default, "handling": row.handling,
                      "tool": row.tool, "flag": row.flag, "note": row.note})
    return index


def index_text() -> str:
    """``launcher/commands/optionindex.py`` as it must read."""
    lines = [f"    {{{', '.join(f'{key!r}: {value!r}' for key, value in row.items())}}}," for row in rows()]
    return _HEAD + "\n".join(lines) + "\n)\n"


def main() -> None:
    """Print the generated ``launcher/commands/optionindex.py``."""
    print(index_text(), end="")


if __name__ == "__main__":
    main()
