"""``launcher run [OPTIONS] [--] COMMAND [ARGS]...``: parse, then delegate to ``launcher.run.runner``."""

import logging
from typing import Dict, List, Sequence, Tuple

import click

from launcher.commands import optiontable, torchrun
from launcher.commands.runargs import build_run_options
from launcher.jobspec.options import RunOptions

log = logging.getLogger(__name__)

#: ``launcher run --help`` in sections: title -> the options it shows, by their long name (from the
#: option table; every shown option is in exactly one section, tests/unit/commands/test_cli.py checks it).
HELP_SECTIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = optiontable.help_sections()


def long_name(param: click.Parameter) -> str:
    """The name an option is listed by in ``HELP_SECTIONS``: its first ``--`` spelling."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


class RunCommand(click.Command):
    """``run``: torchrun's and msrun's spellings too, errors in the user's spelling, a warning for
    launcher options after the command, and the help in sections."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        misplaced, program = options_after_command(args, self.params)
        if misplaced:
            verb = "is" if len(misplaced) == 1 else "are"
            log.warning("%s after the command %s passed to %s, not to the launcher: put launcher options before "
                        "%s (or -- before %s if it takes %s itself)", ", ".join(misplaced), verb, program,
                        program, program, "it" if len(misplaced) == 1 else "them")
        typed = typed_spellings(args, self.params)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            respell(exc, typed, self.params)
            raise

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: Dict[str, Tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                records[long_name(param)] = record
        for title, names in HELP_SECTIONS:
            rows = [records.pop(name) for name in names if name in records]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        if records:  # an option not in HELP_SECTIONS yet is still shown
            with formatter.section("Unsorted options"):
                formatter.write_dl(list(records.values()))


def respell(exc: click.UsageError, typed: Dict[str, str], params: Sequence[click.Parameter]) -> None:
    """Name the option in ``exc`` as the user typed it: click reports the normalized token
    (``--worker-num``) where msrun's user wrote ``--worker_num``, and suggests normalized names."""
    if isinstance(exc, (click.NoSuchOption, click.BadOptionUsage)):
        spelling = typed.get(exc.option_name, exc.option_name)
        exc.message = exc.message.replace(exc.option_name, spelling)
        exc.option_name = spelling
        if getattr(exc, "possibilities", None):  # as declared: msrun's with underscores
            declared = {torchrun.normalize_token(o): o for p in params if isinstance(p, click.Option) for o in p.opts}
            exc.possibilities = [declared.get(name, name) for name in exc.possibilities]
    elif isinstance(exc, click.BadParameter) and exc.param is not None and exc.param_hint is None:
        spelled = [typed[torchrun.normalize_token(o)] for o in exc.param.opts if torchrun.normalize_token(o) in typed]
        if spelled:
            exc.param_hint = spelled[:1]


def _takes_value(params: Sequence[click.Parameter]) -> Dict[str, bool]:
    takes_value: Dict[str, bool] = {}
    for param in params:
        if isinstance(param, click.Option):
            for opt in param.opts + param.secondary_opts:
                takes_value[torchrun.normalize_token(opt)] = not (param.is_flag or param.count)
    return takes_value


def command_start(args: Sequence[str], takes_value: Dict[str, bool]) -> Tuple[int, bool]:
    """Where the command starts in ``args``, and whether ``--`` marks it (or nothing follows the options)."""
    index = 0
    while index < len(args):
        token = args[index]
        if token == "--":
            return index, True
        if not token.startswith("-") or token == "-":
            return index, False
        name, equals, _ = token.partition("=")
        index += 2 if takes_value.get(torchrun.normalize_token(name)) and not equals else 1
    return len(args), True


def options_after_command(args: Sequence[str], params: Sequence[click.Parameter]) -> Tuple[List[str], str]:
    """Launcher options written after the command (which receives them), unless ``--`` marks the command.

    Returns:
        The misplaced options as written, and the command's program name.
    """
    takes_value = _takes_value(params)
    index, marked = command_start(args, takes_value)
    if marked:
        return [], ""
    # Long options only: a short one after the command is more likely the command's own (python -m).
    misplaced = [token.partition("=")[0] for token in args[index + 1:]
                 if token.startswith("--") and torchrun.normalize_token(token.partition("=")[0]) in takes_value]
    return list(dict.fromkeys(misplaced)), args[index]


def typed_spellings(args: Sequence[str], params: Sequence[click.Parameter]) -> Dict[str, str]:
    """Normalized option name -> how the user wrote it, for the options before the command."""
    index, _marked = command_start(args, _takes_value(params))
    typed: Dict[str, str] = {}
    for token in args[:index]:
        if token.startswith("-"):
            name = token.partition("=")[0]
            typed.setdefault(torchrun.normalize_token(name), name)
    return typed


def _run(**_kwargs: object) -> int:
    from launcher.run.runner import execute

    return execute(run_options(click.get_current_context()))


# Options after the command belong to the command: `launcher run --x 1 python t.py --y 2`.
run = RunCommand(
    "run", callback=_run, params=[*optiontable.click_options(),
                                  click.Argument(["command"], nargs=-1, required=True, type=click.UNPROCESSED)],
    context_settings={"allow_interspersed_args": False, "show_default": True,
                      "token_normalize_func": torchrun.normalize_token},
    help="""Start one process per rank of this machine, watch them, and restart them all when one fails.

    A COMMAND ending in .py runs with the Python interpreter, as with torchrun; torchrun's and msrun's
    command lines work too (--nproc_per_node, --standalone, --rdzv-endpoint, --worker_num, ...).

    Examples:

      launcher run --nproc-per-node 4 train.py --lr 0.1

      launcher run --rank-table /user/serverid/devindex/config/hccl.json -- python train.py
    """)


def run_options(ctx: click.Context) -> RunOptions:
    """The ``RunOptions`` of a parsed ``run`` command line, torchrun's and msrun's options translated
    (``launcher.commands.runargs``, the fast parser's path too).

    Raises:
        UsageError: options the launcher cannot honour (one line each), a missing ``.py`` script.
    """
    import os

    # Given by the user: on the command line, in the environment or in the --config file (default_map).
    explicit = [name for name in ctx.params
                if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)]
    return build_run_options(dict(ctx.params), explicit, os.environ)
