"""Unit tests for ``launcher.runner`` helpers: bounded attempt log directories (issue #17.6)."""

from launcher.runner import prune_attempt_logs


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
