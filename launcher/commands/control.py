"""``launcher prestop``, ``launcher exit`` and ``launcher jobs``: find a job, talk to its supervisor."""

import json
from typing import Optional

import click

from launcher.common.errors import LauncherError
from launcher.commands.optiontypes import SignalType

_RUN_DIR = click.option("--run-dir", type=click.Path(file_okay=False), envvar="LAUNCHER_RUN_DIR",
                        show_envvar=True, help="The run dir of the `launcher run` to address.")
_JOB = click.option("--job", help="The job's name under the base dir (see `launcher jobs`). Default: the "
                                  "only running job.")


@click.command()
@_RUN_DIR
@_JOB
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Without a live supervisor: seconds ranks get before SIGKILL (default: what is left of "
                   "the job's gasp timeout).")
@click.option("--signal", "signame", type=SignalType(),
              help="Without a live supervisor: the save signal (default: the job's --gasp-signal).")
def prestop(run_dir: Optional[str], job: Optional[str], timeout: Optional[float], signame: Optional[str]) -> int:
    """Dying gasp: every rank saves its checkpoint; returns when they are done (container preStop).

    Blocks until every rank has exited or was killed at the gasp timeout, then prints one line per rank.
    A supervisor that does not acknowledge within 2 s (stopped, hung) is bypassed: the ranks it
    recorded get the save signal from prestop itself.
    """
    from launcher.control.prestop import prestop as run_prestop

    return run_prestop(run_dir, timeout, signame, job)


@click.command("exit")
@_RUN_DIR
@_JOB
@click.option("--no-wait", is_flag=True, help="Return once the request is accepted.")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up waiting after this many seconds.")
def exit_(run_dir: Optional[str], job: Optional[str], no_wait: bool, timeout: Optional[float]) -> int:
    """Stop the whole job at a step boundary, saving first (graceful exit on request)."""
    from launcher.control.client import NoSupervisor, request
    from launcher.control.prestop import open_run_dir

    rd = open_run_dir(run_dir, job)
    if rd is None:
        raise LauncherError("no launcher is running here", ["pass --run-dir or --job (see `launcher jobs`)"])
    try:
        for answer in request(rd.socket_address(), "exit", timeout=timeout):
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
        raise LauncherError(str(exc), [f"is `launcher run` running with run dir {rd.path}?"]) from None
    finally:
        rd.close()
    raise LauncherError("the launcher closed the connection before the job ended",
                        ["see events.jsonl in the run dir for what happened"])


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON list.")
def jobs(as_json: bool) -> int:
    """List this user's jobs on this machine: running ones and the run dirs kept of ended ones."""
    from launcher.common import jobs as jobs_mod
    from launcher.common.rundir import base_dir

    found = jobs_mod.scan(base_dir())
    if as_json:
        click.echo(json.dumps([job.to_json() for job in found], indent=2))
        return 0
    if not found:
        click.echo(f"no jobs under {base_dir()}")
    for job in found:
        click.echo(job.describe())
    return 0
