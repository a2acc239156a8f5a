"""The click types of ``launcher run``'s options that are the launcher's own (the option table's
``Row.type``): the value is parsed here, once, a mistake is exit 2 with one line.

Kept apart from what they parse with (``launcher.jobspec.options``, ``launcher.commands.torchrun``),
which a run imports without click (``launcher.commands.fastrun``).
"""

import signal
from typing import Any, Optional, Tuple, Union

import click

from launcher.commands import torchrun
from launcher.jobspec.options import parse_rank_filter, parse_rank_list, parse_signal


class NprocType(click.ParamType):
    """``--nproc-per-node``: a count, or torchrun's ``cpu`` / ``auto``, or ``npu`` (Ascend devices)."""

    name = "N"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int):
            count = value
        elif str(value).strip().isdigit():
            count = int(value)
        else:
            word = str(value).strip().lower()
            if word not in ("auto", "cpu", "npu"):
                self.fail(f"{value!r}: expected a number of processes, auto, cpu or npu "
                          "(the launcher does not count GPUs: pass their number)", param, ctx)
            npus = torchrun.npu_count()
            if word == "npu" and not npus:
                self.fail("npu: no Ascend devices (/dev/davinci<N>) on this machine", param, ctx)
            count = npus if word == "npu" or (word == "auto" and npus) else torchrun.cpu_count()
        if count < 1:
            self.fail(f"{value!r} is not at least 1", param, ctx)
        return count


class NnodesType(click.ParamType):
    """``--nnodes``: ``N``, or torchrun's ``MIN:MAX``: an int when both are the same (a fixed
    membership), else the pair ``(MIN, MAX)`` (elastic membership, with ``--coordinator``)."""

    name = "N|MIN:MAX"

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Union[int, Tuple[int, int]]:
        if isinstance(value, (int, tuple)):
            parts = list(value) if isinstance(value, tuple) else [value]
        else:
            try:
                parts = [int(part) for part in str(value).split(":")]
            except ValueError:
                self.fail(f"{value!r} is not a number of nodes", param, ctx)
        if len(parts) > 2 or min(parts) < 1:
            self.fail(f"{value!r}: expected N or MIN:MAX, each at least 1", param, ctx)
        if parts[0] > parts[-1]:
            self.fail(f"{value!r}: MIN is above MAX", param, ctx)
        return parts[0] if len(set(parts)) == 1 else (parts[0], parts[1])


class SignalType(click.ParamType):
    """Click type for a save signal: checked at parse time (``--dry-run`` too); the value is its name."""

    name = "signal"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> str:
        option = param.opts[0] if param is not None and param.opts else "signal"
        return signal.Signals(parse_signal(value, option)).name  # UsageError: one line, exit 2


class ParsedType(click.ParamType):
    """A click type whose value is parsed once, here: ``parse(text)``, a ``UsageError`` for bad text.

    Attributes:
        empty: The value when the option is not given.
    """

    empty: Any = None

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if not isinstance(value, str) and isinstance(value, (tuple, type(None))):
            return value  # already parsed (a mapped torchrun / msrun option)
        return self.parse(str(value))  # UsageError: one line, exit 2 (--dry-run too)


class RankFilterType(ParsedType):
    """``--console-ranks``: None (all), or the ranks shown (``none``: no rank)."""

    name = "ranks"

    def parse(self, text: str) -> Optional[Tuple[int, ...]]:
        ranks = parse_rank_filter(text)
        return None if ranks is None else tuple(ranks)


class RankListType(ParsedType):
    """``--fault-ranks 3,5``: the ranks, sorted."""

    name = "ranks"
    empty: Tuple[int, ...] = ()

    def parse(self, text: str) -> Tuple[int, ...]:
        return parse_rank_list(text)
