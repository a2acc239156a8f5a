"""The ``launcher prestop`` client, free of click so a container's preStop hook starts fast.

``launcher prestop`` with no options (what a preStop hook runs) is served by ``launcher.__main__``
straight from here; with options it goes through the click command, which calls the same code.

It finds the job (``launcher.common.jobs.resolve``: the one live job under the base dir, in a container the
only one), asks its supervisor for the gasp and waits. A supervisor that does not acknowledge within
``ack_timeout`` (stopped, hung) is treated as gone: prestop signals the recorded ranks itself.
"""

import signal
import sys
import time
from typing import Any, Dict, List, Optional

from launcher.common import jobs
from launcher.common import rundir as rundir_mod
from launcher.common.errors import LauncherError, UsageError

#: The longest prestop waits for the supervisor to acknowledge; every second spent here is taken
#: from the ranks' save time in the fallback.
ACK_TIMEOUT = 2.0
#: Beyond the gasp timeout, how long prestop waits for the report: the supervisor's SIGKILL settle
#: time (5 s) and a margin.
REPORT_MARGIN = 10.0


def open_run_dir(path: Optional[str], job: Optional[str] = None) -> Optional[rundir_mod.RunDir]:
    """The opened, checked run dir of the job to address, or None when there is no run at all.

    Raises:
        UsageError: several live jobs and no choice, or a run dir that is not private and safe.
    """
    found = jobs.resolve(path, job)
    if found is None:
        return None
    try:
        return rundir_mod.RunDir(found, create=False)
    except FileNotFoundError:
        return None


def ack_timeout(gasp_timeout: float) -> float:
    """Deadline for the supervisor's acknowledgement: 2 s, or a tenth of the gasp timeout when
    shorter (at least 0.5 s)."""
    return min(ACK_TIMEOUT, max(0.5, 0.1 * gasp_timeout))


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


def prestop(run_dir: Optional[str] = None, timeout: Optional[float] = None, signame: Optional[str] = None,
            job: Optional[str] = None) -> int:
    """Ask this container's supervisor for the dying gasp and wait for it; returns the exit status.

    Args:
        run_dir: The run dir (default: ``LAUNCHER_RUN_DIR``, else the job found under the base dir).
        timeout: Without a live supervisor, seconds ranks get before SIGKILL (default: what is left
            of the job's recorded gasp timeout).
        signame: Without a live supervisor, the save signal (default: the job's recorded one).
        job: The job's name under the base dir.
    """
    from launcher.control.client import NoSupervisor, request

    rd = open_run_dir(run_dir, job)
    if rd is None:
        return _without_live_job(timeout, signame)
    try:
        record = rd.read_json(rundir_mod.LAUNCHER) or {}
        budget = _recorded_gasp_timeout(record)
        asked = time.monotonic()
        try:
            for answer in request(rd.socket_address(), "gasp", first_timeout=ack_timeout(budget),
                                  timeout=budget + REPORT_MARGIN):
                _show(answer)
            return 0
        except NoSupervisor as exc:
            print(f"launcher prestop: {exc.message}; falling back to the recorded ranks", file=sys.stderr)
            left = max(0.0, budget - (time.monotonic() - asked))
            return _prestop_without_supervisor(rd, left if timeout is None else timeout,
                                               signame or record.get("gasp_signal") or "SIGTERM")
    finally:
        rd.close()


def _show(answer: Dict[str, Any]) -> None:
    if not answer.get("ok"):
        raise LauncherError(f"the launcher refused the dying gasp: {answer.get('error')}")
    if "gasp" in answer:
        print_gasp(answer["gasp"])
    if answer.get("done"):
        print(f"launcher prestop: job stopped ({answer['reason']})")


#: The longest recorded gasp timeout prestop honours: a day, past any pod's grace period, so that a
#: launcher.json holding 1e18 cannot keep a preStop hook waiting for ever.
MAX_RECORDED_GASP = 86400.0


def _recorded_gasp_timeout(record: Dict[str, Any]) -> float:
    """The gasp timeout the launcher recorded in ``launcher.json`` (that of a 30 s grace period if none),
    at most :data:`MAX_RECORDED_GASP`."""
    try:
        return min(MAX_RECORDED_GASP, max(0.0, float(record["gasp_timeout"])))
    except (KeyError, TypeError, ValueError):
        from launcher.jobspec.options import default_gasp_timeout

        return default_gasp_timeout(30.0)


def _without_live_job(timeout: Optional[float], signame: Optional[str]) -> int:
    """No launcher holds a run dir: the ranks of one whose launcher died, if any are still running."""
    base = rundir_mod.base_dir()
    stranded = [job for job in jobs.orphaned(base) if _running_ranks(job.run_dir)]
    if not stranded:
        print("launcher prestop: no launcher run here; nothing to do")
        return 0
    if len(stranded) > 1:
        raise UsageError(f"{len(stranded)} jobs under {base} lost their launcher and still have ranks running; "
                         "pick one with --job NAME or --run-dir DIR", [job.describe() for job in stranded])
    rd = rundir_mod.RunDir(stranded[0].run_dir, create=False)
    try:
        record = rd.read_json(rundir_mod.LAUNCHER) or {}
        wait = _recorded_gasp_timeout(record) if timeout is None else timeout
        return _prestop_without_supervisor(rd, wait, signame or record.get("gasp_signal") or "SIGTERM")
    finally:
        rd.close()


def _running_ranks(path: str) -> list:
    from launcher.control import gasp as gasp_mod

    try:
        rd = rundir_mod.RunDir(path, create=False)
    except (FileNotFoundError, UsageError):
        return []
    try:
        return gasp_mod.verified_ranks(gasp_mod.recorded_ranks(rd.read_json(rundir_mod.STATE) or {}))
    finally:
        rd.close()


def _prestop_without_supervisor(rd: rundir_mod.RunDir, wait: float, signame: str) -> int:
    from launcher.control import gasp as gasp_mod
    from launcher.monitoring.events import EventLog
    from launcher.jobspec.options import parse_signal

    state = rd.read_json(rundir_mod.STATE) or {}
    alive = gasp_mod.verified_ranks(gasp_mod.recorded_ranks(state))
    if not alive:
        print("launcher prestop: the launcher is gone and none of its ranks is running; nothing to do")
        return 0
    signum = parse_signal(signame, "--signal")
    print(f"launcher prestop: the launcher is gone; {signal.Signals(signum).name} to "
          f"{len(alive)} rank(s) it started, {wait:.0f} s to save")
    events = EventLog(rd.file(rundir_mod.EVENTS), "prestop")
    events.emit("gasp", source="prestop-fallback", save=True, signal=signal.Signals(signum).name, timeout=wait)
    outcomes = gasp_mod.fallback_gasp([rec for rec, _ in alive], signum, wait)
    events.emit("gasp_done", ranks=outcomes)
    events.close()
    print_gasp(outcomes)
    return 0
