"""``launcher report RUN_DIR [RUN_DIR ...]``: draw a run's timeline as one self-contained HTML file; with
several run dirs (one per node of a multi-node job), one timeline with a lane per node."""

import os
from typing import Optional, Tuple

import click

from launcher.common.errors import LauncherError


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML file to write (default: the first RUN_DIR's timeline.html).")
def report(run_dirs: Tuple[str, ...], output: Optional[str]) -> int:
    """Draw a run's timeline (attempts per rank, failures, gasps, restarts, goodput) as HTML + SVG.

    Several RUN_DIRs (the run dirs of one job's nodes): one lane per node, clocks aligned from the
    coordinator's records, which node failed first and how long each node waited at each restart.
    """
    from launcher.monitoring.events import read_events
    from launcher.monitoring import nodes, timeline

    runs = []
    for run_dir in run_dirs:
        events = read_events(os.path.join(run_dir, "events.jsonl"))
        if not events:
            raise LauncherError(f"no events in {run_dir}", ["pass the run dir of a `launcher run`"])
        runs.append((os.path.abspath(run_dir), events))
    path = output or os.path.join(run_dirs[0], "timeline.html")
    page = timeline.render(runs[0][1], where=runs[0][0]) if len(runs) == 1 else nodes.render(nodes.load(runs))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    click.echo(path)
    return 0
