"""Unit tests for ``launcher.run.runner``: the failure summary (``format_root_cause``) and bounded attempt log
directories (``prune_attempt_logs``, issue #17.6)."""

import json

from launcher.supervision.policy import Failure, RunResult
from launcher.run.report import format_root_cause, prune_attempt_logs
from launcher.supervision.states import ExitInfo

TRACEBACK = ["Traceback (most recent call last):", '  File "/job/train.py", line 12, in main',
             "    step()", "ValueError: loss is nan"]
# Output after the exception (atexit hooks, a dataloader's farewell) pushes it out of the last lines.
AFTERWARDS = [f"shutting down worker {i}" for i in range(20)]


def failed_run(tmp_path, log_lines):
    log = tmp_path / "rank_1.log"
    log.write_text("\n".join(log_lines) + "\n")
    failure = Failure(0, 1, "rank 1", ExitInfo(1, 1700000000.0), str(log))
    return RunResult(1, "failed", 1, (failure,)), str(log)


def test_summary_shows_the_exception_from_the_error_file(tmp_path):
    result, log = failed_run(tmp_path, ["step 1"] + AFTERWARDS)
    error_file = tmp_path / "rank_1_error.json"
    error_file.write_text(json.dumps({"message": {"message": "ValueError: loss is nan", "extraInfo": {
        "py_callstack": "\n".join(TRACEBACK) + "\n", "timestamp": "1700000000"}}}))
    lines = format_root_cause(result, error_file=lambda failure: str(error_file))
    assert lines[0].startswith("job failed after 1 attempt(s): first failure of the last attempt was rank 1 "
                               "(exit code 1)")
    assert lines[1] == "exception: ValueError: loss is nan"
    assert lines[2] == f"traceback (from {error_file}):"
    assert lines[3:7] == [f"    {line}" for line in TRACEBACK]
    assert lines[7:] == [f"log: {log}"]


def test_summary_finds_the_traceback_in_the_log(tmp_path):
    result, log = failed_run(tmp_path, ["step 1", *TRACEBACK, *AFTERWARDS])
    lines = format_root_cause(result, error_file=lambda failure: str(tmp_path / "never_written.json"))
    assert lines[1:] == ["exception: ValueError: loss is nan", f"traceback (from {log}):",
                         *(f"    {line}" for line in TRACEBACK)]


def test_summary_without_a_traceback_shows_the_last_lines(tmp_path):
    result, log = failed_run(tmp_path, ["step 1", *AFTERWARDS])
    lines = format_root_cause(result, log_lines=3)
    assert lines[1:] == [f"last 3 line(s) of {log}:", *(f"    {line}" for line in AFTERWARDS[-3:])]


def test_no_failure_no_summary():
    assert format_root_cause(RunResult(0, "succeeded", 1)) == []


def attempts(session):
    return sorted(int(p.name[8:]) for p in session.iterdir() if p.name.startswith("attempt_") and p.name[8:].isdigit())


def make(session, numbers):
    for n in numbers:
        (session / f"attempt_{n}").mkdir(parents=True)
        (session / f"attempt_{n}" / "rank_0.log").write_text("x")


def test_keeps_the_first_and_the_newest_and_never_the_current(tmp_path):
    make(tmp_path, range(30))
    removed = prune_attempt_logs(str(tmp_path), 30, keep=5)
    assert attempts(tmp_path) == [0, 26, 27, 28, 29]  # + attempt 30, about to start
    assert removed == list(range(1, 26))
    (tmp_path / "attempt_30").mkdir()
    assert prune_attempt_logs(str(tmp_path), 31, keep=5) == [26]


def test_a_log_in_use_keeps_its_directory(tmp_path):
    make(tmp_path, range(10))
    busy = [str(tmp_path / "attempt_3" / "rank_1.log")]  # recover-in-place: rank 1 of attempt 3 runs on
    prune_attempt_logs(str(tmp_path), 10, keep=2, in_use=busy)
    assert attempts(tmp_path) == [0, 3, 9]


def test_nothing_to_do(tmp_path):
    assert prune_attempt_logs(str(tmp_path / "missing"), 3) == []
    make(tmp_path, range(3))
    (tmp_path / "taskd_manager.log").write_text("")
    (tmp_path / "attempt_x").mkdir()
    assert prune_attempt_logs(str(tmp_path), 3) == []
    assert attempts(tmp_path) == [0, 1, 2]
