"""Entry point for ``launcher`` and ``python -m launcher``.

For ``run`` the signal handlers are installed before anything else is imported, so a SIGTERM that
arrives while the launcher is still starting is recorded and honoured, never lost.

``run`` parses the command lines users type most without click (``launcher.commands.fastrun``, about
a tenth of the launcher's start-up); anything else it is given goes to the click command. Two more
commands skip click when they can: ``prestop`` (a preStop hook's gasp starts sooner) and
``status`` with only ``--run-dir``, ``--job`` and ``--json`` (it must answer in under 100 ms, and
importing click and the command group cost more than the answer). Anything else they are given
(``--help``, ``--watch``, a bad option, a run dir that is a file) goes to the click command, so the
messages and exit codes of mistakes are click's own.
"""

import sys
from typing import List, Optional, Tuple


def main(argv: Optional[List[str]] = None) -> None:
    """Run the launcher CLI and exit with its status."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:
        from launcher.common import gcpause, signals

        signals.install()
        gcpause.pause_for_startup()  # until the first ranks run (launcher.run.session)
        from launcher.commands import fastrun  # the usual command lines without click: ranks start sooner

        code = fastrun.run(args[1:])
        if code is not None:
            sys.exit(code)
    if args == ["prestop"]:
        # What a preStop hook runs: skip click and the CLI so the gasp starts sooner.
        sys.exit(_fast_prestop())
    if args[:1] == ["status"]:
        status_args = fast_status_args(args[1:])
        if status_args is not None:
            sys.exit(_fast_status(*status_args))
    from launcher.commands.cli import main as cli_main

    sys.exit(cli_main(args))


def _fast_prestop() -> int:
    from launcher.common.errors import LauncherError
    from launcher.control.prestop import prestop

    try:
        return prestop()
    except LauncherError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return exc.exit_code


def fast_status_args(args: List[str]) -> Optional[Tuple[Optional[str], Optional[str], bool]]:
    """``(run_dir, job, as_json)`` of ``launcher status`` options, or None when the click command must
    parse them: anything but ``--run-dir DIR``, ``--job NAME``, ``--json`` (also ``--opt=value``; the
    last one given wins, as with click), a value that is missing, empty or looks like an option, or a
    run dir (``--run-dir`` or ``LAUNCHER_RUN_DIR``) click's ``Path(file_okay=False)`` would refuse."""
    import os

    values = {"--run-dir": None, "--job": None}
    as_json, rest = False, list(args)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if arg == "--json":
            as_json = True
        elif name in values:
            if not eq:
                value = rest.pop(0) if rest else ""
            if not value or value.startswith("-"):
                return None
            values[name] = value
        else:
            return None
    run_dir = values["--run-dir"] or os.environ.get("LAUNCHER_RUN_DIR") or None
    if run_dir is not None and os.path.exists(run_dir) and not (os.path.isdir(run_dir)
                                                                and os.access(run_dir, os.R_OK)):
        return None
    return values["--run-dir"], values["--job"], as_json


def _fast_status(run_dir: Optional[str], job: Optional[str], as_json: bool) -> int:
    from launcher.common.errors import LauncherError
    from launcher.monitoring.status import find_run_dir, render

    try:
        text = render(find_run_dir(run_dir, job), as_json)
    except LauncherError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    main()
