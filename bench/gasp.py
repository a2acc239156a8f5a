"""Benchmark 4: the dying gasp through ``launcher prestop``.

Eight idle ranks (``scripts/sleeper.py``) record ``time.time()`` the moment SIGTERM arrives (in the
handler) and again right before ``os._exit(0)``. Once all run, the bench takes ``time.time()`` and
runs ``python -m launcher prestop`` (``LAUNCHER_RUN_DIR`` set, as in a preStop hook) to completion;
``prestop --run-dir D`` and a lean raw-socket client are alternated with it for comparison. Measured:

* prestop invoked -> the last rank received SIGTERM (includes the prestop client's interpreter
  start-up and imports), and the in-supervisor part of it: the ``control_request`` event -> the last
  rank received SIGTERM;
* the last rank's exit -> ``prestop`` returned (the supervisor reaps, answers, and the client
  process exits).
"""

import atexit
import glob
import os
import shutil
import subprocess
import tempfile
import time
from typing import List, Optional

from bench.common import (PYTHON, REPO, Job, Result, Row, Settings, TempDir, alternate, column, first_event,
                          fmt, job_env, launcher_argv, median, ms, progress, read_events, read_lines, script,
                          wait_until, worker_ready)

NAME = "gasp"
NPROC = 8
_WHEEL_VENV: List[str] = []


def wheel_launcher() -> str:
    """The ``launcher`` console script of a throwaway venv holding the launcher installed from a wheel
    built from this checkout, as in a container image: nothing in ``site`` but the launcher.
    Only the launcher is installed (``--no-deps``): the preStop client imports nothing else."""
    if not _WHEEL_VENV:
        root = tempfile.mkdtemp(prefix="bench-wheel-")
        atexit.register(shutil.rmtree, root, True)
        venv, wheels = os.path.join(root, "venv"), os.path.join(root, "wheels")
        quiet = {"stdout": subprocess.DEVNULL, "check": True}
        subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
                        REPO], **quiet)
        subprocess.run([PYTHON, "-m", "venv", "--without-pip", venv], **quiet)
        subprocess.run([PYTHON, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install", "-q",
                        "--no-deps", "--no-index", *glob.glob(os.path.join(wheels, "*.whl"))], **quiet)
        progress(f"gasp: launcher installed from a wheel into {venv}")
        _WHEEL_VENV.append(os.path.join(venv, "bin", "launcher"))
    return _WHEEL_VENV[0]


#: The clients compared, alternated run by run. ``launcher prestop`` is what a preStop hook runs (no
#: options; the run dir comes from ``LAUNCHER_RUN_DIR``), first as a container image has it (installed
#: from a wheel), then from this editable checkout; ``--run-dir`` goes through the click CLI.
CLIENTS = {"launcher prestop": lambda run_dir: [wheel_launcher(), "prestop"],
           "editable install": lambda run_dir: [PYTHON, "-m", "launcher", "prestop"],
           "prestop --run-dir": lambda run_dir: [PYTHON, "-m", "launcher", "prestop", "--run-dir", run_dir],
           "lean client": lambda run_dir: [PYTHON, "-S", script("prestop_min.py"), run_dir]}
MAIN = "launcher prestop"


def one_run(client: str = "launcher prestop") -> dict:
    """Start 8 sleeping ranks, run the prestop ``client`` and time the signal and the return."""
    tmp = TempDir("gasp")
    with tmp:
        ready, term, run_dir = tmp.sub("ready"), tmp.sub("term"), tmp.sub("run")
        env = job_env(ready=ready, term=term, sleep=120)
        job = Job(launcher_argv(NPROC, run_dir, tmp.sub("logs"), [PYTHON, script("sleeper.py")]), env)
        up = wait_until(lambda: len(worker_ready(ready)) >= NPROC, 60, 0.005)
        time.sleep(0.3)  # let the launcher finish its post-spawn bookkeeping (state file)
        invoked = time.time()
        prestop = subprocess.run(CLIENTS[client](run_dir), env=dict(env, LAUNCHER_RUN_DIR=run_dir),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        returned = time.time()
        code = job.finish(grace=5.0)
        stamps, events = read_lines(term), read_events(run_dir)
    terms = [float(f[1]) for f in stamps if f[0] == "term"]
    exits = [float(f[1]) for f in stamps if f[0] == "exit"]
    request = first_event(events, "control_request", command="gasp")
    if not up or len(terms) < NPROC or len(exits) < NPROC or request is None:
        return {"error": f"ranks up: {up}, SIGTERMs: {len(terms)}, exits: {len(exits)} (exit {code})"}
    metrics = {"signal_s": max(terms) - invoked, "in_supervisor_s": max(terms) - request["ts"],
               "client_s": request["ts"] - invoked, "return_s": returned - max(exits),
               "first_signal_s": min(terms) - invoked, "prestop_exit": prestop.returncode, "exit": code}
    metrics.update(_phases(events, request["ts"], max(terms), max(exits), returned))
    return metrics


def _phases(events: List[dict], requested: float, last_term: float, last_exit: float, returned: float) -> dict:
    """Split the in-supervisor and the return intervals at the launcher's events."""
    stop = first_event(events, "stop_group")
    done = first_event(events, "gasp_done")
    end = first_event(events, "job_end")
    if not (stop and done and end):
        return {}
    return {"request_to_stop_group_s": stop["ts"] - requested, "stop_group_to_last_term_s": last_term - stop["ts"],
            "last_exit_to_gasp_done_s": done["ts"] - last_exit, "gasp_done_to_job_end_s": end["ts"] - done["ts"],
            "job_end_to_returned_s": returned - end["ts"]}


def run(settings: Settings) -> Result:
    """The dying-gasp timings over the measured runs, with ``launcher prestop`` and, for comparison,
    a lean client (``python -S``, raw socket) alternated."""
    every = alternate({name: (lambda c=name: one_run(c)) for name in CLIENTS}, settings, "gasp")
    runs = every[MAIN]
    keys = ("signal_s", "in_supervisor_s", "client_s", "return_s")
    med = {name: {key: ms(median(column(every[name], key))) for key in keys} for name in CLIENTS}
    count = len(runs)

    def row(metric: str, key: str, target: str = "-", limit: Optional[float] = None) -> Row:
        """A table row: bare ``launcher prestop``'s median, the other clients' beside it."""
        return Row(NAME, metric, "ms", med[MAIN][key], {n: med[n][key] for n in CLIENTS if n != MAIN}, "-",
                   target, None if limit is None else _below(med[MAIN][key], limit), count)

    rows = [row(f"{NPROC} ranks: `launcher prestop` invoked -> last rank got SIGTERM", "signal_s", "< 20 ms", 20.0),
            row("  of which in the supervisor: `control_request` -> last SIGTERM", "in_supervisor_s"),
            row("  of which the client: invoked -> `control_request`", "client_s"),
            row("last rank exited -> `prestop` returned", "return_s", "< 50 ms", 50.0)]
    imports = prestop_imports()
    return Result(rows, {**every, "prestop_imports": imports}, _details(runs) + [
        "- `python -X importtime -m launcher prestop` (top-level imports, cumulative): " + ", ".join(
            f"`{i['module']}` {fmt(i['cumulative_ms'])} ms" for i in imports) + "."])


def prestop_imports() -> List[dict]:
    """The most expensive top-level imports of a ``launcher prestop`` process (run dir missing, which
    imports exactly what a real prestop imports before it connects)."""
    from bench.launch import top_imports

    with TempDir("prestop-imports") as tmp:
        argv = [PYTHON, "-X", "importtime", "-m", "launcher", "prestop"]
        env = dict(job_env(), LAUNCHER_RUN_DIR=f"{tmp}/none")
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              check=False)
    return top_imports(proc.stderr, 8)


def _below(value, limit: float):
    return value is not None and value < limit


def _details(runs: List[dict]) -> List[str]:
    per = ", ".join(f"{fmt(ms(r.get('client_s')))} + {fmt(ms(r.get('in_supervisor_s')), 2)}" for r in runs)
    phase = {key: fmt(ms(median(column(runs, key))), 2) for key in (
        "request_to_stop_group_s", "stop_group_to_last_term_s", "last_exit_to_gasp_done_s",
        "gasp_done_to_job_end_s", "job_end_to_returned_s")}
    return [f"- Per run, prestop client start-up + in-supervisor part (ms): {per}.",
            f"- In the supervisor (medians): `control_request` -> `stop_group` {phase['request_to_stop_group_s']} ms "
            f"(gasp gate file, events); `stop_group` -> last rank in its SIGTERM handler "
            f"{phase['stop_group_to_last_term_s']} ms.",
            f"- Return path (medians): last rank exit -> `gasp_done` {phase['last_exit_to_gasp_done_s']} ms; "
            f"`gasp_done` -> `job_end` {phase['gasp_done_to_job_end_s']} ms (attempt teardown); `job_end` -> "
            f"prestop returned {phase['job_end_to_returned_s']} ms (final answer, client output and exit).",
            "- The client part is a fresh process: interpreter start-up, `site`, the client's imports, then one "
            "request on the run dir's unix socket. `launcher prestop` is the preStop hook's form (no options, "
            "`LAUNCHER_RUN_DIR` set), served without click, run as a container image has it: the `launcher` "
            "console script of a venv where the launcher was installed from a wheel built from this checkout. "
            "`editable install` is the same command in the development venv (`python -m launcher`, the checkout "
            "on `sys.path` through a `.pth` path entry, whose `site` also processes that venv's other packages); "
            "`prestop --run-dir` goes through the click CLI there; `lean client` is "
            "`python -S bench/scripts/prestop_min.py RUN_DIR`, the same request without `site` or launcher "
            "imports. The four alternate run by run."]
