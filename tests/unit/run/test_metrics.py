"""Unit tests for ``launcher.run.metrics``: counted from scripted events, and a clear error without
prometheus_client."""

import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from launcher.common.errors import UsageError
from launcher.run.metrics import Metrics


class Host:
    def __init__(self):
        self.events = []

    def emit(self, event, **fields):
        self.events.append((event, fields))


def values(metrics):
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counts_from_events_and_writes_the_textfile(tmp_path):
    textfile = tmp_path / "m.prom"
    metrics = Metrics(textfile=str(textfile))
    metrics.start(Host())
    script = [("attempt_start", {"attempt": 0, "ranks": [0, 1]}),
              ("rank_spawned", {"rank": 0}), ("rank_spawned", {"rank": 1}),
              ("rank_exited", {"rank": 1, "state": "failed", "exit_code": 3, "signal": None, "exited_at": 1.0}),
              ("rank_exited", {"rank": 0, "state": "failed", "exit_code": None, "signal": "SIGKILL"}),
              ("restart", {"attempt": 1}), ("attempt_start", {"attempt": 1, "ranks": [0, 1]}),
              ("rank_spawned", {"rank": 0}), ("rank_spawned", {"rank": 1}),
              ("heartbeat", {"rank": 0, "step": 5}), ("gasp", {}), ("gasp_done", {})]
    for event, fields in script:
        metrics.on_event(event, fields)
    got = values(metrics)
    assert got[("launcher_failures_total", (("cause", "exit code 3"),))] == 1.0
    assert got[("launcher_failures_total", (("cause", "signal SIGKILL"),))] == 1.0
    assert got[("launcher_restarts_total", ())] == 1.0 and got[("launcher_attempt", ())] == 1.0
    assert got[("launcher_time_lost_seconds_total", ())] > 0  # from exited_at 1.0 (1970) to now
    assert got[("launcher_gasp_duration_seconds_count", ())] == 1.0
    assert 0 <= got[("launcher_heartbeat_age_seconds", (("rank", "0"),))] < 60
    assert "launcher_restarts_total 1.0" in textfile.read_text()
    metrics.stop()
    assert "launcher_up 0.0" in textfile.read_text()


def textfile_values(path):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(path.read_text()) for s in family.samples}


def test_the_textfile_is_current_after_every_change_not_only_at_attempt_ends(tmp_path):
    """The textfile agrees with the HTTP endpoint (the registry) after each event, mid-attempt too."""
    textfile = tmp_path / "m.prom"
    metrics = Metrics(textfile=str(textfile))
    metrics.start(Host())
    script = [("attempt_start", {"attempt": 0, "ranks": [0]}), ("rank_spawned", {"rank": 0}),
              ("rank_exited", {"rank": 0, "state": "failed", "exit_code": 3, "signal": None, "exited_at": 1.0}),
              ("restart", {"attempt": 1}), ("attempt_start", {"attempt": 1, "ranks": [0]}),
              ("rank_spawned", {"rank": 0}), ("gasp", {}), ("gasp_done", {})]
    for event, fields in script:
        metrics.on_event(event, fields)
        assert textfile_values(textfile) == values(metrics), event
    assert textfile_values(textfile)[("launcher_attempt", ())] == 1.0
    mtime = textfile.stat().st_mtime_ns
    metrics.on_event("heartbeat", {"rank": 0})  # nothing the file holds changed (ages are read-time)
    metrics.on_event("step_last", {"attempt": 1, "step": 3})
    assert textfile.stat().st_mtime_ns == mtime
    metrics.stop()


def test_without_prometheus_client_it_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(UsageError, match=r"ascend-launcher\[metrics\]"):
        Metrics(port=0)


def test_steps_recomputed_after_failures_whose_steps_are_known():
    metrics = Metrics()
    metrics.start(Host())
    failed = {"state": "failed", "exit_code": 1, "signal": None, "exited_at": 1.0}
    script = [("restore_plan", {"attempt": 0, "step": None}),
              ("rank_exited", {"attempt": 0, "rank": 1, **failed}),
              ("step_last", {"attempt": 0, "step": 70, "ranks": {"0": 70, "1": 69}}),
              ("restore_plan", {"attempt": 1, "step": 60}),     # 10 steps to recompute
              ("rank_exited", {"attempt": 1, "rank": 0, **failed}),
              ("restore_plan", {"attempt": 2, "step": 60}),     # no step_last for attempt 1: not counted
              ("step_last", {"attempt": 2, "step": 90}),
              ("restore_plan", {"attempt": 3, "step": 80})]     # attempt 2 did not fail: nothing re-run
    for event, fields in script:
        metrics.on_event(event, fields)
    assert values(metrics)[("launcher_steps_recomputed_total", ())] == 10.0
    metrics.stop()
