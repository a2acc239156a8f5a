"""The coordination simulator's results (``bench.simnodes``) as a markdown table, report rows and an
SVG plot of how each quantity grows with N (log-log, with the slope of each series)."""

import math
from typing import Dict, List, Optional, Sequence, Tuple

from bench.common import Row

#: (label, getter) of the table's columns.
COLUMNS: Sequence[Tuple[str, object]] = (
    ("start -> all in gen 0 (s)", lambda r: r.get("join_s")),
    ("last join -> all in gen 0 (s)", lambda r: r.get("last_join_s")),
    ("failure -> all told (s)", lambda r: r.get("failure_told_s")),
    ("failure -> median node told (s)", lambda r: r.get("failure_told_median_s")),
    ("failure -> all agreed (s)", lambda r: r.get("failure_agreed_s")),
    ("failure -> median node agreed (s)", lambda r: r.get("failure_agreed_median_s")),
    ("loss -> all told (s)", lambda r: r.get("loss_told_s")),
    ("elastic join -> all in next gen (s)", lambda r: r.get("elastic_join_s")),
    ("requests / gen", lambda r: _gen(r, "requests")),
    ("Range / gen", lambda r: _gen(r, "req_Range")),
    ("watch responses / gen", lambda r: _gen(r, "watch_responses")),
    ("watch events / gen", lambda r: _gen(r, "watch_events")),
    ("MB sent / gen", lambda r: _mb(_gen(r, "bytes_sent"))),
    ("MB received / gen", lambda r: _mb(_gen(r, "bytes_received"))),
    ("etcd CPU s / gen", lambda r: _gen(r, "cpu_s")),
    ("join: requests", lambda r: (r.get("join") or {}).get("requests")),
    ("join: watch responses", lambda r: (r.get("join") or {}).get("watch_responses")),
    ("idle: requests/s", lambda r: (r.get("idle_per_s") or {}).get("requests")),
    ("idle: etcd CPU %", lambda r: _pct((r.get("idle_per_s") or {}).get("cpu_s"))),
)
#: Series of the plot: (label, getter, colour).
SERIES = (("requests / gen", lambda r: _gen(r, "requests"), "#1f77b4"),
          ("watch responses / gen", lambda r: _gen(r, "watch_responses"), "#ff7f0e"),
          ("KB sent / gen", lambda r: _kb(_gen(r, "bytes_sent")), "#2ca02c"),
          ("etcd CPU ms / gen", lambda r: _ms(_gen(r, "cpu_s")), "#d62728"),
          ("failure -> all agreed (ms)", lambda r: _ms(r.get("failure_agreed_s")), "#9467bd"))


def _gen(result: dict, key: str) -> Optional[float]:
    return (result.get("generation") or {}).get(key, 0) if result.get("generation") else None


def _mb(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value / 1e6, 2)


def _kb(value: Optional[float]) -> Optional[float]:
    return None if value is None else value / 1e3


def _ms(value: Optional[float]) -> Optional[float]:
    return None if value is None else value * 1e3


def _pct(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value * 100, 1)


def _cell(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value < 100:
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{int(value):,}"


def table(results: Dict[int, dict]) -> str:
    """One row per quantity, one column per N."""
    sizes = sorted(results)
    lines = ["| | " + " | ".join(f"N = {n:,}" for n in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for label, get in COLUMNS:
        lines.append(f"| {label} | " + " | ".join(_cell(get(results[n])) for n in sizes) + " |")
    return "\n".join(lines)


def rows(results: Dict[int, dict]) -> List[Row]:
    """The report's rows: the latencies at the largest N measured, against the issue's goals."""
    largest = max(results)
    result = results[largest]
    told, lost, ttl = result.get("failure_told_s"), result.get("loss_told_s"), result.get("ttl", 5)
    return [Row("simnodes", f"N={largest} simulated nodes: failure -> every node told", "ms", _ms(told), {}, "",
                "< 1000 ms", told is not None and told < 1.0, 1),
            Row("simnodes", f"N={largest} simulated nodes: node lost -> every node told", "ms", _ms(lost), {}, "",
                f"<= TTL + 1 s ({ttl + 1} s)", lost is not None and lost <= ttl + 1, 1)]


def details(results: Dict[int, dict]) -> List[str]:
    return ["", table(results), ""] + [f"- N={n}: errors {r.get('errors')}" for n, r in sorted(results.items())
                                       if r.get("errors")]


def slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of log(y) on log(x): 1 is linear growth, 2 quadratic."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def svg(results: Dict[int, dict], path: str, baseline: Optional[Dict[int, dict]] = None,
        title: str = "Coordination cost per generation vs. N") -> None:
    """A log-log plot of ``SERIES`` against N, written to ``path``; ``baseline`` (another design's
    results) dashed."""
    width, height, left, top, right, bottom = 820, 460, 70, 40, 310, 50
    runs = [(results, "", "")] + ([(baseline, " (before)", ' stroke-dasharray="5,4"')] if baseline else [])
    sizes = sorted(set(results) | set(baseline or {}))
    values = [v for data, _, _ in runs for _, get, _ in SERIES for n in data for v in [get(data[n])] if v]
    lo_y, hi_y = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    lo_x, hi_x = math.log10(min(sizes)), math.log10(max(sizes))
    plot_w, plot_h = width - left - right, height - top - bottom

    def xy(n: float, v: float) -> Tuple[float, float]:
        x = left + (math.log10(n) - lo_x) / ((hi_x - lo_x) or 1) * plot_w
        return x, top + plot_h - (math.log10(v) - lo_y) / ((hi_y - lo_y) or 1) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{title} (log-log)</text>']
    for exp in range(lo_y, hi_y + 1):
        _, y = xy(sizes[0], 10 ** exp)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{exp}</text>')
    for n in sizes:
        x, _ = xy(n, 10 ** lo_y)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{top + plot_h + 18}" text-anchor="middle">N = {n:,}</text>')
    row = 0
    for data, suffix, dash in runs:
        for label, get, colour in SERIES:
            points = [(n, get(data[n])) for n in sorted(data) if get(data[n])]
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, v) for n, v in points))
            if coords:
                out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
                out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in
                        (xy(n, v) for n, v in points)]
            k = slope(points)
            out.append(f'<text x="{left + plot_w + 15}" y="{top + 20 + 20 * row}" fill="{colour}">{label}{suffix}'
                       f'{"" if k is None else f" (slope {k:.2f})"}</text>')
            row += 1
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m bench.simreport RESULTS.json [--svg PATH] [--baseline OLD.json]``: the table (and
    plot) of results ``bench.simnodes`` wrote, without measuring again."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.simreport", description=main.__doc__.split("\n")[0])
    parser.add_argument("results")
    parser.add_argument("--svg", default=None)
    parser.add_argument("--baseline", default=None, help="results of another design, dashed in the plot")
    args = parser.parse_args(argv)
    with open(args.results, encoding="utf-8") as fh:
        results = {int(k): v for k, v in json.load(fh).items()}
    print(table(results))
    if args.svg:
        baseline = None
        if args.baseline:
            with open(args.baseline, encoding="utf-8") as fh:
                baseline = {int(k): v for k, v in json.load(fh).items()}
        svg(results, args.svg, baseline)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
