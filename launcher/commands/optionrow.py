"""One row of the option table (``launcher.commands.optiontable``): an option of ``launcher run``,
and what it becomes as a click option, an environment variable and a config-file key."""

from dataclasses import field
from typing import Any, Dict, Optional, Tuple

import click

from launcher.commands.optiontypes import ParsedType
from launcher.commands.runargs import INFO, MAPPED, NOT_YET, OWN, REFUSED  # noqa: F401  (defined where run's parsers read them without click)
from launcher.common.records import record
from launcher.jobspec.options import env_var_for

#: A flag: ``--x`` with no value.
FLAG = bool

_STRING = {"type": "string", "minLength": 1}


@record(frozen=True)
class Row:
    """One option of ``launcher run``.

    Attributes:
        name: The parsed value's name: the ``RunOptions`` field and config key of a launcher option
            (``LAUNCHER_<NAME>`` in the environment), ``torchrun_<x>`` / ``msrun_<x>`` for a foreign one.
        type: The click type, ``FLAG`` for a flag, None for text.
        default: The value when the option is not given.
        section: The ``--help`` section of a launcher option; None: hidden (a foreign spelling).
        help: The ``--help`` text.
        torchrun: torchrun's spelling of this option (its help lists it), or "".
        msrun: msrun's spelling, or "".
        spellings: The launcher's own spellings; default ``--<name with dashes>``.
        handling: ``OWN`` for a launcher option, else how the foreign spelling is handled.
        note: For ``INFO`` / ``REFUSED`` / ``NOT_YET``: why, and what to do.
        schema: The JSON schema of the config key; None derives it from ``type``.
        env: Whether ``LAUNCHER_<NAME>`` sets it.
        config: Whether the ``--config`` file may hold it.
        kwargs: More ``click.Option`` arguments (metavar, callback, multiple, ...).
    """

    name: str
    type: Any = None
    default: Any = None
    section: Optional[str] = None
    help: str = ""
    torchrun: str = ""
    msrun: str = ""
    spellings: Tuple[str, ...] = ()
    handling: str = OWN
    note: str = ""
    schema: Optional[Dict[str, Any]] = None
    env: bool = True
    config: bool = True
    kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        """The long spelling the row is known by: the launcher's, else torchrun's, else msrun's."""
        for spelling in self.decls():
            if spelling.startswith("--"):
                return spelling
        return self.decls()[0]

    @property
    def foreign(self) -> bool:
        """A torchrun or msrun spelling the launcher translates, accepts or refuses."""
        return self.handling != OWN

    @property
    def tool(self) -> str:
        """``torchrun`` or ``msrun`` for their spellings, else ``launcher``."""
        return self.name.partition("_")[0] if self.name.startswith(("torchrun_", "msrun_")) else "launcher"

    def decls(self) -> Tuple[str, ...]:
        """The spellings click accepts (underscores and dashes are the same: ``normalize_token``)."""
        if self.spellings:
            return self.spellings
        if self.foreign:
            return tuple(s for s in (self.torchrun or self.msrun,) if s)
        return ("--" + self.name.replace("_", "-"),)

    def envvar(self) -> Optional[str]:
        """``LAUNCHER_<NAME>``, or None."""
        return env_var_for(self.name) if self.env and not self.foreign else None

    def option(self) -> click.Option:
        """The click option of this row."""
        kwargs: Dict[str, Any] = dict(self.kwargs)
        if self.type is FLAG:
            kwargs["is_flag"] = True
        elif self.type is not None:
            kwargs["type"] = self.type
        if self.default is not None:
            kwargs["default"] = self.default
        elif isinstance(self.type, ParsedType) and self.type.empty is not None:
            kwargs["default"] = self.type.empty  # the parsed value of nothing, e.g. ()
            kwargs.setdefault("show_default", False)
        if self.envvar():
            kwargs.update(envvar=self.envvar(), show_envvar=True)
        return click.Option([*self.decls(), self.name], help=self.help or None, hidden=self.section is None,
                            **kwargs)

    def json_schema(self) -> Dict[str, Any]:
        """The config key's schema: ``schema``, else derived from the click type."""
        if self.schema is not None:
            return self.schema
        kind = self.type
        if kind is FLAG:
            return {"type": "boolean"}
        if isinstance(kind, click.Choice):
            return {"enum": list(kind.choices)}
        if isinstance(kind, (click.IntRange, click.FloatRange)):
            doc: Dict[str, Any] = {"type": "integer" if isinstance(kind, click.IntRange) else "number"}
            if kind.min is not None:
                doc["exclusiveMinimum" if kind.min_open else "minimum"] = kind.min
            if kind.max is not None:
                doc["exclusiveMaximum" if kind.max_open else "maximum"] = kind.max
            return doc
        return dict(_STRING)
