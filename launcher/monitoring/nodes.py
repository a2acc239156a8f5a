"""``launcher report DIR1 DIR2 ...``: one timeline for a multi-node job, one lane per node.

Each node's launcher writes its own run dir, with its own clock. The nodes' clocks are aligned from
the coordinator's records that every node writes at (nearly) the same moment: ``sync_start`` (all
nodes joined) and ``sync_barrier`` of each generation (every node stopped it; each node passes the
barrier within one poll of the last node's ``stopped`` file). A node's offset is the median, over the
records it shares with the reference node (the lowest server index), of the reference's time minus its
own; its spread is reported as the alignment's uncertainty. Without shared records a node is not
shifted, and the page says so.

The page shows each node's goodput parts in its lane (``goodput.py`` of its own events), rings where
its own ranks failed, which node failed first in each generation (``sync_failure_announced``, dated by
the failed rank's exit), and a table of how long every node waited at each barrier
(``sync_barrier.waited``: from its own stop until every node had stopped).
"""

import statistics
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from launcher.monitoring import eventsfile
from launcher.monitoring import goodput as goodput_mod
from launcher.monitoring.timeline import (LANE, ROW, Page, attempt_line, esc, html_page, job_lane, marked, ring,
                                          svg)

#: Events every node records at about the same moment: the clock-alignment points.
_ALIGN = ("sync_start", "sync_barrier")


class Node(NamedTuple):
    """One node's run: its name, events (newest run), goodput, and clock offset (seconds to add)."""

    name: str
    index: int
    events: List[dict]
    good: "goodput_mod.Goodput"
    offset: float = 0.0
    spread: Optional[float] = None  # max deviation of the alignment points from the offset (None: unaligned)


def load(runs: Sequence[Tuple[str, List[dict]]]) -> List[Node]:
    """Nodes from ``(run dir, events)`` pairs, ordered by server index, clocks aligned to the first."""
    nodes = []
    for position, (where, events) in enumerate(runs):
        run = eventsfile.last_run(events)
        joined = next((ev for ev in run if ev.get("event") == "sync_join"), {})
        start = run[0] if run and run[0].get("event") == "start" else {}
        index = joined.get("server") if isinstance(joined.get("server"), int) else position
        name = str(start.get("server") or f"node {index}")
        nodes.append(Node(f"{name} ({where})" if name in (n.name for n in nodes) else name, index, run,
                          goodput_mod.compute(run)))
    nodes.sort(key=lambda n: n.index)
    reference = _points(nodes[0].events) if nodes else {}
    return [nodes[0]] + [_aligned(node, reference) for node in nodes[1:]] if nodes else []


def _points(events: List[dict]) -> Dict[tuple, float]:
    return {(ev["event"], ev.get("generation")): float(ev["ts"]) for ev in events if ev.get("event") in _ALIGN}


def _aligned(node: Node, reference: Dict[tuple, float]) -> Node:
    deltas = [reference[key] - ts for key, ts in _points(node.events).items() if key in reference]
    if not deltas:
        return node
    offset = statistics.median(deltas)
    return node._replace(offset=offset, spread=max(abs(d - offset) for d in deltas))


def first_failures(nodes: Sequence[Node]) -> Dict[int, Tuple[float, Node, dict]]:
    """generation -> (aligned time, node, its ``sync_failure_announced``) of the node that failed first."""
    out: Dict[int, Tuple[float, Node, dict]] = {}
    for node in nodes:
        exits = {(ev.get("attempt"), ev.get("rank")): ev for ev in node.events if ev.get("event") == "rank_exited"}
        for ev in node.events:
            generation = ev.get("generation")  # None: not as the coordinator writes it, which names it
            if ev.get("event") != "sync_failure_announced" or generation is None:
                continue
            exited = exits.get((generation, ev.get("rank")), {})
            at = float(exited.get("exited_at") or ev["ts"]) + node.offset
            if generation not in out or at < out[generation][0]:
                out[generation] = (at, node, ev)
    return out


def waits(nodes: Sequence[Node]) -> Dict[int, Dict[str, float]]:
    """generation -> node name -> seconds it waited at that generation's barrier."""
    out: Dict[int, Dict[str, float]] = {}
    for node in nodes:
        for ev in node.events:
            if ev.get("event") == "sync_barrier" and ev.get("generation") is not None \
                    and isinstance(ev.get("waited"), (int, float)):
                out.setdefault(ev.get("generation"), {})[node.name] = float(ev["waited"])
    return out


def render(nodes: Sequence[Node], title: Optional[str] = None) -> str:
    """The page: a lane per node (aligned), the first failure of each generation, the waits."""
    start = min(n.good.start + n.offset for n in nodes)
    page = Page(start, max(n.good.end + n.offset for n in nodes) - start)
    height = page.top + ROW * len(nodes) + 40
    firsts = first_failures(nodes)
    shapes = [page.axis(height)]
    shapes += [attempt_line(page, float(ev["ts"]) + nodes[0].offset, ev.get("attempt"), height - 28, "generation")
               for ev in nodes[0].events if ev.get("event") == "attempt_start"]
    for i, node in enumerate(nodes):
        shapes += _lane(page, node, page.top + ROW * i, firsts)
    title = title or f"{len(nodes)}-node job: " + ", ".join(n.name for n in nodes)
    return html_page(title, _lines(page, nodes, firsts), svg(height, shapes), _wait_table(nodes))


def _lane(page: Page, node: Node, y: float, firsts: Dict[int, Tuple[float, Node, dict]]) -> List[str]:
    """One node's goodput parts, shifted onto the first node's clock, and a ring where each of its own
    ranks failed (a bold one on the node that failed first in that generation)."""
    spans = [(p, b + node.offset, e + node.offset, a) for p, b, e, a in node.good.spans]
    shapes = job_lane(spans, page, y, node.name, node=node.name)
    for failure in node.good.failures:
        first = any(f[1] is node and f[2].get("generation") == failure.attempt for f in firsts.values())
        tip = (f"{node.name}: rank {failure.rank} {failure.cause} in generation {failure.attempt} at "
               f"+{failure.at + node.offset - page.start:.2f} s" + ("; the first node to fail" if first else ""))
        shapes.append(marked("failure", tip, ring(page.px(failure.at + node.offset), y + LANE / 2, first),
                             node=node.name, attempt=failure.attempt, first=int(first)))
    return shapes


def _lines(page: Page, nodes: Sequence[Node], firsts: Dict[int, Tuple[float, Node, dict]]) -> List[str]:
    """The text above the picture: the run, the first node to fail per generation, each node's goodput
    and clock alignment."""
    lines = [f"started {page.started}, {page.wall:.1f} s, {len(nodes)} nodes"]
    for generation, (at, node, ev) in sorted(firsts.items()):
        lines.append(f"generation {generation}: {node.name} failed first (rank {ev.get('rank')}, exit code "
                     f"{ev.get('exit_code')}) at +{at - page.start:.2f} s")
    return lines + [f"{n.name}: {n.good.summary()}" for n in nodes] + [_alignment(n) for n in nodes[1:]]


def _alignment(node: Node) -> str:
    if node.spread is None:
        return f"{node.name}: clock not aligned (no sync_start / sync_barrier shared with the first node)"
    return f"{node.name}: clock shifted by {node.offset:+.3f} s (alignment points agree within {node.spread:.3f} s)"


def _wait_table(nodes: Sequence[Node]) -> str:
    table = waits(nodes)
    if not table:
        return ""
    head = "".join(f"<th>{esc(n.name)}</th>" for n in nodes)
    rows = "".join(f"<tr><td>{esc(g)}</td>" + "".join(f'<td data-node="{esc(n.name)}" data-generation="{esc(g)}">'
                                                      f"{esc(_seconds(w.get(n.name)))}</td>" for n in nodes) + "</tr>"
                   for g, w in sorted(table.items()))
    caption = "Waited at each restart barrier (s): from the node's own stop until every node had stopped"
    return (f'<h3>{esc(caption)}</h3><table data-kind="waits" border="1" cellpadding="4">'
            f"<tr><th>generation</th>{head}</tr>{rows}</table>\n")


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"
