"""Entry point for ``launcher`` and ``python -m launcher``.

For ``run`` the signal handlers are installed before anything else is imported, so a SIGTERM that
arrives while the launcher is still starting is recorded and honoured, never lost.
"""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> None:
    """Run the launcher CLI and exit with its status."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:
        from launcher.common import signals

        signals.install()
    if args == ["prestop"]:
        # What a preStop hook runs: skip click and the CLI so the gasp starts sooner.
        sys.exit(_fast_prestop())
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


if __name__ == "__main__":
    main()
