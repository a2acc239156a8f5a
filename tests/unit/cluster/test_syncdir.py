"""The shared directory of restart generations (``launcher.cluster.syncdir``): joining, the files.

The nodes are :class:`Coordinator` objects on one tmp dir (``tests.unit.cluster.test_sync.Node``), as a job's
launchers would use the directory.
"""

import json
import os

from launcher.cluster.syncdir import Generation
from launcher.supervision.policy import RunResult
from tests.unit.cluster.test_sync import Node, failure, gen_files


# -- joining: incarnations and stale directories ---------------------------------------------------
def test_nodes_of_one_start_join_the_same_incarnation(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    assert a.files.path == b.files.path == str(tmp_path / "job" / "inc_0")
    assert sorted(os.listdir(a.files.path)) == ["join.0", "join.1"]
    record = json.loads((tmp_path / "job" / "inc_0" / "join.1").read_text())
    assert record["server"] == 1 and record["name"] == "server 1 (10.0.0.2)" and record["pid"] == os.getpid()


def test_a_restarted_job_with_the_same_run_id_starts_a_new_incarnation(tmp_path):
    """The old start's files (a failure, an abort) never reach the new one, in whatever order the new
    launchers arrive."""
    old_a, old_b = Node(tmp_path, 0), Node(tmp_path, 1)
    old_b.sync.rank_failed(0, [3], failure(3, 7))
    old_b.sync.settle(0, RunResult(7, "failed", 1), failure(3, 7), [3], old_b.waiter())
    new_b = Node(tmp_path, 1)  # B first this time: its own join.1 marks inc_0 as a previous start
    new_a = Node(tmp_path, 0)
    assert new_a.files.path == new_b.files.path == str(tmp_path / "job" / "inc_1")
    assert new_a.files.read(0) == Generation(0)
    assert old_a.files.read(0).abort["exit_code"] == 7


def test_a_closed_incarnation_is_not_joined_even_by_a_node_that_never_joined_it(tmp_path):
    old_a = Node(tmp_path, 0)
    old_a.sync.leave(0, RunResult(1, "sync-timeout", 1))  # node B never came; A gave up and closed it
    new_b = Node(tmp_path, 1)
    assert new_b.files.path.endswith("inc_1")
    assert Node(tmp_path, 0).files.path.endswith("inc_1")


def test_run_ids_keep_jobs_apart(tmp_path):
    a = Node(tmp_path, 0, run_id="job-a")
    Node(tmp_path, 1, run_id="job-b").sync.rank_failed(0, [1], failure(1))
    assert a.files.read(0) == Generation(0)


# -- the files --------------------------------------------------------------------------------------
def test_read_collects_every_node_and_skips_temporary_and_unknown_files(tmp_path):
    a, b, c = (Node(tmp_path, i, count=3) for i in range(3))
    b.sync.rank_failed(0, [3], failure(3, -9, at=5.0))
    a.sync.rank_failed(0, [0, 1], failure(0, 1, at=6.0))
    a.files.write(0, "stopped.0", {})
    c.files.write(0, "done.2", {})
    gen = a.files.gen_path(0)
    for junk in (".failed.2.json.host.1.tmp", "failed.x.json", "notes.txt"):
        with open(os.path.join(gen, junk), "w") as fh:
            fh.write("{")
    with open(os.path.join(gen, "failed.2.json"), "w") as fh:
        fh.write('{"ranks": [5')  # not complete yet (no rename): left out until it is
    state = c.files.read(0)
    assert sorted(state.failed) == [0, 1] and state.stopped == {0} and state.done == {2} and state.abort is None
    assert state.failed_ranks() == (0, 1, 3)
    assert state.missing(3) == [1]
    assert [f.label for f in state.failures()] == ["rank 3 on server 1 (10.0.0.2)", "rank 0 on server 0 (10.0.0.1)"]
    assert state.exit_code() == 137  # the earliest failure: SIGKILL
    assert [f.rank for f in state.failures(exclude=1)] == [0]


def test_writes_are_whole_files_and_abort_has_one_writer(tmp_path):
    a, b = Node(tmp_path, 0), Node(tmp_path, 1)
    assert a.files.write(0, "abort", {"exit_code": 3, "reason": "first"}, exclusive=True)
    assert not b.files.write(0, "abort", {"exit_code": 4, "reason": "second"}, exclusive=True)
    assert gen_files(a) == ["abort"]  # no temporary file left behind
    assert a.files.read(0).abort["reason"] == "first"
    assert Generation(0, abort={"exit_code": 3}).exit_code() == 3
    assert Generation(0).exit_code() == 1


# -- records another node (or anyone) put there: one warning each, the job goes on ----------------
BAD = [b'{"ranks": [1e999]}', b"[" * 100000, b'{"rank": "0", "returncode": [1]}', b"\xff\xfe{}", b"null",
       b'{"ranks": [1, 2], "exited_at": NaN}', b'{"ranks": [18446744073709551616]}']


def test_unusable_records_are_left_out_with_one_warning_each(tmp_path, caplog):
    a = Node(tmp_path, 0)
    gen = tmp_path / "job" / "inc_0" / "gen_0"
    gen.mkdir(parents=True, exist_ok=True)
    for i, content in enumerate(BAD):
        (gen / f"failed.{i + 1}.json").write_bytes(content)
    (gen / "abort").write_text('{"exit_code": 3}')  # no reason: sync.py reads abort["reason"]
    (gen / "next.json").symlink_to("/dev/zero")
    for _ in range(3):  # every poll reads them again; one warning each, not one per poll
        state = a.files.read(0)
        assert state.failed == {} and state.abort is None and state.next is None
        assert state.failures() == [] and state.failed_ranks() == ()
    warned = [r.getMessage() for r in caplog.records if "ignoring it, the job goes on" in r.getMessage()]
    assert len(warned) == len(BAD) + 2, warned
    assert any("number out of range (1e999)" in w for w in warned)
    assert any("deeper than 64 levels" in w for w in warned)
    assert any("is a symlink" in w for w in warned)


def test_failures_sort_whatever_the_clock_fields_hold(tmp_path):
    """``exited_at`` of an int and a float (or absent) sorted together; main compared raw values."""
    a = Node(tmp_path, 0)
    gen = tmp_path / "job" / "inc_0" / "gen_0"
    gen.mkdir(parents=True, exist_ok=True)
    (gen / "failed.1.json").write_text('{"rank": 2, "ranks": [2], "returncode": 1, "exited_at": 5}')
    (gen / "failed.2.json").write_text('{"rank": 4, "ranks": [4], "returncode": 9, "ts": 3.5}')
    assert [f.rank for f in a.files.read(0).failures()] == [4, 2]
