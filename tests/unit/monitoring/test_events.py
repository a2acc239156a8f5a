"""Unit tests for ``launcher.monitoring.events``: the ``events.jsonl`` lifecycle log."""

import json
import os
import stat
import time

import pytest

from launcher.monitoring import events as events_mod
from launcher.monitoring.events import EventLog, read_events


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "events.jsonl")


def lines_of(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read().splitlines()


def test_one_json_line_per_emit(path):
    log = EventLog(path, "run-1")
    before = time.time()
    rec1 = log.emit("start", world_size=8, argv=["python", "t.py"])
    rec2 = log.emit("rank_exit", rank=3, code=1)
    after = time.time()
    log.close()
    lines = lines_of(path)
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first == rec1 and second == rec2
    assert first["event"] == "start" and first["run_id"] == "run-1"
    assert first["world_size"] == 8 and first["argv"] == ["python", "t.py"]
    assert first["launcher_pid"] == os.getpid()
    assert before - 1e-3 <= first["ts"] <= second["ts"] <= after + 1e-3
    assert (second["event"], second["rank"], second["code"]) == ("rank_exit", 3, 1)
    with open(path, "rb") as fh:
        assert fh.read().endswith(b"\n")


def test_each_emit_is_a_single_write_of_a_whole_line(path, monkeypatch):
    writes = []
    real_write = os.write

    def spy(fd, data):
        writes.append(bytes(data))
        return real_write(fd, data)

    log = EventLog(path, "r")
    monkeypatch.setattr(events_mod.os, "write", spy)
    log.emit("a", text="x" * 5000)
    log.emit("b")
    log.close()
    assert len(writes) == 2
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)


def test_newlines_in_fields_do_not_break_lines(path):
    log = EventLog(path, "r")
    log.emit("note", message="line 1\nline 2")
    log.close()
    assert [e["message"] for e in read_events(path)] == ["line 1\nline 2"]
    assert len(lines_of(path)) == 1


def test_appends_across_instances(path):
    first = EventLog(path, "run-a")
    first.emit("start")
    first.close()
    second = EventLog(path, "run-b")
    second.emit("start")
    second.emit("stop", exit_code=0)
    second.close()
    assert [(e["run_id"], e["event"]) for e in read_events(path)] == [
        ("run-a", "start"), ("run-b", "start"), ("run-b", "stop")]


def test_two_open_instances_interleave_whole_lines(path):
    a, b = EventLog(path, "a"), EventLog(path, "b")
    for i in range(5):
        a.emit("tick", i=i)
        b.emit("tick", i=i)
    a.close()
    b.close()
    events = read_events(path)
    assert len(events) == 10
    assert [(e["run_id"], e["i"]) for e in events] == [(r, i) for i in range(5) for r in ("a", "b")]


def test_emit_after_close_is_dropped_but_returns_the_record(path):
    log = EventLog(path, "r")
    log.emit("one")
    log.close()
    log.close()  # idempotent
    rec = log.emit("two", x=1)
    assert rec["event"] == "two" and rec["x"] == 1
    assert [e["event"] for e in read_events(path)] == ["one"]


def test_non_json_values_are_stringified(path, tmp_path):
    log = EventLog(path, "r")
    log.emit("start", where=tmp_path, exc=ValueError("boom"))
    log.close()
    (event,) = read_events(path)
    assert event["where"] == str(tmp_path)
    assert event["exc"] == "boom"


def test_file_is_private(path):
    EventLog(path, "r").close()
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0


def test_read_events_missing_file(tmp_path):
    assert read_events(str(tmp_path / "nope.jsonl")) == []


def test_read_events_skips_garbage_and_torn_lines(path):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"event": "a", "ts": 1}\nnot json\n\n{"event": "b", "ts": 2}\n{"event": "c", "t')
    assert [e["event"] for e in read_events(path)] == ["a", "b"]


def test_full_disk_warns_once_and_emit_goes_on(caplog):
    log = EventLog("/dev/full", "run-1")  # every write fails with ENOSPC, as on a full disk
    with caplog.at_level("WARNING", logger="launcher.monitoring.events"):
        for i in range(3):
            assert log.emit("tick", i=i)["i"] == i
    log.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings


def test_a_torn_line_is_ended_before_the_next_event(path, monkeypatch):
    log = EventLog(path, "run-1")
    real_write = os.write
    monkeypatch.setattr(events_mod.os, "write", lambda fd, data: real_write(fd, data[:10]))  # disk full mid-line
    log.emit("cut")
    monkeypatch.setattr(events_mod.os, "write", real_write)
    log.emit("whole", n=1)
    log.close()
    assert [e["event"] for e in read_events(path)] == ["whole"]
