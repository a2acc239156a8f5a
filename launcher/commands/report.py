"""``launcher report RUN_DIR``: draw a finished run's timeline as one self-contained HTML file."""

import os
from typing import Optional

import click

from launcher.common.errors import LauncherError


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML file to write (default: RUN_DIR/timeline.html).")
def report(run_dir: str, output: Optional[str]) -> int:
    """Draw a run's timeline (attempts per rank, failures, gasps, restarts, goodput) as HTML + SVG."""
    from launcher.monitoring.events import read_events
    from launcher.monitoring.timeline import render

    events = read_events(os.path.join(run_dir, "events.jsonl"))
    if not events:
        raise LauncherError(f"no events in {run_dir}", ["pass the run dir of a `launcher run`"])
    path = output or os.path.join(run_dir, "timeline.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render(events, where=os.path.abspath(run_dir)))
    click.echo(path)
    return 0
