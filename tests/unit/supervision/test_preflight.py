"""The checks before an attempt, through the supervisor with scripted events and a fake clock: a
failing health check ends the node with its exit code, a held device delays the spawn (bounded), and
a stop signal during the wait ends the run."""

import signal
from typing import List

from launcher.supervision.policy import RestartPolicy
from launcher.supervision.procgroup import SignalReceived
from tests.unit.supervision.test_restarts import ClockedGroup
from tests.unit.supervision.test_supervisor import exited, specs_for, supervisor


def run(scripts, busy, health=lambda: None, **policy):
    """``busy``: one answer per look at the devices (the last one repeats). The last script is also
    what the group replays before the first start (the idle waits)."""
    group = ClockedGroup(scripts)
    events: List[tuple] = []
    looks: List[bool] = []

    def busy_devices(here):
        looks.append(here)
        return busy[min(len(looks), len(busy)) - 1]
    sup = supervisor(group, specs_for(2), RestartPolicy(**policy), lambda name, **kw: events.append((name, kw)),
                     busy_devices=busy_devices, health=health, clock=lambda: group.now)
    return sup.run(), group, events, looks


def named(events, name):
    return [kw for n, kw in events if n == name]


def test_failing_health_check_ends_before_any_rank_starts():
    result, group, events, _ = run([[]], [{}], health=lambda: "exit code 3: ECC", node_fault_exit_code=94,
                                   device_wait_timeout=60)
    assert (result.reason, result.exit_code, result.attempts) == ("node-fault", 94, 0)
    assert not [c for c in group.calls if c[0] == "start"]
    assert named(events, "health_check_failed") == [{"attempt": 0, "reason": "exit code 3: ECC", "exit_code": 94}]


def test_a_held_device_delays_the_start_until_it_is_free():
    held = {1: ["pid 7 (python)"]}
    result, group, events, looks = run([[exited(0, 0), exited(1, 0)], []], [held, held, held, {}],
                                       device_wait_timeout=60)
    assert result.reason == "succeeded"
    [wait], [end] = named(events, "device_wait"), named(events, "device_wait_end")
    assert wait == {"attempt": 0, "devices": [1], "holders": {"1": ["pid 7 (python)"]}, "timeout": 60}
    assert end == {"attempt": 0, "seconds": 1.5, "free": True}  # 3 polls of 0.5 s on the fake clock
    assert looks == [True, True, True, True]


def test_the_wait_is_bounded_then_the_ranks_start_anyway():
    result, _, events, _ = run([[exited(0, 0), exited(1, 0)], []], [{0: ["pid 7 (npu-smi)"]}],
                               device_wait_timeout=2)
    assert result.reason == "succeeded"
    assert named(events, "device_wait_end") == [{"attempt": 0, "seconds": 2.0, "free": False}]


def test_restarts_after_a_clean_attempt_ask_only_the_device_tool():
    scripts = [[exited(1, 1), exited(0, -15)], [exited(0, 0), exited(1, 0)]]
    _, _, _, looks = run(scripts, [{}], device_wait_timeout=60, max_restarts=1)
    assert looks == [True, False]  # first attempt: scan this container too; after a clean one: npu-smi only


def test_a_stop_signal_during_the_wait_ends_the_run_without_starting():
    result, group, events, _ = run([[SignalReceived(signal.SIGTERM)]], [{0: ["pid 7 (python)"]}],
                                   device_wait_timeout=60)
    assert result.reason == "gasp" and result.attempts == 0
    assert not [c for c in group.calls if c[0] == "start"]
    assert named(events, "device_wait_end")[0]["free"] is False


def test_no_look_when_the_wait_is_off():
    _, _, events, looks = run([[exited(0, 0), exited(1, 0)]], [{0: ["pid 7"]}], device_wait_timeout=0)
    assert looks == [] and not named(events, "device_wait")
