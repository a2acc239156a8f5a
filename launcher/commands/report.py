"""``launcher report RUN_DIR [RUN_DIR ...]``: draw a run's timeline as one self-contained HTML file; with
several run dirs (one per node of a multi-node job), one timeline with a lane per node."""

import os
from typing import Optional, Tuple

import click

from launcher.common.errors import LauncherError, UsageError


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML file to write (default: the first RUN_DIR's timeline.html).")
def report(run_dirs: Tuple[str, ...], output: Optional[str]) -> int:
    """Draw a run's timeline (attempts per rank, failures, gasps, restarts, goodput) as HTML + SVG.

    Several RUN_DIRs (the run dirs of one job's nodes): one lane per node, clocks aligned from the
    coordinator's records, which node failed first and how long each node waited at each restart.
    """
    from launcher.common.outputfiles import write_file
    from launcher.monitoring import nodes, timeline

    runs = [(os.path.abspath(run_dir), _events(run_dir)) for run_dir in run_dirs]
    target = output or os.path.join(run_dirs[0], "timeline.html")
    page = timeline.render(runs[0][1], where=runs[0][0]) if len(runs) == 1 else nodes.render(nodes.load(runs))
    try:
        # A new file renamed into place: a symlink planted at the target is replaced, never followed.
        write_file(target, page.encode("utf-8"))
    except OSError as exc:
        raise LauncherError(f"cannot write {target}: {exc.strerror or exc}") from None
    click.echo(target)
    return 0


def _events(run_dir: str) -> list:
    """A run dir's events through the bounded reader (the newest run's, lines that are not events skipped)."""
    from launcher.common.inputfiles import InputFileError
    from launcher.monitoring.eventsfile import read_events

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
    return events
