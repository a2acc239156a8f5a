"""The restart policy, driven by scripted events through a fake process group (no processes)."""

import signal
from typing import Dict, List, Optional

import pytest

from launcher.supervision.procgroup import ControlRequest, ProcessGroup, RankExited, SignalReceived
from launcher.jobspec.rankenv import WorkerSpec
from launcher.jobspec.recovery import resolve_strategy
from launcher.supervision.states import ExitInfo
from launcher.supervision.policy import Agreement, Failure, NoSync, PeerUpdate, RestartPolicy
from launcher.supervision.hooks import ClusterHooks, JobHooks
from launcher.supervision.supervisor import Supervisor


class ScriptedGroup(ProcessGroup):
    """Replays one list of events per attempt; ``None`` in a script means "the timeout passed"."""

    def __init__(self, scripts: List[list]):
        self.scripts = scripts
        self.calls: List[tuple] = []
        self.attempt = -1
        self.ranks: List[int] = []
        self.alive: Dict[int, int] = {}

    def start(self, specs, attempt):
        self.attempt = attempt
        self.ranks = [s.rank for s in specs]
        self.alive = {s.rank: 1000 * (attempt + 1) + s.rank for s in specs}
        self.calls.append(("start", attempt, tuple(self.ranks)))

    def wait_event(self, timeout: Optional[float]):
        script = self.scripts[self.attempt]
        if not script:
            if timeout is None:
                raise AssertionError("supervisor waits forever on an empty script")
            return None
        event = script.pop(0)
        if isinstance(event, RankExited):
            self.alive.pop(event.rank, None)
        return event

    def signal_main(self, ranks, signum):
        self.calls.append(("signal", tuple(ranks), signum))

    def kill_groups(self, ranks=None):
        self.calls.append(("kill", tuple(ranks or ())))

    def ensure_gone(self, timeout):
        self.calls.append(("ensure_gone", self.attempt))
        return []

    def pids(self):
        return dict(self.alive)

    def respawn(self, spec, attempt):
        self.alive[spec.rank] = 5000 + spec.rank
        self.calls.append(("respawn", spec.rank, attempt))


def exited(rank: int, code: int) -> RankExited:
    return RankExited(rank, ExitInfo(code, 0.0))


def specs_for(n: int):
    def build(attempt, failed_before):
        build.seen.append((attempt, tuple(failed_before)))
        return [WorkerSpec(r, r, r, "worker", ("x",), {}) for r in range(n)]
    build.seen = []
    return build


def supervisor(group, build, policy, emit, hold=None, **kwargs):
    """A Supervisor whose job is ``build`` plus the job hooks in ``kwargs`` (the rest: its own arguments)."""
    hooks = {k: kwargs.pop(k) for k in ("resume_note", "progress", "status", "failure_text", "busy_devices", "health")
             if k in kwargs}
    return Supervisor(group, JobHooks(build, **hooks), policy, emit, cluster=ClusterHooks(hold=hold or (lambda: None)),
                      **kwargs)


def supervise(scripts, n=2, strategy=None, **policy):
    if strategy is not None:
        policy["strategy"] = resolve_strategy(strategy, {})
    group = ScriptedGroup(scripts)
    events: List[tuple] = []
    sup = supervisor(group, specs_for(n), RestartPolicy(**policy), lambda name, **kw: events.append((name, kw)))
    return sup.run(), group, events, sup


def test_all_ranks_exit_zero_is_success():
    result, group, events, _ = supervise([[exited(0, 0), exited(1, 0)]])
    assert (result.exit_code, result.reason, result.attempts) == (0, "succeeded", 1)
    assert [c[0] for c in group.calls] == ["start", "ensure_gone"]
    assert [e[0] for e in events].count("rank_exited") == 2


def test_failure_stops_others_then_restarts_with_failed_ranks():
    scripts = [[exited(1, 3), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, events, sup = supervise(scripts, max_restarts=1)
    assert result.exit_code == 0 and result.attempts == 2
    assert ("signal", (0,), signal.SIGTERM) in group.calls
    assert group.calls.index(("ensure_gone", 0)) < group.calls.index(("start", 1, (0, 1)))
    assert sup.job.specs_for.seen == [(0, ()), (1, (1,))]
    exits = [kw for name, kw in events if name == "rank_exited"]
    assert [(e["rank"], e["state"]) for e in exits[:2]] == [(1, "failed"), (0, "stopped")]


def test_budget_spent_returns_first_failure_of_last_attempt():
    scripts = [[exited(1, 3), exited(0, -15)], [exited(0, -9), exited(1, -15)]]
    result, _, events, _ = supervise(scripts, max_restarts=1)
    assert result.reason == "failed"
    assert result.exit_code == 128 + 9
    assert [(f.attempt, f.rank) for f in result.failures] == [(0, 1), (1, 0)]
    assert result.root_cause.rank == 0
    assert any(name == "restart_budget_spent" for name, _ in events)


def test_zero_budget_never_restarts():
    result, group, _, _ = supervise([[exited(0, 1), exited(1, -15)]], max_restarts=0)
    assert result.exit_code == 1
    assert [c for c in group.calls if c[0] == "start"] == [("start", 0, (0, 1))]


def test_rank_that_ignores_sigterm_is_killed_at_the_deadline():
    # rank 1 fails; rank 0 ignores SIGTERM: the timeout passes (None), then SIGKILL, then it exits.
    scripts = [[exited(1, 1), None, exited(0, -9)]]
    result, group, events, _ = supervise(scripts, stop_timeout=0.01)
    assert ("kill", (0,)) in group.calls
    assert group.calls.index(("signal", (0,), signal.SIGTERM)) < group.calls.index(("kill", (0,)))
    assert any(name == "kill_group" for name, _ in events)
    assert result.exit_code == 1


def test_stop_signal_is_forwarded_once_and_sets_exit_code():
    # SIGTERM arrives; a second SIGTERM while ranks save must not be forwarded again.
    scripts = [[SignalReceived(signal.SIGTERM), SignalReceived(signal.SIGTERM), exited(0, 0), exited(1, -15)]]
    result, group, _, _ = supervise(scripts, max_restarts=5)
    assert result.exit_code == 128 + signal.SIGTERM and result.reason == "gasp"
    assert [c for c in group.calls if c[0] == "signal"] == [("signal", (0, 1), signal.SIGTERM)]
    assert [c for c in group.calls if c[0] == "start"] == [("start", 0, (0, 1))]  # no restart


def test_signal_during_failure_stop_prevents_restart():
    scripts = [[exited(0, 1), SignalReceived(signal.SIGTERM), exited(1, -15)], []]
    result, group, _, _ = supervise(scripts, max_restarts=3)
    assert result.reason == "gasp"
    assert [c[0] for c in group.calls].count("start") == 1


def test_second_sigint_kills_immediately():
    scripts = [[SignalReceived(signal.SIGINT), SignalReceived(signal.SIGINT), None, exited(0, -9), exited(1, -9)]]
    result, group, _, _ = supervise(scripts, grace_period=1000)
    assert ("kill", (0, 1)) in group.calls
    assert result.exit_code == 128 + signal.SIGINT


def test_signal_during_backoff_stops_without_restart():
    # The second quick failure in a row backs off; SIGTERM during that wait ends the run.
    scripts = [[exited(0, 1), exited(1, -15)], [exited(0, 1), exited(1, -15), SignalReceived(signal.SIGTERM)], []]
    result, group, events, _ = supervise(scripts, max_restarts=5, backoff=5, backoff_max=5)
    assert result.reason == "gasp" and result.attempts == 2
    assert [c[0] for c in group.calls].count("start") == 2
    assert [kw["backoff"] for name, kw in events if name == "restart"] == [0.0, 5.0]


class ClockedGroup(ScriptedGroup):
    """A scripted group on a fake clock: a number in a script is seconds that pass; a wait with
    nothing left to replay lets its whole timeout pass."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self.now = 0.0
        self.waits: List[float] = []

    def wait_event(self, timeout):
        script = self.scripts[self.attempt]
        while script and isinstance(script[0], (int, float)):
            self.now += script.pop(0)
        if not script and timeout is not None:
            self.now += timeout
            self.waits.append(timeout)
            return None
        return super().wait_event(timeout)


def clocked_supervise(scripts, **policy):
    group = ClockedGroup(scripts)
    events: List[tuple] = []
    sup = supervisor(group, specs_for(1), RestartPolicy(**policy), lambda name, **kw: events.append((name, kw)),
                     clock=lambda: group.now)
    return sup.run(), group, [kw for name, kw in events if name == "restart"]


def test_crash_loop_backs_off_exponentially_up_to_the_cap():
    scripts = [[0.1, exited(0, 1)] for _ in range(9)] + [[exited(0, 0)]]
    result, group, restarts = clocked_supervise(scripts, max_restarts=20, backoff=0.5, backoff_max=30)
    assert result.reason == "succeeded" and result.attempts == 10
    assert [r["backoff"] for r in restarts] == [0, 0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [r["quick_failures"] for r in restarts] == list(range(1, 10))
    assert group.waits == pytest.approx([0.5, 1, 2, 4, 8, 16, 30, 30])  # the waits happen on the event loop


def test_a_healthy_attempt_restarts_at_once_and_resets_the_backoff():
    scripts = [[1, exited(0, 1)], [1, exited(0, 1)], [1, exited(0, 1)], [120, exited(0, 1)], [1, exited(0, 1)],
               [exited(0, 0)]]
    _result, _group, restarts = clocked_supervise(scripts, max_restarts=9, backoff=0.5, backoff_max=30)
    assert [r["backoff"] for r in restarts] == [0, 0.5, 1, 0, 0]
    assert [r["ran_for"] for r in restarts] == [1, 1, 1, 120, 1]


def test_backoff_disabled_by_default_policy_and_by_a_zero_cap():
    assert [RestartPolicy().restart_delay(n) for n in range(6)] == [0] * 6
    assert [RestartPolicy(backoff=0.5, backoff_max=0).restart_delay(n) for n in range(6)] == [0] * 6
    assert RestartPolicy(backoff=0.5, backoff_max=30).restart_delay(10_000) == 30


def test_prestop_during_backoff_answers_and_ends_the_run():
    replies = []
    gasp = ControlRequest("gasp", {}, lambda payload, final=False: replies.append((payload, final)))
    scripts = [[exited(0, 1)], [exited(0, 1), 0.2, gasp], []]
    result, group, restarts = clocked_supervise(scripts, max_restarts=5, backoff=10, backoff_max=10)
    assert result.reason == "gasp" and result.attempts == 2 and restarts[-1]["backoff"] == 10
    assert replies[-1][1] is True and replies[-1][0]["done"]


def test_control_requests_are_answered_not_dropped():
    replies = []
    request = ControlRequest("bogus", {}, lambda payload, final=False: replies.append((payload, final)))
    _result, _, _, _ = supervise([[request, exited(0, 0), exited(1, 0)]])
    assert replies and replies[0][1] is True and replies[0][0]["ok"] is False


@pytest.mark.parametrize("code,expected", [(2, 2), (-11, 139), (-6, 134)])
def test_exit_code_mapping(code, expected):
    result, _, _, _ = supervise([[exited(0, code), exited(1, -15)]], n=2)
    assert result.exit_code == expected


def test_exit_strategy_stops_at_once_despite_budget():
    result, group, events, _ = supervise([[exited(1, 4), exited(0, -15)], []], strategy="exit", max_restarts=5)
    assert (result.reason, result.exit_code) == ("failed", 4)
    assert [c[0] for c in group.calls].count("start") == 1
    assert any(name == "exit_for_reschedule" for name, _ in events)


def test_dump_gasps_the_healthy_ranks_then_retries():
    scripts = [[exited(1, 1), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, events, _ = supervise(scripts, strategy="retry,dump", max_restarts=1, grace_period=7)
    assert result.reason == "succeeded" and result.attempts == 2
    gasp = [kw for name, kw in events if name == "gasp"]
    assert gasp and gasp[0]["source"] == "rank 1 failed" and gasp[0]["timeout"] == 7
    assert ("signal", (0,), signal.SIGTERM) in group.calls


def test_recover_dumps_then_exits_for_rescheduling():
    result, _, events, _ = supervise([[exited(0, 9), exited(1, -15)]], strategy="recover", max_restarts=3)
    names = [name for name, _ in events]
    assert result.exit_code == 9 and names.index("gasp") < names.index("exit_for_reschedule")


def test_recover_in_place_respawns_only_the_failed_rank():
    scripts = [[exited(1, 1), exited(1, 0), exited(0, 0)]]
    group = ScriptedGroup(scripts)
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=2, strategy=resolve_strategy("recover-in-place", {}),
                                                        in_place_supported=True), lambda name, **kw: None)
    result = sup.run()
    assert result.exit_code == 0 and result.attempts == 1
    assert ("respawn", 1, 1) in group.calls
    assert not any(c[0] == "signal" for c in group.calls)  # rank 0 kept running
    assert sup.restarts == 1


def test_recover_in_place_falls_back_to_the_group_when_unsupported():
    scripts = [[exited(1, 1), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, _, _ = supervise(scripts, strategy="recover-in-place", max_restarts=1)
    assert not any(c[0] == "respawn" for c in group.calls)
    assert result.attempts == 2 and result.exit_code == 0


def with_scheduler(attempt, failed_before):
    return [WorkerSpec(-1, -1, -1, "scheduler", ("x",), {})] + \
           [WorkerSpec(r, r, r, "worker", ("x",), {}) for r in range(2)]


def test_scheduler_is_killed_as_soon_as_the_workers_exited():
    """MindSpore: a scheduler stopped first leaves the workers hanging in their teardown; once they are
    gone it has nothing to save and ignores SIGTERM, so it is killed at once, not at the deadline."""
    scripts = [[SignalReceived(signal.SIGINT), exited(0, -15), exited(1, -15), exited(-1, -9)]]
    group = ScriptedGroup(scripts)
    events: List[tuple] = []
    result = supervisor(group, with_scheduler, RestartPolicy(), lambda name, **kw: events.append((name, kw))).run()
    stops = [c for c in group.calls if c[0] in ("signal", "kill")]
    assert stops == [("signal", (0, 1), signal.SIGINT), ("kill", (-1,))]
    assert ("kill_group", {"attempt": 0, "ranks": [-1], "reason": "workers gone"}) in events
    assert result.reason == "signal" and result.exit_code == 130


def test_a_failure_after_the_other_workers_ended_kills_the_scheduler_at_once():
    """Rank 1 succeeded, then rank 0 fails: only the scheduler is left, and it is never just signalled."""
    scripts = [[exited(1, 0), exited(0, 3), exited(-1, -9)]]
    group = ScriptedGroup(scripts)
    result = supervisor(group, with_scheduler, RestartPolicy(), lambda name, **kw: None).run()
    assert [c for c in group.calls if c[0] in ("signal", "kill") and c[1]] == [("kill", (-1,))]
    assert result.exit_code == 3


# -- --sync-dir hooks (launcher.cluster.sync), with a scripted coordinator -------------------------------------
class ScriptedSync(NoSync):
    """Records the supervisor's hook calls (into the group's call list, to check their order) and
    answers ``settle`` from a list of agreements; an agreement may first run the event loop."""

    def __init__(self, group: ScriptedGroup, agreements: List[Agreement], wait_first: bool = False):
        self.group, self.agreements, self.wait_first = group, agreements, wait_first
        self.settled: list = []

    def attempt_started(self, generation):
        self.group.calls.append(("sync_started", generation))

    def rank_failed(self, generation, ranks, failure):
        self.group.calls.append(("sync_failed", generation, tuple(ranks), failure.rank))

    def settle(self, generation, result, failure, failed_ranks, wait):
        self.settled.append((generation, result and result.reason, failure and failure.rank, tuple(failed_ranks)))
        if self.wait_first and not wait(0.5):
            return Agreement()
        return self.agreements.pop(0)

    def leave(self, generation, result, quiet=False):
        self.group.calls.append(("sync_leave", generation, result.reason, result.exit_code))


def supervise_synced(scripts, agreements, n=2, wait_first=False, **policy):
    group = ScriptedGroup(scripts)
    sync = ScriptedSync(group, agreements, wait_first)
    events: List[tuple] = []
    sup = supervisor(group, specs_for(n), RestartPolicy(**policy), lambda name, **kw: events.append((name, kw)),
                     sync=sync)
    return sup.run(), group, events, sup, sync


def peer_failed(generation=0, rank=3, code=-9):
    return PeerUpdate(generation, Failure(generation, rank, f"rank {rank} on server 1", ExitInfo(code, 0.0)),
                      f"rank {rank} on server 1 failed")


def peer_joined(generation=0):
    return PeerUpdate(generation, Failure(generation, -1, "server 2 joining", ExitInfo(1, 0.0)), "server 2 joining",
                      membership=True)


def test_sync_membership_change_restarts_without_counting(caplog):
    caplog.set_level("INFO")
    scripts = [[peer_joined(), exited(0, -15), exited(1, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, events, sup, sync = supervise_synced(scripts, [Agreement((), membership=True), Agreement()],
                                                        max_restarts=0, gasp_signal=signal.SIGUSR1)
    assert result.reason == "succeeded" and result.attempts == 2 and not result.failures
    assert ("signal", (0, 1), signal.SIGUSR1) in group.calls  # the ranks save, as for a peer's failure
    assert sync.settled[0] == (0, None, None, ())  # no failure, no spent budget: to the barrier
    assert sup.restarts == 0 and sup.attempt_no == 1
    [restart] = [kw for name, kw in events if name == "restart"]
    assert restart == {"attempt": 1, "scope": "membership", "reason": "server 2 joining", "counted": False,
                       "restarts_left": 0}
    assert "membership change, not counted" in caplog.text


def test_sync_a_failure_after_a_membership_change_still_ends_a_spent_budget():
    scripts = [[peer_joined(), exited(0, -15), exited(1, -15)], [exited(1, 3), exited(0, -15)]]
    result, _, _, sup, sync = supervise_synced(scripts, [Agreement((), membership=True), Agreement()],
                                               max_restarts=0)
    assert (result.reason, result.exit_code, result.attempts) == ("failed", 3, 2)
    assert sync.settled[1] == (1, "failed", 1, (1,))


def test_sync_a_join_counts_when_the_barrier_found_a_failure_elsewhere(caplog):
    """This node saw only the join; another node's rank failed in the same generation."""
    caplog.set_level("INFO")
    scripts = [[peer_joined(), exited(0, -15), exited(1, -15)], [exited(0, 0), exited(1, 0)]]
    result, _, events, sup, _ = supervise_synced(scripts, [Agreement((3,)), Agreement()], max_restarts=1)
    assert result.reason == "succeeded" and sup.restarts == 1
    [restart] = [kw for name, kw in events if name == "restart"]
    assert restart["scope"] == "group" and restart["after_rank"] is None
    assert "after a failure on another node" in caplog.text


def test_sync_local_failure_is_announced_before_the_others_are_stopped():
    scripts = [[exited(1, 3), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, _, sup, sync = supervise_synced(scripts, [Agreement((1, 3)), Agreement()], max_restarts=1)
    assert result.reason == "succeeded"
    assert group.calls.index(("sync_started", 0)) < group.calls.index(("sync_failed", 0, (1,), 1)) \
        < group.calls.index(("signal", (0,), signal.SIGTERM))
    # The barrier's union of every node's failures is the next attempt's failed_before.
    assert sup.job.specs_for.seen == [(0, ()), (1, (1, 3))]
    assert sync.settled == [(0, None, 1, (1,)), (1, "succeeded", None, ())]
    assert group.calls[-1] == ("sync_leave", 1, "succeeded", 0)


def test_sync_peer_failure_stops_the_ranks_with_the_save_signal_and_counts_once():
    scripts = [[peer_failed(), exited(0, -15), exited(1, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, events, sup, sync = supervise_synced(scripts, [Agreement((3,)), Agreement()], max_restarts=1,
                                                        gasp_signal=signal.SIGUSR1, stop_timeout=4)
    assert result.reason == "succeeded" and result.attempts == 2
    assert ("signal", (0, 1), signal.SIGUSR1) in group.calls
    [stop] = [kw for name, kw in events if name == "stop_group"]
    assert stop["timeout"] == 4 and stop["reason"] == "rank 3 on server 1 failed"
    assert not any(c[0] == "sync_failed" for c in group.calls)  # not a local failure
    assert sync.settled[0] == (0, None, 3, ())
    assert sup.restarts == 1 and sup.job.specs_for.seen == [(0, ()), (1, (3,))]
    [restart] = [kw for name, kw in events if name == "restart"]
    assert restart["after_rank"] == 3 and restart["attempt"] == 1
    assert [f.label for f in result.failures] == ["rank 3 on server 1"]


def test_sync_peer_failure_with_the_budget_spent_ends_with_the_peers_code():
    result, group, _, _, sync = supervise_synced([[peer_failed(), exited(0, -15), exited(1, -15)]], [Agreement()])
    assert (result.reason, result.exit_code) == ("failed", 137)
    assert sync.settled == [(0, "failed", 3, ())]
    assert group.calls[-1] == ("sync_leave", 0, "failed", 137)


def test_sync_peer_update_of_another_generation_is_ignored():
    scripts = [[peer_failed(generation=5), exited(0, 0), exited(1, 0)]]
    result, group, _, _, _ = supervise_synced(scripts, [Agreement()])
    assert result.reason == "succeeded"
    assert not any(c[0] == "signal" for c in group.calls)


def test_sync_peer_update_after_every_local_rank_finished_is_left_to_the_finish_barrier():
    group = ScriptedGroup([[exited(0, 0), exited(1, 0)]])
    sup = supervisor(group, specs_for(2), RestartPolicy(), lambda name, **kw: None, sync=ScriptedSync(group, []))
    attempt = sup._run_attempt(0, ())
    sup.outside.on_peer(attempt, peer_failed())
    assert attempt.failure is None and not sup.failures
    assert not any(c[0] == "signal" for c in group.calls)


def test_sync_peer_failure_after_some_local_ranks_finished_restarts_them_all():
    scripts = [[exited(0, 0), peer_failed(), exited(1, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, _, _, _ = supervise_synced(scripts, [Agreement((3,)), Agreement()], max_restarts=1)
    assert ("signal", (1,), signal.SIGTERM) in group.calls
    assert result.reason == "succeeded" and ("start", 1, (0, 1)) in group.calls


def test_sync_agreement_to_end_replaces_a_restart():
    scripts = [[exited(1, 3), exited(0, -15)], []]
    result, group, _, _, _ = supervise_synced(scripts, [Agreement(exit_code=1, reason="sync-timeout")],
                                              max_restarts=3)
    assert (result.reason, result.exit_code, result.attempts) == ("sync-timeout", 1, 1)
    assert [c[0] for c in group.calls].count("start") == 1


def test_sync_a_finished_node_fails_with_the_job():
    result, _, _, _, _ = supervise_synced([[exited(0, 0), exited(1, 0)]], [Agreement(exit_code=134, reason="failed")])
    assert (result.reason, result.exit_code) == ("failed", 134)


def test_sync_stop_signal_during_the_barrier_ends_the_run():
    scripts = [[exited(1, 3), exited(0, -15), SignalReceived(signal.SIGTERM)], []]
    result, group, _, _, _ = supervise_synced(scripts, [], wait_first=True, max_restarts=3)
    assert result.reason == "gasp" and result.attempts == 1
    assert [c[0] for c in group.calls].count("start") == 1
    assert group.calls[-1] == ("sync_leave", 0, "gasp", 128 + signal.SIGTERM)


def test_sync_leave_after_a_restart_uses_the_new_generation():
    # The cluster never lets attempt 1 start: the other nodes, already in generation 1, must hear it there.
    scripts = [[exited(1, 3), exited(0, -15)], []]
    group = ScriptedGroup(scripts)
    sync = ScriptedSync(group, [Agreement((1,))])
    holds = iter([None, "reset.json: FaultFlushing"])
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=1, hold_timeout=0.01),
                     lambda name, **kw: None, hold=lambda: next(holds, "reset.json: FaultFlushing"), sync=sync)
    result = sup.run()
    assert result.reason == "cluster-timeout"
    assert group.calls[-1] == ("sync_leave", 1, "cluster-timeout", 1)


def test_restart_line_says_why_and_what_the_ranks_resume_from(caplog):
    scripts = [[exited(1, -9), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    group = ScriptedGroup(scripts)
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=3), lambda name, **kw: None,
                     resume_note=lambda attempt: f"resuming from plan {attempt}")
    with caplog.at_level("INFO", logger="launcher.supervision.supervisor"):
        assert sup.run().exit_code == 0
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("restarting")] == [
        "restarting (restart 1 of 3) after rank 1 failed (killed by SIGKILL); resuming from plan 1"]


def test_first_ctrl_c_says_a_second_kills_now(caplog):
    scripts = [[SignalReceived(signal.SIGINT), SignalReceived(signal.SIGINT), None, exited(0, -9), exited(1, -9)]]
    with caplog.at_level("INFO", logger="launcher.supervision.supervisor"):
        supervise(scripts, grace_period=1000)
    messages = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(messages) if m.startswith("Ctrl-C:"))
    assert messages[first] == ("Ctrl-C: stopping the ranks (up to 1000 s to save and exit); Ctrl-C again to kill "
                               "them now")
    assert "Ctrl-C again: killing the ranks now" in messages[first + 1:]


def test_one_ctrl_c_while_stopping_after_a_failure_does_not_kill(caplog):
    # rank 1 fails; rank 0 is stopping (SIGTERM) when the first Ctrl-C comes: no restart, no SIGKILL yet.
    scripts = [[exited(1, 1), SignalReceived(signal.SIGINT), exited(0, -15)], []]
    with caplog.at_level("INFO", logger="launcher.supervision.supervisor"):
        result, group, _, _ = supervise(scripts, max_restarts=3, stop_timeout=1000)
    assert not [c for c in group.calls if c[0] == "kill"]
    assert [c[0] for c in group.calls].count("start") == 1 and result.reason == "signal"
    assert "Ctrl-C: no restart; Ctrl-C again to kill the ranks now" in [r.getMessage() for r in caplog.records]


def test_hung_rank_is_killed_then_fails_like_a_crash_and_restarts_planned_faulty():
    from launcher.supervision.loopevents import RankHung

    hung = RankHung(1, "no heartbeat for 31 s", ("rank 1 (hung) differs from the rest: in fetch (x.py:1)",))
    scripts = [[hung, exited(1, -9), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    result, group, events, sup = supervise(scripts, max_restarts=1)
    assert result.exit_code == 0 and result.attempts == 2
    assert group.calls.index(("kill", (1,))) < group.calls.index(("signal", (0,), signal.SIGTERM))
    assert sup.failures[0].hang == ("no heartbeat for 31 s", "rank 1 (hung) differs from the rest: in fetch (x.py:1)")
    assert sup.job.specs_for.seen == [(0, ()), (1, (1,))]


def test_hang_after_the_attempt_already_failed_is_ignored():
    from launcher.supervision.loopevents import RankHung

    scripts = [[exited(0, 1), RankHung(1, "late", ()), exited(1, -15)]]
    result, group, _, sup = supervise(scripts)
    assert ("kill", (1,)) not in group.calls
    assert [f.rank for f in sup.failures] == [0] and sup.failures[0].hang == ()


def test_restarts_without_step_progress_end_the_job():
    crash = lambda: [exited(1, 3), exited(0, -15)]
    steps = {0: 40, 1: 40, 2: 40, 3: 40}
    group = ScriptedGroup([crash() for _ in range(4)])
    events: List[tuple] = []
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=5, max_no_progress_restarts=2),
                     lambda name, **kw: events.append((name, kw)), progress=steps.get)
    result = sup.run()
    assert (result.reason, result.exit_code, result.attempts) == ("no-progress", 93, 3)  # cannot progress: 93
    assert ("no_progress", {"attempt": 2, "step": 40, "restarts": 2}) in events


def test_progress_resets_the_no_progress_count_and_unknown_steps_never_end_the_job():
    crash = lambda: [exited(1, 3), exited(0, -15)]
    group = ScriptedGroup([crash() for _ in range(4)])
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=3, max_no_progress_restarts=1),
                     lambda name, **kw: None, progress={0: 10, 1: 20, 2: 30, 3: 40}.get)
    assert sup.run().reason == "failed"  # every restart got further: the budget ends it
    group = ScriptedGroup([crash() for _ in range(3)])
    sup = supervisor(group, specs_for(2), RestartPolicy(max_restarts=2, max_no_progress_restarts=1),
                     lambda name, **kw: None)
    assert sup.run().reason == "failed"


def test_status_answer_carries_the_stragglers():
    replies = []
    request = ControlRequest("status", {}, lambda payload, final=False: replies.append(payload))
    group = ScriptedGroup([[request, exited(0, 0), exited(1, 0)]])
    supervisor(group, specs_for(2), RestartPolicy(), lambda name, **kw: None,
               status=lambda: {"stragglers": [1]}).run()
    assert replies[0]["stragglers"] == [1] and replies[0]["ranks"] == {0: "running", 1: "running"}


def test_a_first_attempt_started_before_the_supervisor_is_taken_over_not_started_again():
    """The session may start attempt 0's ranks itself (``start_attempt``), before the supervisor exists:
    the supervisor runs that attempt without spawning it again, recording it again or taking its
    checks before a start (health, devices) again; a restart is its own as always."""
    from launcher.supervision.procgroup import start_attempt

    group = ScriptedGroup([[exited(1, 3), exited(0, -15)], [exited(0, 0), exited(1, 0)]])
    events: List[tuple] = []
    emit = lambda name, **kw: events.append((name, kw))
    build = specs_for(2)
    started = start_attempt(group, build(0, ()), 0, emit)
    assert [name for name, _ in events] == ["attempt_start", "rank_spawned", "rank_spawned"]
    checks: List[str] = []
    sup = supervisor(group, build, RestartPolicy(max_restarts=1, device_wait_timeout=60), emit, started=started,
                     health=lambda: checks.append("health"), busy_devices=lambda here: checks.append("devices") or {})
    result = sup.run()
    assert (result.exit_code, result.attempts) == (0, 2)
    assert [c for c in group.calls if c[0] == "start"] == [("start", 0, (0, 1)), ("start", 1, (0, 1))]
    assert build.seen == [(0, ()), (1, (1,))]  # the session built attempt 0; the supervisor asked for 1 only
    assert [kw["attempt"] for name, kw in events if name == "attempt_start"] == [0, 1]
    assert checks == ["health", "devices"]  # before the restart only


def test_a_started_attempt_that_is_not_the_first_is_refused():
    from launcher.supervision.procgroup import Started

    with pytest.raises(ValueError, match="attempt 1 was started, but the first attempt is 0"):
        supervisor(ScriptedGroup([[]]), specs_for(1), RestartPolicy(), lambda *a, **k: None,
                   started=Started(1, (), {}))
