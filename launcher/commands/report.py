"""``launcher report RUN_DIR``: draw a finished run's timeline as one self-contained HTML file."""

import os
from typing import Optional

import click

from launcher.common.errors import LauncherError, UsageError


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML file to write (default: RUN_DIR/timeline.html).")
def report(run_dir: str, output: Optional[str]) -> int:
    """Draw a run's timeline (attempts per rank, failures, gasps, restarts, goodput) as HTML + SVG."""
    from launcher.common.inputfiles import InputFileError
    from launcher.common.outputfiles import write_file
    from launcher.monitoring.goodput import read_events
    from launcher.monitoring.timeline import render

    path = os.path.join(run_dir, "events.jsonl")
    try:
        events, skipped = read_events(path, newest_run=True)
    except InputFileError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise LauncherError(f"cannot read {path}: {exc.strerror or exc}") from None
    if skipped:
        click.echo(f"launcher: warning: skipped {skipped} line(s) of {path} that are not launcher events", err=True)
    if not events:
        raise LauncherError(f"no events in {run_dir}", ["pass the run dir of a `launcher run`"])
    target = output or os.path.join(run_dir, "timeline.html")
    page = render(events, f"launcher run {os.path.basename(os.path.normpath(run_dir))}")
    try:
        # A new file renamed into place: a symlink planted at the target is replaced, never followed.
        write_file(target, page.encode("utf-8"))
    except OSError as exc:
        raise LauncherError(f"cannot write {target}: {exc.strerror or exc}") from None
    click.echo(target)
    return 0
