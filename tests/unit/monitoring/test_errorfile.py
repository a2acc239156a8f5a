"""torch's error file and log tracebacks, read into the root-cause summary (launcher.monitoring.errorfile)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.monitoring.errorfile import (MAX_ERROR_FILE_BYTES, MAX_TRACEBACK_LINES, TRACEBACK_HEADER, clip,
                                           explain_failure, last_traceback, read_error_file)

CALLSTACK = (f"{TRACEBACK_HEADER}\n"
             '  File "/job/train.py", line 12, in main\n'
             "    step()\n"
             "ValueError: loss is nan\n")


def torch_record_file(path, message="ValueError: loss is nan", callstack=CALLSTACK):
    """The JSON torch's ErrorHandler.record_exception writes (torch 2.x)."""
    path.write_text(json.dumps({"message": {"message": message,
                                            "extraInfo": {"py_callstack": callstack, "timestamp": "1700000000"}}}))
    return str(path)


def test_error_file_as_record_writes_it(tmp_path):
    found = read_error_file(torch_record_file(tmp_path / "error.json"))
    assert found.message == "ValueError: loss is nan"
    assert found.traceback == tuple(CALLSTACK.splitlines())
    assert found.source == str(tmp_path / "error.json")


def test_error_file_string_message_format(tmp_path):
    """torch also accepts ``{"message": "text"}`` (its "new message format"): no traceback."""
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "worker ran out of memory", "timestamp": 1}))
    found = read_error_file(str(path))
    assert (found.message, found.traceback) == ("worker ran out of memory", ())


def test_error_file_missing_broken_or_huge_is_ignored(tmp_path):
    path = tmp_path / "error.json"
    assert read_error_file(str(path)) is None
    for text in ("", "{", "[]", '{"no": "message"}', '{"message": {"extraInfo": {}}}', '{"message": 3}'):
        path.write_text(text)
        assert read_error_file(str(path)) is None, text
    torch_record_file(path, callstack="x" * MAX_ERROR_FILE_BYTES)
    assert read_error_file(str(path)) is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_error_file_never_raises(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("ef") / "error.json"
    path.write_bytes(data)
    found = read_error_file(str(path))
    assert found is None or isinstance(found.message, str)


def test_last_traceback_in_log_followed_by_other_output(tmp_path):
    log = tmp_path / "rank_1.log"
    noise = "".join(f"step {i}\n" for i in range(50))
    later = "".join(f"atexit line {i}\n" for i in range(20))
    log.write_text(noise + "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'old'\n"
                   + noise + CALLSTACK + later)
    found = last_traceback(str(log))
    assert found.message == "ValueError: loss is nan"
    assert found.traceback == tuple(CALLSTACK.splitlines())


def test_last_traceback_none_when_absent_or_cut(tmp_path):
    log = tmp_path / "rank_1.log"
    log.write_text("step 1\nstep 2\n")
    assert last_traceback(str(log)) is None
    log.write_text(TRACEBACK_HEADER + '\n  File "a.py", line 1\n')  # the rank died mid-write
    assert last_traceback(str(log)) is None
    assert last_traceback(str(tmp_path / "missing.log")) is None


def test_last_traceback_reads_only_the_window(tmp_path):
    log = tmp_path / "rank_1.log"
    log.write_text(CALLSTACK + "x" * 1000 + "\n")
    assert last_traceback(str(log), window=500) is None
    assert last_traceback(str(log), window=2000).message == "ValueError: loss is nan"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([TRACEBACK_HEADER, "  File \"x.py\", line 1", "    code", "", "Err: m",
                                 "plain"]), max_size=30))
def test_last_traceback_block_shape(tmp_path_factory, lines):
    """Whatever the log, a found traceback starts at the header and ends at an unindented line."""
    path = tmp_path_factory.mktemp("tb") / "rank.log"
    path.write_text("\n".join(lines))
    found = last_traceback(str(path))
    if found is not None:
        assert found.traceback[0] == TRACEBACK_HEADER
        assert found.message == found.traceback[-1] and not found.message[:1].isspace()


def test_clip_keeps_header_and_frames_nearest_the_exception():
    lines = [TRACEBACK_HEADER] + [f"  frame {i}" for i in range(100)] + ["RecursionError: deep"]
    clipped = clip(lines)
    assert len(clipped) == MAX_TRACEBACK_LINES
    assert clipped[0] == TRACEBACK_HEADER and clipped[-1] == "RecursionError: deep"
    assert clipped[1] == f"... {len(lines) - MAX_TRACEBACK_LINES + 1} line(s) omitted ..."
    assert clip(lines[:5]) == tuple(lines[:5])


def test_explain_prefers_the_error_file(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text("Traceback (most recent call last):\n  File \"b.py\", line 2\nOSError: from the log\n")
    error_file = torch_record_file(tmp_path / "error.json")
    assert explain_failure(error_file, str(log)).message == "ValueError: loss is nan"
    assert explain_failure(str(tmp_path / "none.json"), str(log)).message == "OSError: from the log"
    assert explain_failure(None, None) is None
