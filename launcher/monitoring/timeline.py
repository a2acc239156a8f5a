"""``launcher report``: a run's timeline as one self-contained HTML file with an inline SVG.

A ``job`` lane shows the goodput parts in time (``goodput.py``); below it one lane per group of ranks
whose history looks the same at the picture's resolution ("ranks 0-4095"), exceptions one by one. A
rank lane uses the same parts, from the same events: the job's part at each moment, from the rank's
spawn to its exit, except that until the rank's own first output (``rank_output``) an attempt without
step beats is still start-up for it. How a rank's attempt ended is a marker at its exit (a cross:
failed, a square: stopped, a tick: succeeded, an arrow: still running), never a fill colour. Failures
are rings where their lost time began; attempt starts are labelled lines, restarts and dying gasps
dashed lines; the x axis is seconds since the run started. Hovering anything shows its details (an SVG
``<title>``). No scripts and nothing fetched: the file opens offline in any browser.

Every drawn element carries ``data-kind`` (``part``, ``phase``, ``end``, ``failure``, ``attempt``,
``restart``, ``gasp``, ``lane``) and the attempt / ranks / part it belongs to, so tests (and people with
an inspector) can check what it shows. All text goes into the page through :func:`esc`.
"""

import html
import math
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.monitoring import eventsfile
from launcher.monitoring import goodput as goodput_mod

WIDTH, LEFT, RIGHT, ROW, LANE = 1300, 190, 20, 22, 18
COLORS = {"productive": "#2e7d32", "unknown": "url(#unknown)", "startup": "#90caf9", "detection": "#f0a030",
          "hung": "#b0417a", "stopping": "#e07b53", "restarting": "#8e6cc7", "recomputed": "#d4b82a",
          "waiting": "#a1887f", "device_wait": "#607d8b"}
MEANING = {"productive": "training (step beats)", "unknown": "running; training or not cannot be told",
           "startup": "spawn to first output / first step", "detection": "exit to the launcher noticing it",
           "hung": "a hung rank's last output to its detection", "stopping": "stopping the ranks",
           "restarting": "decision, backoff, spawn, the ranks' start-up", "recomputed": "re-running lost steps",
           "waiting": "cluster held the restart",
           "device_wait": "another process held a device"}
ENDS = ("failed", "stopped", "succeeded", "running")
Span = Tuple[str, float, float]


def esc(text: object) -> str:
    """The one way text gets into the page (element content and attribute values alike)."""
    return html.escape(str(text), quote=True)


def render(events: List[dict], title: Optional[str] = None, where: str = "") -> str:
    """The HTML page of the newest run in ``events``; ``title`` defaults to one made from the run's
    ``start`` event; ``where`` (the run dir) is shown under it."""
    run = eventsfile.last_run(events)
    good = goodput_mod.compute(run)
    page = Page(good.start, good.wall)
    lanes = rank_lanes(run, good, page.px)
    height = page.top + ROW * (len(lanes) + 1) + 40
    shapes = [page.axis(height)]
    shapes += job_lane(good.spans, page, page.top, "job")
    for i, (ranks, history) in enumerate(lanes):
        shapes += _rank_lane(ranks, history, page, page.top + ROW * (i + 1))
    shapes += _markers(run, good, page, lanes, height)
    title = title or default_title(run, good, len({r for ranks, _ in lanes for r in ranks}))
    sub = [f"started {page.started}, {good.wall:.1f} s" + (f"; run dir {where}" if where else ""), good.summary()]
    return html_page(title, sub, svg(height, shapes))


def svg(height: int, shapes: List[str]) -> str:
    """The picture: legend, then ``shapes`` (already escaped SVG)."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
            f'font-size="12">{_DEFS}<rect width="100%" height="100%" fill="white"/>{_legend()}{"".join(shapes)}</svg>')


def html_page(title: str, lines: List[str], picture: str, after: str = "") -> str:
    """The page: ``title``, the text ``lines`` under it, the SVG, and ``after`` (already escaped HTML)."""
    text = "<br>".join(esc(line) for line in lines)
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{esc(title)}</title></head>'
            f'<body style="font-family:sans-serif"><h2>{esc(title)}</h2><p>{text}</p>\n{picture}\n{after}'
            f"</body></html>\n")


def default_title(run: List[dict], good: "goodput_mod.Goodput", nranks: int) -> str:
    """``train.py on node0: 8 ranks, 2 attempts, succeeded``: what ran, where, and how it ended."""
    start = run[0] if run and run[0].get("event") == "start" else {}
    argv = [str(a) for a in start.get("argv") or ()]
    script = next((os.path.basename(a) for a in argv if a.endswith(".py")), os.path.basename(argv[0]) if argv else "")
    end = next((ev for ev in reversed(run) if ev.get("event") == "job_end"), None)
    outcome = end.get("reason", "ended") if end else "still running"
    attempts = len({ev.get("attempt") for ev in run if ev.get("event") == "attempt_start"})
    where = f" on {start['server']}" if start.get("server") else ""
    return f"{script or 'launcher run'}{where}: {nranks} ranks, {attempts} attempt(s), {outcome}"


class Page:
    """The picture's geometry: seconds since ``start`` to pixels, the time axis."""

    def __init__(self, start: float, wall: float):
        self.start, self.wall, self.top = start, max(wall, 1e-6), 78
        try:
            self.started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
        except (OverflowError, OSError, ValueError):  # a start time no clock shows (a damaged events file)
            self.started = f"{start:g} s since the epoch"

    def px(self, ts: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (ts - self.start) / self.wall

    def axis(self, height: int) -> str:
        """Grid lines and labels every 1, 2 or 5 x 10^k seconds (about 10 of them)."""
        raw = self.wall / 10
        step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
        out, y = ['<g data-kind="axis" stroke="#e0e0e0">'], height - 28
        for i in range(int(self.wall / step) + 1):
            x = self.px(self.start + i * step)
            label = f"{i * step:g} s"
            out.append(f'<line x1="{x:.1f}" y1="{self.top - 6}" x2="{x:.1f}" y2="{y}"/>'
                       f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle" stroke="none" fill="#444">'
                       f'{esc(label)}</text>')
        out.append(f'<text x="{WIDTH - RIGHT}" y="{y + 27}" text-anchor="end" stroke="none" fill="#444">'
                   f'{esc("seconds since the run started")}</text></g>')
        return "".join(out)


class _RankTimes:
    """What the events say of each rank's attempts: when spawned, its first output, its exit."""

    def __init__(self, run: List[dict], end: float):
        self.beats = {ev.get("attempt") for ev in run if ev.get("event") in ("step_first", "heartbeat")}
        self.spawned: Dict[Tuple[int, int], float] = {}
        self.outputs: Dict[Tuple[int, int], float] = {}
        self.exits: Dict[Tuple[int, int], Tuple[float, str, str]] = {}
        for ev in run:
            kind = ev.get("event")
            if kind not in ("rank_spawned", "rank_output", "rank_exited"):
                continue
            key = (ev.get("rank"), ev.get("attempt"))
            if kind == "rank_spawned" and isinstance(key[0], int):
                self.spawned[key] = float(ev["ts"])
            elif kind == "rank_output" and isinstance(ev.get("at"), (int, float)):
                self.outputs.setdefault(key, float(ev["at"]))
            elif kind == "rank_exited" and key in self.spawned:
                cause = f"signal {ev['signal']}" if ev.get("signal") else f"exit code {ev.get('exit_code')}"
                self.exits[key] = (float(ev.get("exited_at") or ev["ts"]), str(ev.get("state")), cause)
        self.end = end

    def of(self, rank: int, attempt: int) -> Tuple[float, Optional[float], float, str, str]:
        """(spawned, its own first output when the attempt has no beats, exit, end state, detail)."""
        died, state, detail = self.exits.get((rank, attempt), (self.end, "running", "still running"))
        first = self.outputs.get((rank, attempt)) if attempt not in self.beats else None
        return self.spawned[(rank, attempt)], first, died, state, detail


def rank_lanes(run: List[dict], good: "goodput_mod.Goodput", px) -> List[Tuple[List[int], list]]:
    """One lane per group of ranks whose attempts draw the same (spawn, first output and exit on the
    same pixel, the same end states), in the order of their lowest rank; each lane's history per
    attempt: ``(attempt, spans, end state, exit time, exit detail)``."""
    times = _RankTimes(run, good.end)
    groups: Dict[tuple, List[int]] = {}
    attempts: Dict[int, List[int]] = {}
    for rank, attempt in sorted(times.spawned, key=lambda key: (key[0], times.spawned[key])):
        attempts.setdefault(rank, []).append(attempt)
    for rank, tried in attempts.items():
        key = []
        for attempt in tried:
            born, first, died, state, _ = times.of(rank, attempt)
            key.append((attempt, round(px(born)), None if first is None else round(px(first)), round(px(died)), state))
        groups.setdefault(tuple(key), []).append(rank)
    by_attempt: Dict[int, List[Tuple[str, float, float]]] = {}
    for part, begin, end, attempt in merged(good.spans):
        by_attempt.setdefault(attempt, []).append((part, begin, end))
    lanes = []
    for ranks in groups.values():
        history = []
        for attempt in attempts[ranks[0]]:
            born, first, died, state, detail = times.of(ranks[0], attempt)
            history.append((attempt, _phases(by_attempt.get(attempt, ()), born, first, died, attempt), state, died,
                            detail))
        lanes.append((ranks, history))
    return sorted(lanes, key=lambda lane: lane[0][0])


def _phases(job: Sequence[Span], born: float, first: Optional[float], died: float, attempt: int) -> List[Span]:
    """The job's parts from ``born`` to ``died``; start-up (or restarting) until ``first`` where the job
    was already ``unknown`` (another rank had printed)."""
    spans: List[Span] = []
    for part, begin, end in job:
        begin, end = max(begin, born), min(end, died)
        if end <= begin:
            continue
        if part == "unknown" and first is not None and begin < first:
            started = "startup" if attempt == 0 else "restarting"
            spans += [s for s in ((started, begin, min(end, first)), (part, min(end, first), end)) if s[2] > s[1]]
        else:
            spans.append((part, begin, end))
    return [s[:3] for s in merged([(*s, 0) for s in spans])]


def merged(spans: Sequence[Tuple[str, float, float, int]]) -> List[Tuple[str, float, float, int]]:
    """Adjacent spans of one part and attempt as one (the sweep may close a part and reopen it)."""
    out: List[Tuple[str, float, float, int]] = []
    for span in spans:
        if out and out[-1][0] == span[0] and out[-1][3] == span[3] and out[-1][2] == span[1]:
            out[-1] = (span[0], out[-1][1], span[2], span[3])
        else:
            out.append(tuple(span))
    return out


def ranges(ranks: Sequence[int]) -> str:
    """``0-3,5,7-9`` for sorted ranks."""
    out, begin = [], None
    for i, rank in enumerate(ranks):
        begin = rank if begin is None else begin
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            out.append(f"{begin}-{rank}" if rank != begin else str(rank))
            begin = None
    return ",".join(out)


def _lane_label(ranks: List[int], y: float) -> str:
    text = ranges(ranks)
    label = (f"rank {text}" if len(ranks) == 1 else f"ranks {text}") if len(text) <= 18 else \
        f"ranks {text[:12].rsplit(',', 1)[0]},… ({len(ranks)})"
    return (f'<text data-kind="lane" data-ranks="{esc(text)}" data-count="{len(ranks)}" x="4" y="{y + 13}">'
            f'<title>{esc(f"{len(ranks)} rank(s) with this history: {text}")}</title>{esc(label)}</text>')


def rect(kind: str, x0: float, x1: float, y: float, fill: str, tip: str, **data: object) -> str:
    attrs = "".join(f' data-{k}="{esc(v)}"' for k, v in data.items())
    return (f'<rect data-kind="{kind}"{attrs} x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 1.0):.2f}" height="{LANE}" '
            f'fill="{fill}"><title>{esc(tip)}</title></rect>')


def _when(page: Page, begin: float, end: float) -> str:
    return f"{end - begin:.2f} s, from +{begin - page.start:.2f} s to +{end - page.start:.2f} s"


def job_lane(spans: Sequence[Tuple[str, float, float, int]], page: Page, y: float, name: str,
             **data: object) -> List[str]:
    """A lane of goodput parts (the job's, or one node's), labelled ``name``."""
    out = [f'<text x="4" y="{y + 13}" font-weight="bold">{esc(name)}</text>']
    for part, begin, end, attempt in merged(spans):
        out.append(rect("part", page.px(begin), page.px(end), y, COLORS[part],
                        f"{name}, attempt {attempt}: {part} {_when(page, begin, end)}", part=part, attempt=attempt,
                        **data))
    return out


def _rank_lane(ranks: List[int], history: list, page: Page, y: float) -> List[str]:
    who = f"rank {ranges(ranks)}" if len(ranks) == 1 else f"{len(ranks)} ranks ({ranges(ranks)[:60]})"
    out = [_lane_label(ranks, y)]
    for attempt, spans, state, died, detail in history:
        for part, begin, end in spans:
            out.append(rect("phase", page.px(begin), page.px(end), y, COLORS[part],
                            f"{who}, attempt {attempt}: {part} {_when(page, begin, end)}",
                            ranks=ranges(ranks), attempt=attempt, part=part))
        tip = f"{who}, attempt {attempt}: {state} ({detail}) at +{died - page.start:.2f} s"
        x = page.px(died)
        out.append(marked("end", tip, _end_mark(state, x, y), ranks=ranges(ranks), attempt=attempt, state=state,
                          x=f"{x:.1f}", y=y + LANE / 2))
    return out


def marked(kind: str, tip: str, shape: str, **data: object) -> str:
    """A marker: ``shape`` (already escaped SVG) in a group with its hover text and data."""
    attrs = "".join(f' data-{k.replace("_", "-")}="{esc(v)}"' for k, v in data.items())
    return f'<g data-kind="{kind}"{attrs}><title>{esc(tip)}</title>{shape}</g>'


def ring(x: float, y: float, thick: bool = True) -> str:
    """The failure ring (where a failure's lost time began)."""
    return (f'<circle cx="{x:.2f}" cy="{y}" r="{9 if thick else 6}" fill="none" stroke="#b71c1c" '
            f'stroke-width="{3 if thick else 2}"/>')


def _end_mark(state: str, x: float, y: float) -> str:
    """A shape per end state, in black (red for failed): never one of the parts' fill colours."""
    mid = y + LANE / 2
    if state == "failed":
        return (f'<path d="M{x - 5:.1f},{mid - 5} l10,10 m0,-10 l-10,10" stroke="#b71c1c" stroke-width="3"/>')
    if state == "succeeded":
        return f'<path d="M{x - 6:.1f},{mid} l4,5 l8,-10" fill="none" stroke="#111" stroke-width="2.5"/>'
    if state == "running":
        return f'<path d="M{x - 8:.1f},{mid - 6} l8,6 l-8,6 z" fill="#111"/>'
    return f'<rect x="{x - 4:.1f}" y="{mid - 4}" width="8" height="8" fill="#111"/>'


def attempt_line(page: Page, ts: float, attempt: object, bottom: float, word: str = "attempt") -> str:
    """A labelled vertical line where an attempt (or a generation) starts."""
    label = f"{word} {attempt}"
    x = page.px(ts)
    return (f'<g data-kind="attempt" data-attempt="{esc(attempt)}"><title>{esc(label)} starts at '
            f'+{ts - page.start:.2f} s</title><line x1="{x:.1f}" y1="{page.top - 18}" x2="{x:.1f}" y2="{bottom}" '
            f'stroke="#333"/><text x="{x + 3:.1f}" y="{page.top - 8}">{esc(label)}</text></g>')


def _markers(run: List[dict], good: "goodput_mod.Goodput", page: Page, lanes, height: int) -> List[str]:
    """Attempt starts (labelled), restarts and gasps (dashed) across every lane; failure rings."""
    bottom, out = height - 28, []
    lane_y = {rank: page.top + ROW * (i + 1) for i, (ranks, _) in enumerate(lanes) for rank in ranks}
    for ev in run:
        kind = ev.get("event")
        if kind not in ("attempt_start", "restart", "gasp"):
            continue
        x = page.px(float(ev.get("ts", page.start)))
        if kind == "attempt_start":
            out.append(attempt_line(page, float(ev["ts"]), ev.get("attempt"), bottom))
        elif kind in ("restart", "gasp"):
            tip = f"restart to attempt {ev.get('attempt')}" if kind == "restart" else f"dying gasp ({ev.get('source')})"
            color = "#6a1b9a" if kind == "restart" else "#000"
            out.append(f'<line data-kind="{kind}" data-attempt="{esc(ev.get("attempt", ""))}" x1="{x:.2f}" '
                       f'y1="{page.top - 4}" x2="{x:.2f}" y2="{bottom}" stroke="{color}" stroke-dasharray="4 3">'
                       f'<title>{esc(tip)}</title></line>')
    for failure in good.failures:
        y = lane_y.get(failure.rank, page.top) + LANE / 2
        count = "unknown" if failure.steps_recomputed is None else failure.steps_recomputed
        tip = (f"attempt {failure.attempt} failed: rank {failure.rank} {failure.cause} at "
               f"+{failure.at - page.start:.2f} s; lost {failure.time_lost:.2f} s, steps recomputed {count}")
        out.append(marked("failure", tip, ring(page.px(failure.at), y), rank=failure.rank, attempt=failure.attempt,
                          steps_recomputed=count))
    return out


_DEFS = ('<defs><pattern id="unknown" width="6" height="6" patternUnits="userSpaceOnUse" '
         'patternTransform="rotate(45)"><rect width="6" height="6" fill="#e0e0e0"/>'
         '<line x1="0" y1="0" x2="0" y2="6" stroke="#9e9e9e" stroke-width="2"/></pattern></defs>')


def _legend() -> str:
    """The parts (fills) and the end states (markers), in one row each, above the lanes."""
    out, x = ['<g data-kind="legend">'], 4.0
    for part in goodput_mod.PARTS:
        out.append(f'<g><title>{esc(MEANING[part])}</title><rect x="{x:.0f}" y="6" width="14" height="12" '
                   f'fill="{COLORS[part]}"/><text x="{x + 18:.0f}" y="16">{esc(part)}</text></g>')
        x += 26 + 7 * len(part)
    x = 4.0
    for state in ENDS:
        label = f"rank {state}"
        out.append(f'<g>{_end_mark(state, x + 8, 24)}<text x="{x + 18:.0f}" y="37">{esc(label)}</text></g>')
        x += 30 + 7 * len(label)
    out.append(f'<g><circle cx="{x + 8:.0f}" cy="33" r="7" fill="none" stroke="#b71c1c" stroke-width="2"/>'
               f'<text x="{x + 20:.0f}" y="37">{esc("failure (where its lost time began)")}</text></g></g>')
    return "".join(out)

