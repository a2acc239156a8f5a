"""``launcher report``: a finished run's timeline as one self-contained HTML file with an inline SVG.

One row for the job (its goodput parts, ``goodput.py``) and one per rank (a bar per attempt, from
``rank_spawned`` to the rank's exit, coloured by how it ended), with markers for failures, dying gasps
and restarts. No scripts and nothing fetched: the file opens offline in any browser. Every drawn
element carries ``data-kind`` (``part``, ``attempt``, ``failure``, ``gasp``, ``restart``) and the
attempt / rank it belongs to, so tests (and people with an inspector) can check what it shows.
"""

import html
from typing import Dict, List, Tuple

from launcher.monitoring import goodput as goodput_mod

WIDTH, LEFT, ROW, TOP = 1000, 90, 22, 40
COLORS = {"productive": "#3a9d5d", "startup": "#8fb3d9", "detection": "#e8a33d", "stopping": "#d9773a",
          "restarting": "#9a6fc2", "recomputed": "#c9b037", "waiting": "#9e9e9e", "device_wait": "#607d8b",
          "succeeded": "#3a9d5d", "failed": "#c62828", "stopped": "#d9a13a", "running": "#4f86c6"}


def render(events: List[dict], title: str) -> str:
    """The HTML page of the newest run in ``events``."""
    run = goodput_mod.last_run(events)
    good = goodput_mod.compute(run)
    ranks = sorted({ev["rank"] for ev in run if ev.get("event") == "rank_spawned" and isinstance(ev.get("rank"), int)})
    span = max(good.wall, 1e-6)
    x = lambda ts: LEFT + (WIDTH - LEFT - 10) * (ts - good.start) / span  # noqa: E731
    row_y = {rank: TOP + ROW * (i + 1) for i, rank in enumerate(ranks)}
    height = TOP + ROW * (len(ranks) + 1) + 30
    shapes = [f'<text x="4" y="{TOP + 15}">job</text>']
    for part, begin, end, attempt in good.spans:
        shapes.append(_rect("part", x(begin), TOP, x(end) - x(begin), COLORS[part], f"{part} {end - begin:.2f} s",
                            part=part, attempt=attempt))
    for rank, y in row_y.items():
        shapes.append(f'<text x="4" y="{y + 15}">rank {rank}</text>')
    for (rank, attempt), (begin, end, state) in _rank_bars(run, good.end).items():
        shapes.append(_rect("attempt", x(begin), row_y[rank], x(end) - x(begin), COLORS.get(state, "#777"),
                            f"rank {rank} attempt {attempt}: {state}", rank=rank, attempt=attempt, state=state))
    shapes += _markers(run, good, x, row_y, height)
    legend = " ".join(f'<span style="background:{COLORS[p]}">&nbsp;{p}&nbsp;</span>' for p in goodput_mod.PARTS)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
           f'font-size="12">{"".join(shapes)}</svg>')
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
            f"<body><h3>{html.escape(title)}</h3><p>{html.escape(good.summary())}</p><p>{legend}</p>\n{svg}\n"
            f"</body></html>\n")


def _rect(kind: str, x: float, y: float, width: float, color: str, tip: str, **data: object) -> str:
    attrs = "".join(f' data-{k}="{html.escape(str(v))}"' for k, v in data.items())
    return (f'<rect data-kind="{kind}"{attrs} x="{x:.2f}" y="{y}" width="{max(width, 1.0):.2f}" height="{ROW - 4}" '
            f'fill="{color}"><title>{html.escape(tip)}</title></rect>')


def _rank_bars(run: List[dict], end: float) -> Dict[Tuple[int, int], Tuple[float, float, str]]:
    """(rank, attempt) -> (spawned, exited, how it ended); still running at ``end`` if no exit."""
    bars: Dict[Tuple[int, int], Tuple[float, float, str]] = {}
    for ev in run:
        key = (ev.get("rank"), ev.get("attempt"))
        if ev.get("event") == "rank_spawned" and isinstance(key[0], int):
            bars[key] = (ev["ts"], end, "running")
        elif ev.get("event") == "rank_exited" and key in bars:
            bars[key] = (bars[key][0], float(ev.get("exited_at") or ev["ts"]), str(ev.get("state")))
    return bars


def _markers(run: List[dict], good: "goodput_mod.Goodput", x, row_y: Dict[int, int], height: int) -> List[str]:
    """Failure crosses on the failed rank's row; gasp and restart lines across all rows."""
    out = []
    for failure in good.failures:
        y = row_y.get(failure.rank, TOP) + ROW / 2 - 2
        count = "unknown" if failure.steps_recomputed is None else failure.steps_recomputed
        tip = (f"attempt {failure.attempt} failed: rank {failure.rank} {failure.cause}; lost {failure.time_lost:.2f} s, "
               f"steps recomputed {count}")
        out.append(f'<g data-kind="failure" data-rank="{failure.rank}" data-attempt="{failure.attempt}" '
                   f'data-steps-recomputed="{count}">'
                   f'<title>{html.escape(tip)}</title><circle cx="{x(failure.at):.2f}" cy="{y}" r="6" '
                   f'fill="white" stroke="#c62828" stroke-width="2"/></g>')
    for ev in run:
        kind = ev.get("event")
        if kind in ("restart", "gasp"):
            color, tip = ("#6a1b9a", f"restart to attempt {ev.get('attempt')}") if kind == "restart" else \
                ("#000000", f"dying gasp ({ev.get('source')})")
            out.append(f'<line data-kind="{kind}" data-attempt="{ev.get("attempt", "")}" x1="{x(ev["ts"]):.2f}" '
                       f'y1="{TOP - 5}" x2="{x(ev["ts"]):.2f}" y2="{height - 25}" stroke="{color}" '
                       f'stroke-dasharray="4 3"><title>{html.escape(tip)}</title></line>')
    return out
