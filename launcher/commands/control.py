"""``launcher prestop`` and ``launcher exit``: talk to the supervisor of this container."""

import os
from typing import Optional

import click

from launcher import rundir as rundir_mod
from launcher.errors import LauncherError
from launcher.options import SignalType
from launcher.prestop import open_run_dir

_RUN_DIR = click.option("--run-dir", type=click.Path(file_okay=False), envvar="LAUNCHER_RUN_DIR",
                        show_envvar=True, help="The run dir of the `launcher run` to address (same default).")


@click.command()
@_RUN_DIR
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Without a live supervisor: seconds ranks get before SIGKILL (default: the gasp "
                   "timeout for a 30 s termination grace period).")
@click.option("--signal", "signame", type=SignalType(), default="SIGTERM", help="Without a live supervisor: the save signal.")
def prestop(run_dir: Optional[str], timeout: Optional[float], signame: str) -> int:
    """Dying gasp: every rank saves its checkpoint; returns when they are done (container preStop).

    Blocks until every rank has exited or was killed at the gasp timeout, then prints one line per rank.
    """
    from launcher.prestop import prestop as run_prestop

    return run_prestop(run_dir, timeout, signame)


@click.command("exit")
@_RUN_DIR
@click.option("--no-wait", is_flag=True, help="Return once the request is accepted.")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up waiting after this many seconds.")
def exit_(run_dir: Optional[str], no_wait: bool, timeout: Optional[float]) -> int:
    """Stop the whole job at a step boundary, saving first (graceful exit on request)."""
    from launcher.ctlclient import NoSupervisor, request

    path = open_run_dir(run_dir)
    if path is None:
        raise LauncherError("no launcher run here (run dir missing); pass --run-dir")
    try:
        for answer in request(os.path.join(path, rundir_mod.CONTROL_SOCKET), "exit", timeout=timeout):
            if not answer.get("ok"):
                raise LauncherError(f"the launcher refused: {answer.get('error')}")
            if answer.get("accepted"):
                click.echo("launcher exit: requested; ranks stop at their next step boundary")
                if no_wait:
                    return 0
            if answer.get("done"):
                click.echo(f"launcher exit: job ended ({answer['reason']}, exit {answer['exit_code']})")
                return 0 if answer["exit_code"] == 0 else 1
    except NoSupervisor as exc:
        raise LauncherError(str(exc), ["is `launcher run` running with this --run-dir?"]) from None
    raise LauncherError("the launcher closed the connection before the job ended",
                        ["see events.jsonl in the run dir for what happened"])
