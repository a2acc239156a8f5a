"""``launcher report``: the timeline page is self-contained and shows the run's attempts, failures,
gasps and restarts per rank (parsed back from its SVG)."""

import json
import re
import xml.etree.ElementTree as ET

from launcher.commands.cli import main
from launcher.monitoring.timeline import render
from tests.unit.monitoring.test_goodput import ev, one_failure_run, hangwatch_run

SVG = "{http://www.w3.org/2000/svg}"


def drawn(page):
    """The SVG elements with a data-kind, as dicts of their data attributes."""
    svg = ET.fromstring(re.search(r"<svg.*</svg>", page, re.S).group(0))
    return [dict(el.attrib, tag=el.tag.replace(SVG, "")) for el in svg.iter() if "data-kind" in el.attrib]


def of(elements, kind):
    return [e for e in elements if e["data-kind"] == kind]


from launcher.monitoring.timeline import COLORS, ranges
from tests.unit.monitoring.test_goodput import hung_run, with_outputs


def lanes_by_ranks(elements, kind):
    """{(ranks, attempt): [element, ...]} for ``phase`` / ``end`` elements."""
    out = {}
    for e in of(elements, kind):
        out.setdefault((e["data-ranks"], int(e["data-attempt"])), []).append(e)
    return out


def expand(text):
    """``0-1,3`` -> [0, 1, 3]."""
    out = []
    for item in filter(None, text.split(",")):
        lo, _, hi = item.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def ends_per_rank(elements):
    """{(rank, attempt): how it ended} from the end markers of the (grouped) lanes."""
    return {(rank, int(e["data-attempt"])): e["data-state"] for e in of(elements, "end") for rank in expand(e["data-ranks"])}


def job_part_at(elements, x):
    return next(e["data-part"] for e in of(elements, "part") if float(e["x"]) <= x < float(e["x"]) + float(e["width"]))


def test_attempts_failures_and_restarts_per_rank():
    log = with_outputs(one_failure_run(), (10.2, 0, 1, 10.0), (12.2, 0, 0, 12.0), (76.1, 1, 0, 76.0))
    log.insert(-2, ev(98.0, "gasp", source="prestop"))
    page = render(log, "job x")
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    elements = drawn(page)
    ends = {k: v[0]["data-state"] for k, v in lanes_by_ranks(elements, "end").items()}
    # attempt 1's ranks have no exit in this log: drawn as still running at the end
    assert ends == {("0", 0): "stopped", ("1", 0): "failed", ("0", 1): "running", ("1", 1): "running"}
    [failure] = of(elements, "failure")
    assert (failure["data-rank"], failure["data-attempt"]) == ("1", "0")
    assert [e["data-attempt"] for e in of(elements, "restart")] == ["1"]
    assert [e["data-attempt"] for e in of(elements, "attempt")] == ["0", "1"]  # labelled attempt starts
    assert "attempt 1</text>" in page and ">0 s</text>" in page and "seconds since the run started" in page
    assert len(of(elements, "gasp")) == 1
    parts = {e["data-part"] for e in of(elements, "part")}
    assert parts == {"startup", "unknown", "detection", "stopping", "restarting", "waiting"}


def test_rank_lanes_speak_the_job_lanes_parts():
    """The bug this replaces: rank bars coloured by how they ended, in colours the legend gave to parts
    (orange "detection" for a whole stopped attempt, green "productive" while the job restarted). Now
    a rank's phase is the job's part at that moment, except its own start-up before its first output."""
    log = with_outputs(one_failure_run(), (10.2, 0, 1, 10.0), (12.2, 0, 0, 12.0), (76.1, 1, 0, 76.0))
    elements = drawn(render(log))
    phases = lanes_by_ranks(elements, "phase")
    for (ranks, attempt), drawn_phases in phases.items():
        for e in drawn_phases:
            assert e["fill"] == COLORS[e["data-part"]]
            mid = float(e["x"]) + float(e["width"]) / 2
            job = job_part_at(elements, mid)
            assert e["data-part"] == job or (e["data-part"], job) in (("startup", "unknown"),
                                                                      ("restarting", "unknown")), (e, job)
    # Rank 0 printed 2 s after rank 1: 2 s more start-up on its lane; nothing is "productive" (no beats).
    assert [p["data-part"] for p in phases[("0", 0)]] == ["startup", "unknown", "detection", "stopping"]
    assert not any(e["data-part"] == "productive" for e in of(elements, "phase"))
    fills = {e.get("fill") for e in of(elements, "end")}
    assert not fills & set(COLORS.values())  # end states are shapes, not part colours


def test_a_hung_rank_shows_its_hung_time():
    elements = drawn(render(hung_run()))
    assert [p["data-part"] for p in lanes_by_ranks(elements, "phase")[("0", 0)]][-2:] == ["hung", "stopping"]
    [failure] = of(elements, "failure")
    assert failure["data-rank"] == "0"


def test_ranks_with_the_same_history_share_a_lane_and_exceptions_stand_alone():
    ranks = list(range(64))
    log = [ev(0.0, "start", argv=["python", "train.py"], server="node3"),
           ev(1.0, "attempt_start", attempt=0, ranks=ranks)]
    log += [ev(2.0, "rank_spawned", attempt=0, rank=r) for r in ranks]
    log += [ev(4.0 if r != 9 else 30.0, "rank_output", attempt=0, rank=r, at=4.0 if r != 9 else 30.0) for r in ranks]
    log += [ev(50.0, "rank_exited", attempt=0, rank=5, state="failed", exit_code=1, exited_at=50.0)]
    log += [ev(51.0, "rank_exited", attempt=0, rank=r, state="stopped", exit_code=143, exited_at=51.0)
            for r in ranks if r != 5]
    log += [ev(52.0, "attempt_end", attempt=0, failed=True), ev(53.0, "job_end", reason="failed")]
    page = render(log)
    lanes = {e["data-ranks"]: int(e["data-count"]) for e in of(drawn(page), "lane")}
    assert lanes == {"0-4,6-8,10-63": 62, "5": 1, "9": 1}
    assert "<title>train.py on node3: 64 ranks, 1 attempt(s), failed</title>" in page


def test_ranges():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and ranges([3]) == "3" and ranges([]) == ""
    assert expand(ranges([0, 1, 2, 5, 7, 8])) == [0, 1, 2, 5, 7, 8]


def test_text_from_the_run_is_escaped():
    log = one_failure_run()
    log[0] = dict(log[0], argv=["python", "<img src=x onerror=alert(1)>.py"], server='n"0')
    page = render(log)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;.py on n&quot;0" in page
    drawn(page)  # still well-formed


def test_cli_writes_the_page(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in one_failure_run()))
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(run_dir / "timeline.html")
    page = (run_dir / "timeline.html").read_text()
    assert len(of(drawn(page), "end")) == 4 and str(run_dir) in page
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


def test_every_value_from_the_events_is_escaped():
    """An ``attempt`` (or any value) holding markup stays text: it once went into an attribute as is."""
    log = one_failure_run()
    hostile = '"><script>alert(1)</script><x a="'
    log.insert(-2, ev(98.0, "gasp", source=hostile, attempt=hostile))
    log.insert(-2, ev(98.5, "restart", attempt=hostile))
    page = render(log, "job <b>")
    assert "<script" not in page and "<b>" not in page
