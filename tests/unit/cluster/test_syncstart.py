"""The first barrier of an elastic job (``launcher.cluster.syncstart``): torchrun's last call, with the
fake store of test_sync (a shared tmp dir) and a fake clock; ``joined`` is scripted by the test."""

import pytest

from launcher.cluster.syncstart import announce_join, elastic_start
from launcher.common.errors import LauncherError
from launcher.supervision.policy import Agreement
from tests.unit.cluster.test_sync import elastic


def joined_by_time(node, schedule):
    """``joined()`` from ``{server: time it joins}`` on the node's clock."""
    return lambda: {index for index, at in schedule.items() if node.clock.now >= at}


def test_every_server_joined_starts_at_once_with_all(tmp_path):
    a = elastic(tmp_path, 0, min_nodes=2, wait=5.0)
    wait = a.waiter()
    assert elastic_start(a.sync, lambda: {0, 1, 2}, wait) == (0, 1, 2)
    assert a.sync.members == (0, 1, 2) and sum(wait.calls) == pytest.approx(0.5)  # the record to appear
    assert a.files.read(0).start["servers"] == [0, 1, 2]
    assert not [name for name in a.names() if name in ("sync_last_call", "sync_membership")]


def test_min_joined_starts_with_them_after_the_last_call(tmp_path):
    a = elastic(tmp_path, 0, min_nodes=2, wait=5.0)
    now = a.clock.now
    wait = a.waiter()
    assert elastic_start(a.sync, joined_by_time(a, {0: now, 1: now + 1.0}), wait) == (0, 1)
    assert a.sync.members == (0, 1)
    # MIN reached at +1 s; the last call ends 5 s later
    assert a.clock.now - now == pytest.approx(6.5)
    assert ("sync_last_call", {"joined": [0, 1], "min_nodes": 2, "wait": 5.0}) in a.events
    assert ("sync_membership", {"generation": 0, "servers": [0, 1], "previous": [0, 1, 2]}) in a.events


def test_max_joining_during_the_last_call_starts_at_once(tmp_path):
    a = elastic(tmp_path, 0, min_nodes=2, wait=5.0)
    now = a.clock.now
    assert elastic_start(a.sync, joined_by_time(a, {0: now, 1: now, 2: now + 2.0}), a.waiter()) == (0, 1, 2)
    assert a.clock.now - now == pytest.approx(2.5)


def test_a_join_after_min_does_not_move_the_deadline(tmp_path):
    """torchrun sets the deadline when the count reaches MIN, and later joins do not renew it."""
    a = elastic(tmp_path, 0, min_nodes=1, wait=5.0)
    now = a.clock.now
    assert elastic_start(a.sync, joined_by_time(a, {0: now, 1: now + 4.0}), a.waiter()) == (0, 1)
    assert a.clock.now - now == pytest.approx(5.5)


def test_the_first_proposal_wins_and_a_server_left_out_is_told(tmp_path):
    a, b = elastic(tmp_path, 0), elastic(tmp_path, 1)
    a.files.write(0, "start.json", {"servers": [0, 2]}, exclusive=True)
    assert elastic_start(b.sync, lambda: {0, 1, 2}, b.waiter()) == (0, 2)
    assert b.sync.members == (0, 1, 2)  # not one of them: it joins the running job instead
    assert elastic_start(a.sync, lambda: {0, 1}, a.waiter()) == (0, 2) and a.sync.members == (0, 2)


def test_fewer_than_min_within_the_sync_timeout_is_an_error(tmp_path):
    a = elastic(tmp_path, 0, min_nodes=2, wait=5.0)
    a.sync.timeout = 3.0
    with pytest.raises(LauncherError, match=r"server 1 \(10.0.0.2\), server 2 \(10.0.0.3\) did not join within 3 s "
                                            r"\(--nnodes needs at least 2 servers\)"):
        elastic_start(a.sync, lambda: {0}, a.waiter())
    assert a.files.read(0).start is None


def test_a_stop_signal_ends_the_wait(tmp_path):
    a = elastic(tmp_path, 0)
    assert elastic_start(a.sync, lambda: {0}, a.waiter(lambda n: False)) is None


def test_a_server_too_late_for_generation_0_joins_it_as_a_membership_change(tmp_path):
    a, b, late = elastic(tmp_path, 0), elastic(tmp_path, 1), elastic(tmp_path, 2)
    assert elastic_start(a.sync, lambda: {0, 1}, a.waiter()) == (0, 1)  # after the last call
    assert elastic_start(b.sync, lambda: {0, 1}, b.waiter()) == (0, 1)
    a.sync.attempt_started(0)
    assert elastic_start(late.sync, lambda: {0, 1, 2}, late.waiter()) == (0, 1)
    announce_join(late.sync)
    a.loop.run_due()
    [update] = a.loop.posted
    assert update.membership and update.reason == "server 2 (10.0.0.3) joining"
    b.files.write(0, "stopped.1", {})
    a.files.write(0, "stopped.0", {})
    assert late.sync.join_running(0, late.waiter()) == Agreement((), membership=True)
    assert late.sync.members == (0, 1, 2)  # learned from start.json, then itself
    assert a.sync.settle(0, None, None, [], a.waiter()) == Agreement((), membership=True)
    assert a.sync.members == (0, 1, 2)
