"""``launcher status``: a running (or ended) job's ranks, restore plan, cluster holds and goodput."""

import json
import sys
import time
from typing import Optional

import click

from launcher.common.errors import LauncherError

_RUN_DIR = click.option("--run-dir", type=click.Path(file_okay=False), envvar="LAUNCHER_RUN_DIR",
                        show_envvar=True, help="The run dir of the job to show.")
_JOB = click.option("--job", help="The job's name under the base dir (see `launcher jobs`). Default: the only "
                                  "running job, else the newest one.")


def find_run_dir(run_dir: Optional[str], job: Optional[str]) -> str:
    """The run dir to show: as prestop finds it, else the newest job under the base dir.

    Raises:
        UsageError: several running jobs (listed).
        LauncherError: no job at all.
    """
    from launcher.common import jobs as jobs_mod
    from launcher.common.rundir import base_dir

    found = jobs_mod.resolve(run_dir, job)
    if found is None:
        known = jobs_mod.scan(base_dir())
        if not known:
            raise LauncherError(f"no jobs under {base_dir()}", ["pass --run-dir DIR of a `launcher run`"])
        found = known[-1].run_dir
    return found


@click.command()
@_RUN_DIR
@_JOB
@click.option("--json", "as_json", is_flag=True, help="One JSON document (for scripts).")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, is_flag=False, flag_value=2.0,
              help="Refresh in place every N seconds (default 2) until interrupted.")
def status(run_dir: Optional[str], job: Optional[str], as_json: bool, watch: Optional[float]) -> int:
    """Show a job: each rank's pid and state, restarts left, restore plan, cluster holds, goodput."""
    import os

    from launcher.monitoring.status import format_status, job_status

    path = find_run_dir(run_dir, job)
    if not os.path.isdir(path):
        raise LauncherError(f"no run dir {path}", ["see `launcher jobs`"])
    while True:
        doc = job_status(path)
        text = json.dumps(doc, indent=2) if as_json else "\n".join(format_status(doc))
        if watch is None:
            click.echo(text)
            return 0
        # Home + clear: refresh in place. Not click.echo, which strips escapes when not on a terminal.
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()  # a pipe (watch | tee) is block-buffered
        time.sleep(watch)
