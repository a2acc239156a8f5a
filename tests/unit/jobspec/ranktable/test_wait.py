"""Waiting for the cluster to finish the rank table: retries, progress lines, and a real timeout."""

import json
import logging
import os
import threading
import time

import pytest

from launcher.common.errors import LauncherError, UsageError
from launcher.jobspec.ranktable import RankTableError, generate_rank_table, wait_for_rank_table

COMPLETE = json.dumps(generate_rank_table([("10.0.0.1", 2), ("10.0.0.2", 2)]))
INITIALIZING = json.dumps({"status": "initializing"})
FAST = {"poll_interval": 0.01, "progress_interval": 0.05}


@pytest.fixture
def progress():
    """Progress lines of the wait logger (its own handler: the CLI may stop propagation)."""
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("launcher.jobspec.ranktable.wait")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _operator(path, steps):
    """Play the Ascend Operator: each step is (delay, bytes); the file is rewritten in place."""
    def run():
        for delay, content in steps:
            time.sleep(delay)
            with open(path, "r+b" if path.exists() else "wb") as fh:  # truncate + write, no rename
                fh.truncate(0)
                fh.write(content)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_ready_table_returns_at_once(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_text(COMPLETE)
    (tmp_path / "version").write_text("42")
    table = wait_for_rank_table(path, timeout=5, **FAST)
    assert (table.world_size, table.revision, table.source) == (4, "42", str(path))


def test_waits_through_missing_initializing_and_half_written(tmp_path, progress):
    path = tmp_path / "hccl.json"
    half = COMPLETE.encode()[: len(COMPLETE) // 2]
    thread = _operator(path, [(0.05, INITIALIZING.encode()), (0.05, b""), (0.05, half),
                              (0.05, b'{"status": "\xe5'), (0.05, COMPLETE.encode())])
    start = time.monotonic()
    table = wait_for_rank_table(path, timeout=10, **FAST)
    thread.join()
    assert table.world_size == 4
    assert time.monotonic() - start < 5
    lines = [r.getMessage() for r in progress]
    assert lines[0] == f"waiting for rank table {path}: file not found (0 s of 10 s)"
    assert lines[-1].startswith(f"rank table {path} is ready after")


def test_timeout_is_detected(tmp_path, progress):
    """Legacy defect 2: the scripts' wait loop never noticed its own timeout."""
    path = tmp_path / "hccl.json"
    path.write_text(INITIALIZING)
    start = time.monotonic()
    with pytest.raises(LauncherError) as info:
        wait_for_rank_table(path, timeout=0.3, poll_interval=0.02, progress_interval=0.1)
    elapsed = time.monotonic() - start
    assert not isinstance(info.value, UsageError) and info.value.exit_code == 1
    assert info.value.message == f'rank table {path} not ready after 0.3 s: last saw status "initializing"'
    assert 0.3 <= elapsed < 2.0
    # ~15 attempts, but progress lines are rate-limited to one per 0.1 s.
    assert 1 <= len(progress) <= 4
    assert all('status "initializing"' in r.getMessage() for r in progress)


def test_timeout_on_missing_file_says_so(tmp_path):
    with pytest.raises(LauncherError, match="last saw file not found"):
        wait_for_rank_table(tmp_path / "hccl.json", timeout=0.1, **FAST)


@pytest.mark.parametrize("content, seen", [
    (COMPLETE[:10].encode(), r"rank table is not valid JSON: line 1 column \d+: .*"),
    (b"", "rank table is empty"),
    # cut inside a multi-byte character
    (b'{"status": "\xe5', r"rank table is not UTF-8 \(byte 0xe5 at offset 12, line 1: unexpected end of data\)"),
    (INITIALIZING.encode(), 'status "initializing"'),
])
def test_partial_states_are_retried_until_the_timeout(tmp_path, content, seen):
    path = tmp_path / "hccl.json"
    path.write_bytes(content)
    with pytest.raises(LauncherError, match=f"not ready after 0.05 s: last saw {seen}$") as info:
        wait_for_rank_table(path, timeout=0.05, **FAST)
    assert not isinstance(info.value, UsageError)


def test_zero_timeout_is_one_attempt(tmp_path, progress):
    with pytest.raises(LauncherError, match="not ready after 0 s: last saw file not found"):
        wait_for_rank_table(tmp_path / "hccl.json", timeout=0, **FAST)
    assert progress == []  # no sleep, so no progress line


def test_unreadable_path_is_retried(tmp_path):
    path = tmp_path / "hccl.json"
    path.symlink_to(path)  # open() fails (ELOOP) until the cluster writes the file
    with pytest.raises(LauncherError, match="last saw cannot read file") as info:
        wait_for_rank_table(path, timeout=0.05, **FAST)
    assert not isinstance(info.value, UsageError)


def test_directory_fails_at_once(tmp_path):
    """Not a regular file: nothing the cluster writes will change that, so no wait (exit 2)."""
    with pytest.raises(RankTableError, match="is a directory, not a regular file"):
        wait_for_rank_table(tmp_path, timeout=30, **FAST)


def test_missing_directory_fails_at_once(tmp_path, progress):
    """A mistyped --rank-table: the cluster mounts the directory before the container starts."""
    path = tmp_path / "no-such-dir" / "hccl.json"
    with pytest.raises(RankTableError, match=f"directory {tmp_path / 'no-such-dir'} does not exist"):
        wait_for_rank_table(path, timeout=30, **FAST)
    assert progress == []


@pytest.mark.parametrize("make, problem", [
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is a character device, not a regular file"),
    (lambda p: p.write_bytes(b"[" * 100 + b"]" * 100), "nests arrays or objects deeper than 64 levels"),
    (lambda p: p.write_bytes('{"server_id": "caf\u00e9"}'.encode("latin-1")), "is not UTF-8"),
    (lambda p: p.write_bytes(b'{"rank_count": ' + b"1" * 5000 + b"}"), "has an integer of more than 4300"),
])
def test_files_no_rewrite_can_fix_fail_at_once(tmp_path, make, problem):
    path = tmp_path / "hccl.json"
    make(path)
    with pytest.raises(RankTableError) as info:
        wait_for_rank_table(path, timeout=30, **FAST)
    assert info.value.message.startswith(f"rank table {path} {problem}")


def test_missing_file_progress_every_30_s_by_default(tmp_path, progress, monkeypatch):
    """Ten lines in a 300 s wait, not sixty; the clock is simulated, nothing sleeps."""
    from launcher.jobspec.ranktable import wait as wait_mod

    now = [0.0]
    monkeypatch.setattr(wait_mod.time, "monotonic", lambda: now[0])

    def fake_sleep(seconds):
        now[0] += seconds

    monkeypatch.setattr(wait_mod, "_sleep", fake_sleep)
    with pytest.raises(LauncherError, match="last saw file not found"):
        wait_for_rank_table(tmp_path / "hccl.json", timeout=300)
    assert len(progress) == 10
    assert progress[1].getMessage().endswith("file not found (30 s of 300 s)")


def test_invalid_completed_table_fails_at_once(tmp_path):
    data = json.loads(COMPLETE)
    data["server_list"][1]["device"][0]["rank_id"] = "0"
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(data))
    start = time.monotonic()
    with pytest.raises(RankTableError) as info:
        wait_for_rank_table(path, timeout=10, **FAST)
    assert time.monotonic() - start < 5
    assert any("duplicate rank_id 0" in p for p in info.value.problems)


@pytest.mark.parametrize("kwargs", [{"timeout": -1}, {"poll_interval": 0}, {"progress_interval": -1}])
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(UsageError):
        wait_for_rank_table(tmp_path / "hccl.json", **kwargs)


def test_stop_signal_ends_the_wait_at_once(tmp_path):
    """SIGTERM while waiting for the operator: the launcher stops now, not at the timeout."""
    import os
    import signal as signal_mod
    import threading
    import time as time_mod

    from launcher.common import signals
    from launcher.common.errors import LauncherError

    signals.install()
    try:
        path = tmp_path / "hccl.json"
        path.write_text('{"status": "initializing"}')
        threading.Timer(0.3, os.kill, (os.getpid(), signal_mod.SIGTERM)).start()
        started = time_mod.monotonic()
        with pytest.raises(LauncherError) as exc:
            wait_for_rank_table(path, timeout=30, poll_interval=5)
        assert exc.value.exit_code == 143
        assert time_mod.monotonic() - started < 3
        assert signals.pop_pending() == signal_mod.SIGTERM
    finally:
        signals.uninstall()
