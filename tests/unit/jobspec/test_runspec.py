"""``run_spec``: the options parsed once into the groups their consumers read."""

import dataclasses
import signal

import pytest
from click.testing import CliRunner

from launcher.commands import plan as plan_cmd
from launcher.common.errors import UsageError
from launcher.jobspec.options import DEFAULT_FAULT_NPUS, DEFAULT_RESET_JSON, RunOptions
from launcher.jobspec.runspec import (ClusterSpec, DebugSpec, HangRules, OutputSpec, PreloadSpec, RestartSpec,
                                      RestoreSpec, RunSpec, run_spec)


def spec(environ=None, **fields) -> RunSpec:
    return run_spec(RunOptions(command=("python", "train.py"), **fields), environ or {})


def test_the_groups_defaults_are_the_options_defaults():
    """A spec built without options equals the groups' own defaults: the two cannot drift apart."""
    built = spec()
    assert built.restart == RestartSpec()
    assert built.hangs == HangRules()
    assert built.restore == RestoreSpec(fault_npus_path=DEFAULT_FAULT_NPUS, reset_json_path=DEFAULT_RESET_JSON)
    assert built.cluster == ClusterSpec()
    assert built.output == OutputSpec()
    assert built.debug == DebugSpec()
    assert built.preload == dataclasses.replace(PreloadSpec(), python=True)
    assert RunSpec(("python", "train.py"), restore=built.restore, preload=built.preload) == built


def test_text_is_parsed_into_the_groups():
    built = spec({"HIGH_AVAILABILITY": "retry,dump"}, gasp_signal="USR1", coordinator="etcds://a:1,b",
                 coordinator_ttl=7, preload="torch,numpy", preload_max_rss=1.5,
                 section_timeout=(("checkpoint", 300.0),), termination_grace_period=100.0)
    assert built.restart.strategy.values == {"retry", "dump"} and built.restart.strategy.source == "HIGH_AVAILABILITY"
    assert built.restart.gasp_signal == signal.SIGUSR1 and built.restart.gasp_signal_name == "SIGUSR1"
    assert built.restart.gasp_timeout == 90.0
    assert built.cluster.coordinator.endpoints == (("a", 1), ("b", 2379)) and built.cluster.coordinator.tls
    assert built.cluster.coordinator.ttl == 7 and built.cluster.coordinated
    assert built.preload == PreloadSpec(False, ("torch", "numpy"), int(1.5 * (1 << 20)), True)
    assert built.hangs.sections == {"checkpoint": 300.0} and built.hangs.enabled


def test_the_option_wins_over_the_operators_variables():
    assert spec({"HIGH_AVAILABILITY": "dump"}, recover_strategy="exit").restart.strategy.values == {"exit"}


@pytest.mark.parametrize("fields, message", [
    ({"recover_strategy": "sometimes"}, "unknown recovery strategy"),
    ({"coordinator": "foo://h"}, "expected etcd://HOST:PORT"),
    ({"preload": "torch,1bad"}, "'1bad' is not a module name"),
    ({"gasp_signal": "KILL"}, "a rank cannot catch it"),
    ({"framework": "jax"}, "unknown framework"),
])
def test_a_mistake_is_one_usage_error(fields, message):
    with pytest.raises(UsageError) as caught:
        spec(**fields)
    assert message in caught.value.message


def test_the_specs_are_frozen():
    built = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.restart.max_restarts = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        built.hangs.sections["x"] = 1.0  # type: ignore[index]


def test_run_and_plan_plan_from_the_same_restore_spec(tmp_path, monkeypatch):
    """``launcher plan`` builds its RestoreSpec with the same function, from options of the same names."""
    (tmp_path / "fault-npus").write_text('{"status": "initializing"}')
    (tmp_path / "reset.json").write_text('{"RankList": []}')
    reports = {"fault_npus": str(tmp_path / "fault-npus"), "reset_json": str(tmp_path / "reset.json")}
    seen = []
    real = plan_cmd.restore_spec
    monkeypatch.setattr(plan_cmd, "restore_spec", lambda values: seen.append(real(values)) or seen[-1])
    args = ["--checkpoint-dir", str(tmp_path), "--fault-ranks", "3, 1,3", "--tp", "2", "--checkpoint-marker",
            "{name}.done", "--fault-npus", reports["fault_npus"], "--reset-json", reports["reset_json"]]
    result = CliRunner().invoke(plan_cmd.plan, ["--world-size", "4", "--settle-seconds", "0", *args])
    assert result.exit_code == 0, result.output
    run = spec(checkpoint_dir=str(tmp_path), fault_ranks=(1, 3), tp=2, checkpoint_marker="{name}.done",
               **reports).restore
    assert seen == [run]
