"""The ``launcher prestop`` client, free of click so a container's preStop hook starts fast.

``launcher prestop`` with no options (what a preStop hook runs) is served by ``launcher.__main__``
straight from here; with options it goes through the click command, which calls the same code.
"""

import os
import signal
from typing import Any, Dict, List, Optional

from launcher import rundir as rundir_mod
from launcher.errors import LauncherError


def open_run_dir(path: Optional[str]) -> Optional[str]:
    """The checked run dir, or None when there is no run at all."""
    path = os.path.abspath(path or rundir_mod.default_run_dir())
    try:
        rundir_mod.check_private(path)
    except FileNotFoundError:
        return None
    return path


def print_gasp(ranks: List[Dict[str, Any]]) -> None:
    """Print one line per rank of a gasp report: how it ended (code, signal, or killed at the timeout)."""
    for r in ranks:
        if r.get("killed_after_timeout"):
            print(f"{r['label']}: killed after the gasp timeout")
        elif r.get("signal"):
            print(f"{r['label']}: exited by {r['signal']} (code {r['exit_code']})")
        elif r.get("exit_code") is not None:
            print(f"{r['label']}: exited with code {r['exit_code']}")
        else:
            print(f"{r['label']}: exited")


def prestop(run_dir: Optional[str] = None, timeout: Optional[float] = None, signame: str = "SIGTERM") -> int:
    """Ask this container's supervisor for the dying gasp and wait for it; returns the exit status.

    Args:
        run_dir: The run dir (default: the same as ``launcher run``'s).
        timeout: Without a live supervisor, seconds ranks get before SIGKILL.
        signame: Without a live supervisor, the save signal.
    """
    from launcher.ctlclient import NoSupervisor, request

    path = open_run_dir(run_dir)
    if path is None:
        print("launcher prestop: no launcher run here; nothing to do")
        return 0
    try:
        for answer in request(os.path.join(path, rundir_mod.CONTROL_SOCKET), "gasp"):
            if not answer.get("ok"):
                raise LauncherError(f"the launcher refused the dying gasp: {answer.get('error')}")
            if "gasp" in answer:
                print_gasp(answer["gasp"])
            if answer.get("done"):
                print(f"launcher prestop: job stopped ({answer['reason']})")
        return 0
    except NoSupervisor:
        return _prestop_without_supervisor(path, timeout, signame)


def _prestop_without_supervisor(path: str, timeout: Optional[float], signame: str) -> int:
    from launcher import gasp as gasp_mod
    from launcher.events import EventLog
    from launcher.options import RunOptions

    state = rundir_mod.RunDir(path).read_json(rundir_mod.STATE) or {}
    records = gasp_mod.recorded_ranks(state)
    alive = gasp_mod.verified_ranks(records)
    if not alive:
        print("launcher prestop: the launcher is gone and none of its ranks is running; nothing to do")
        return 0
    opts = RunOptions(command=("-",), gasp_signal=signame, gasp_timeout=timeout)
    signum, wait = opts.resolved_gasp_signal(), opts.resolved_gasp_timeout()
    print(f"launcher prestop: the launcher is gone; {signal.Signals(signum).name} to "
               f"{len(alive)} rank(s) it started, {wait:.0f} s to save")
    events = EventLog(os.path.join(path, rundir_mod.EVENTS), "prestop")
    events.emit("gasp", source="prestop-fallback", save=True, signal=signal.Signals(signum).name, timeout=wait)
    outcomes = gasp_mod.fallback_gasp([rec for rec, _ in alive], signum, wait)
    events.emit("gasp_done", ranks=outcomes)
    events.close()
    print_gasp(outcomes)
    return 0
