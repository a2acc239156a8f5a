"""``launcher report``: the timeline page is self-contained and shows the run's attempts, failures,
gasps and restarts per rank (parsed back from its SVG)."""

import json
import re
import xml.etree.ElementTree as ET

from launcher.commands.cli import main
from launcher.monitoring.timeline import render
from tests.unit.test_goodput import ev, one_failure_run, hangwatch_run

SVG = "{http://www.w3.org/2000/svg}"


def drawn(page):
    """The SVG elements with a data-kind, as dicts of their data attributes."""
    svg = ET.fromstring(re.search(r"<svg.*</svg>", page, re.S).group(0))
    return [dict(el.attrib, tag=el.tag.replace(SVG, "")) for el in svg.iter() if "data-kind" in el.attrib]


def of(elements, kind):
    return [e for e in elements if e["data-kind"] == kind]


def test_attempts_failures_and_restarts_per_rank():
    log = one_failure_run()
    log.insert(-2, ev(98.0, "gasp", source="prestop"))
    page = render(log, "job x")
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    elements = drawn(page)
    bars = {(int(e["data-rank"]), int(e["data-attempt"])): e["data-state"] for e in of(elements, "attempt")}
    assert bars == {(0, 0): "stopped", (1, 0): "failed", (0, 1): "running", (1, 1): "running"}
    [failure] = of(elements, "failure")
    assert (failure["data-rank"], failure["data-attempt"]) == ("1", "0")
    assert [e["data-attempt"] for e in of(elements, "restart")] == ["1"]
    assert len(of(elements, "gasp")) == 1
    parts = {e["data-part"] for e in of(elements, "part")}
    assert parts == {"startup", "productive", "detection", "stopping", "restarting", "waiting"}
    # Bars are placed in time: attempt 1 of rank 0 starts right of where attempt 0 ends.
    xs = {(int(e["data-rank"]), int(e["data-attempt"])): float(e["x"]) for e in of(elements, "attempt")}
    assert xs[(0, 1)] > xs[(0, 0)]


def test_cli_writes_the_page(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in one_failure_run()))
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(run_dir / "timeline.html")
    assert len(of(drawn((run_dir / "timeline.html").read_text()), "attempt")) == 4
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 1


def test_recomputed_time_and_steps_are_drawn():
    """A failure whose steps the next attempt re-ran: a recomputed part in the job row, the count on the
    failure marker; without step numbers the marker says unknown."""
    elements = drawn(render(hangwatch_run(), "job y"))
    recomputed = [e for e in of(elements, "part") if e["data-part"] == "recomputed"]
    assert [e["data-attempt"] for e in recomputed] == ["1", "2"]
    assert [e["data-steps-recomputed"] for e in of(elements, "failure")] == ["10", "5"]
    assert "steps recomputed 10" in render(hangwatch_run(), "job y")
    assert [e["data-steps-recomputed"] for e in of(drawn(render(one_failure_run(), "z")), "failure")] == ["unknown"]


def test_every_value_from_the_events_is_escaped_at_one_place():
    """An ``attempt`` (or any value) holding markup stays text: main wrote it into an attribute as is."""
    log = one_failure_run()
    hostile = '"><script>alert(1)</script><x a="'
    log.insert(-2, ev(98.0, "gasp", source=hostile, attempt=hostile))
    log.insert(-2, ev(98.5, "restart", attempt=hostile))
    page = render(log, "job <b>")
    assert "<script" not in page and "<b>" not in page
    marks = [e for e in drawn(page) if e["data-kind"] in ("gasp", "restart") and e["data-attempt"] == hostile]
    assert len(marks) == 2  # parsed back whole: the quotes did not end the attribute
