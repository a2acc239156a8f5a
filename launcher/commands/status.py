"""``launcher status``: a running (or ended) job's ranks, restore plan, cluster holds and goodput.

``launcher status`` without ``--watch`` or ``--help`` does not come through here: ``launcher.__main__``
answers it without click (``launcher.__main__.fast_status_args``), with the same options, output, messages
and exit codes. This command is what ``--help``, ``--watch`` and anything that path does not accept use.
"""

import sys
import time
from typing import Optional

import click

_RUN_DIR = click.option("--run-dir", type=click.Path(file_okay=False), envvar="LAUNCHER_RUN_DIR",
                        show_envvar=True, help="The run dir of the job to show.")
_JOB = click.option("--job", help="The job's name under the base dir (see `launcher jobs`). Default: the only "
                                  "running job, else the newest one.")


@click.command()
@_RUN_DIR
@_JOB
@click.option("--json", "as_json", is_flag=True, help="One JSON document (for scripts).")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, is_flag=False, flag_value=2.0,
              help="Refresh in place every N seconds (default 2) until interrupted.")
def status(run_dir: Optional[str], job: Optional[str], as_json: bool, watch: Optional[float]) -> int:
    """Show a job: each rank's pid and state, restarts left, restore plan, cluster holds, goodput."""
    from launcher.monitoring.status import find_run_dir, render

    path = find_run_dir(run_dir, job)
    while True:
        text = render(path, as_json)
        if watch is None:
            click.echo(text)
            return 0
        # Home + clear: refresh in place. Not click.echo, which strips escapes when not on a terminal.
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()  # a pipe (watch | tee) is block-buffered
        time.sleep(watch)
