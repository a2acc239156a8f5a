"""Reading events.jsonl for its readers: the newest run's usable events, from damaged files too."""

import pytest

from launcher.monitoring import eventsfile


@pytest.mark.parametrize("name, text, expected", [
    ("missing", None, []),
    ("empty", "", []),
    ("two runs: the newest only", '{"ts": 1, "event": "start", "run_id": "a"}\n{"ts": 2, "event": "x", "run_id": "a"}\n'
     '{"ts": 3, "event": "start", "run_id": "b"}\n{"ts": 4, "event": "y", "run_id": "b"}\n', ["start", "y"]),
    ("a torn line and a foreign one", '{"ts": 1, "event": "start", "run_id": "a"}\n{"ts": 2, "ev\n[1, 2]\n7\n'
     '{"ts": 3, "event": "y", "run_id": "a"}\n', ["start", "y"]),
    ("the start text inside a value", '{"ts": 1, "event": "start", "run_id": "a"}\n'
     '{"ts": 2, "event": "note", "run_id": "a", "text": "\\"event\\": \\"start\\""}\n', ["start", "note"]),
    ("a value that holds it unescaped is not JSON", '{"ts": 1, "event": "start", "run_id": "a"}\n'
     '{"ts": 2, "event": "z", "run_id": "a"}\nnot json "event": "start" here\n', ["start", "z"]),
    ("no start at all", '{"ts": 2, "event": "x"}\n', ["x"]),
])
def test_read_last_run_on_damaged_files(tmp_path, name, text, expected):
    path = tmp_path / "events.jsonl"
    if text is not None:
        path.write_text(text)
    assert [e["event"] for e in eventsfile.read_last_run(str(path))] == expected


def test_a_generation_of_another_type_makes_the_event_unusable(tmp_path):
    """The multi-node report keys and sorts by generation: one of another type is skipped as the
    reader skips any event whose keys it cannot use, and counted."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"ts": 1, "event": "start", "run_id": "a"}\n'
                    '{"ts": 2, "event": "sync_barrier", "run_id": "a", "generation": [0], "waited": 1}\n'
                    '{"ts": 3, "event": "sync_barrier", "run_id": "a", "generation": "0", "waited": 1}\n'
                    '{"ts": 4, "event": "sync_barrier", "run_id": "a", "generation": 0, "waited": 1}\n')
    read = eventsfile.read_events(str(path))
    assert [e["ts"] for e in read.events] == [1, 4] and read.skipped == 2
