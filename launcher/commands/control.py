"""``launcher prestop`` and ``launcher exit``: talk to the supervisor of this container."""

import os
import signal
from typing import Any, Dict, List, Optional

import click

from launcher import gasp as gasp_mod
from launcher import rundir as rundir_mod
from launcher.errors import LauncherError
from launcher.options import default_run_dir

_RUN_DIR = click.option("--run-dir", type=click.Path(file_okay=False), envvar="LAUNCHER_RUN_DIR",
                        show_envvar=True, help="The run dir of the `launcher run` to address (same default).")


def _open_run_dir(path: Optional[str]) -> Optional[str]:
    """The checked run dir, or None when there is no run at all."""
    path = os.path.abspath(path or default_run_dir())
    try:
        rundir_mod.check_private(path)
    except FileNotFoundError:
        return None
    return path


def _print_gasp(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        if r.get("killed_after_timeout"):
            click.echo(f"{r['label']}: killed after the gasp timeout")
        elif r.get("signal"):
            click.echo(f"{r['label']}: exited by {r['signal']} (code {r['exit_code']})")
        elif r.get("exit_code") is not None:
            click.echo(f"{r['label']}: exited with code {r['exit_code']}")
        else:
            click.echo(f"{r['label']}: exited")


@click.command()
@_RUN_DIR
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Without a live supervisor: seconds ranks get before SIGKILL (default: the gasp "
                   "timeout for a 30 s termination grace period).")
@click.option("--signal", "signame", default="SIGTERM", help="Without a live supervisor: the save signal.")
def prestop(run_dir: Optional[str], timeout: Optional[float], signame: str) -> int:
    """Dying gasp: every rank saves its checkpoint; returns when they are done (container preStop).

    Blocks until every rank has exited or was killed at the gasp timeout, then prints one line per rank.
    """
    from launcher.control import NoSupervisor, request

    path = _open_run_dir(run_dir)
    if path is None:
        click.echo("launcher prestop: no launcher run here; nothing to do")
        return 0
    try:
        for answer in request(os.path.join(path, rundir_mod.CONTROL_SOCKET), "gasp"):
            if not answer.get("ok"):
                raise LauncherError(f"the launcher refused the dying gasp: {answer.get('error')}")
            if "gasp" in answer:
                _print_gasp(answer["gasp"])
            if answer.get("done"):
                click.echo(f"launcher prestop: job stopped ({answer['reason']})")
        return 0
    except NoSupervisor:
        return _prestop_without_supervisor(path, timeout, signame)


def _prestop_without_supervisor(path: str, timeout: Optional[float], signame: str) -> int:
    from launcher.events import EventLog
    from launcher.options import RunOptions

    state = rundir_mod.RunDir(path).read_json(rundir_mod.STATE) or {}
    records = [gasp_mod.RecordedRank(r["rank"], r["pid"], r.get("create_time")) for r in state.get("ranks", [])]
    alive = gasp_mod.verified_ranks(records)
    if not alive:
        click.echo("launcher prestop: the launcher is gone and none of its ranks is running; nothing to do")
        return 0
    opts = RunOptions(command=("-",), gasp_signal=signame, gasp_timeout=timeout)
    signum, wait = opts.resolved_gasp_signal(), opts.resolved_gasp_timeout()
    click.echo(f"launcher prestop: the launcher is gone; {signal.Signals(signum).name} to "
               f"{len(alive)} rank(s) it started, {wait:.0f} s to save")
    events = EventLog(os.path.join(path, rundir_mod.EVENTS), "prestop")
    events.emit("gasp", source="prestop-fallback", save=True, signal=signal.Signals(signum).name, timeout=wait)
    outcomes = gasp_mod.fallback_gasp([rec for rec, _ in alive], signum, wait)
    events.emit("gasp_done", ranks=outcomes)
    events.close()
    _print_gasp(outcomes)
    return 0


@click.command("exit")
@_RUN_DIR
@click.option("--no-wait", is_flag=True, help="Return once the request is accepted.")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up waiting after this many seconds.")
def exit_(run_dir: Optional[str], no_wait: bool, timeout: Optional[float]) -> int:
    """Stop the whole job at a step boundary, saving first (graceful exit on request)."""
    from launcher.control import NoSupervisor, request

    path = _open_run_dir(run_dir)
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
    return 0
