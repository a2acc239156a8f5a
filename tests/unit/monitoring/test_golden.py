"""The readers of events.jsonl give, byte for byte, what they gave when their outputs were recorded.

``tests/data/events/`` holds the inputs: real runs' events files (``launcher run`` of the integration
tests' workers: a DDP script killed and hung, a heartbeating rank hung, a silent rank hung, steps
recomputed after a failure, the two nodes of a coordinated job; paths shortened) and
``generated.jsonl``, the seeded streams of :mod:`tests.unit.monitoring.streams` (seeds 0-99).
``tests/data/golden/`` holds what the code of commit abed7a9 made of them (goodput figures and spans,
the status document and its text view, the multi-node report page), before the readers were
rewritten as tables: a refactor that changes any of it fails here.
"""

import fcntl
import functools
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common import rundir as rundir_mod
from launcher.monitoring import goodput, nodes, status
from tests.unit.monitoring.streams import stream

DATA = Path(__file__).resolve().parents[2] / "data"


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@functools.lru_cache(maxsize=None)
def corpus():
    events = {path.stem: lines(path) for path in (DATA / "events").glob("*.jsonl") if path.stem != "generated"}
    events.update((case["name"], case["events"]) for case in lines(DATA / "events" / "generated.jsonl"))
    return events


def golden(name):
    cases = lines(DATA / "golden" / f"{name}.jsonl")
    return pytest.mark.parametrize("case", cases, ids=[f"{name}-{i}" for i in range(len(cases))])


def as_json(value):
    return json.loads(json.dumps(value))


@golden("goodput")
def test_goodput(case):
    good = goodput.compute(corpus()[case["events"]], now=case["now"])
    assert (good.to_json(), as_json(good.spans), good.summary()) == (case["goodput"], case["spans"], case["summary"])


def write_run_dir(path, case):
    path.mkdir()
    (path / rundir_mod.LOCK).write_text("")
    (path / rundir_mod.LAUNCHER).write_text(json.dumps({"pid": 4242, "started": 1000.0, "ended": case["ended"]}))
    (path / rundir_mod.STATE).write_text(json.dumps({"attempt": case["attempt"], "ranks": [
        {"rank": r, "pid": 2 ** 22 + 10 + r} for r in range(case["ranks"])]}))
    events = [json.dumps(e) for e in corpus()[case["events"]]]
    if case["garbage"]:  # lines that are not events, where the recording put them
        events.insert(case["garbage"][0], "not json")
        events.insert(case["garbage"][1], '{"event": 3, "ts": 1}')
    (path / "events.jsonl").write_text("\n".join(events) + "\n")


@golden("status")
def test_status(case, tmp_path):
    doc = case["doc"]
    if not case.get("doc_only"):
        run_dir = tmp_path / "job"
        write_run_dir(run_dir, case)
        fd = os.open(run_dir / rundir_mod.LOCK, os.O_RDONLY)
        try:
            if case["live"]:
                fcntl.flock(fd, fcntl.LOCK_EX)  # what a running launcher holds
            doc = status.job_status(str(run_dir), now=3000.0)
        finally:
            os.close(fd)
        doc = json.loads(json.dumps(doc).replace(str(run_dir), "<run_dir>"))
        assert doc == case["doc"]
    assert status.format_status(doc) == case["text"]


@golden("nodes")
def test_nodes_report(case):
    runs = [(where, corpus()[events] if isinstance(events, str) else events) for where, events in case["runs"]]
    assert nodes.render(nodes.load(runs), case["title"]) == case["page"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_any_stream_adds_up(seed):
    """Beyond the recorded seeds: every second of the wall time is in exactly one part, the spans are
    in order and the text views render."""
    events = stream(seed)
    good = goodput.compute(events)
    assert math.isclose(sum(good.parts.values()), good.wall, abs_tol=1e-6)
    assert math.isclose(sum(end - begin for _, begin, end, _ in good.spans), good.wall, abs_tol=1e-6)
    assert all(a[2] <= b[1] + 1e-9 for a, b in zip(good.spans, good.spans[1:]))
    assert all(f.time_lost >= 0 for f in good.failures)
    assert good.summary().startswith("goodput ")
