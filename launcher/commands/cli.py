"""The ``launcher`` command group: thin click commands that parse and delegate.

Subcommands are imported only when invoked, so ``launcher --help`` and ``launcher run`` do not pay
for jsonschema, yaml or protobuf. Errors become exit codes here and nowhere else: ``UsageError`` ->
2, ``LauncherError`` -> 1, one line per problem, never a traceback for a user mistake.
"""

import importlib
from typing import Dict, List, Optional

import click

from launcher import __version__
from launcher.commands.logsetup import setup_logging
from launcher.common.errors import LauncherError

_COMMANDS: Dict[str, str] = {
    "run": "launcher.commands.run:run",
    "prestop": "launcher.commands.control:prestop",
    "exit": "launcher.commands.control:exit_",
    "jobs": "launcher.commands.control:jobs",
    "plan": "launcher.commands.plan:plan",
    "ranktable": "launcher.commands.ranktable:ranktable",
    "status": "launcher.commands.status:status",
    "report": "launcher.commands.report:report",
}

_HELP: Dict[str, str] = {
    "run": "Start, supervise and restart the ranks of a training job.",
    "prestop": "Make every rank save its dying-gasp checkpoint (container preStop).",
    "exit": "Ask the running job to save and stop at a step boundary.",
    "jobs": "List this user's running and recent jobs on this machine.",
    "plan": "Print the restore plan a (re)start would use, without starting anything.",
    "ranktable": "Show, validate and generate rank tables (hccl.json).",
    "status": "Show a job's ranks, restarts left, restore plan, cluster holds and goodput.",
    "report": "Draw a finished run's timeline as one self-contained HTML file.",
}


class LazyGroup(click.Group):
    """A group whose subcommands live in their own modules and load on first use."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None  # a command whose module is not part of this build
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help must not import every subcommand (and its dependencies).
        with formatter.section("Commands"):
            formatter.write_dl([(name, _HELP[name]) for name in sorted(_COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="launcher")
@click.option("-v", "--verbose", count=True, help="More launcher log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Resilient launcher for distributed training (PyTorch, MindSpore, TensorFlow)."""
    setup_logging(verbose)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI and return the process exit status instead of raising."""
    try:
        # With standalone_mode=False click returns the command's return value: commands that
        # supervise a job return its exit status (e.g. the failed rank's code).
        result = cli.main(args=argv, prog_name="launcher", standalone_mode=False)
    except LauncherError as exc:
        for line in exc.lines():
            click.echo(line, err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("launcher: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0
