"""Recovery strategy resolution from --recover-strategy and the operator's variables."""

import pytest

from launcher.common.errors import UsageError
from launcher.jobspec.recovery import STRATEGIES, parse_strategies, resolve_strategy


def test_default_is_retry():
    strategy = resolve_strategy(None, {})
    assert strategy.values == {"retry"} and strategy.source == "default"
    assert not strategy.dump and not strategy.exit_on_failure and not strategy.in_place


@pytest.mark.parametrize("text,dump,exit_,in_place", [
    ("retry", False, False, False),
    ("dump", True, False, False),
    ("exit", False, True, False),
    ("recover", True, True, False),
    ("recover-in-place", False, False, True),
    ("recover,recover-in-place", True, True, False),  # rescheduling wins over in-place
    ("elastic-training", True, True, False),
    ("retry,dump", True, False, False),
])
def test_option_semantics(text, dump, exit_, in_place):
    strategy = resolve_strategy(text, {"HIGH_AVAILABILITY": "exit"})
    assert (strategy.dump, strategy.exit_on_failure, strategy.in_place) == (dump, exit_, in_place)
    assert strategy.source == "--recover-strategy"  # the option wins over the environment


def test_unknown_value_is_a_usage_error_listing_known_ones():
    with pytest.raises(UsageError) as exc:
        parse_strategies("retry,reboot", "--recover-strategy")
    assert "'reboot'" in exc.value.message
    assert all(name in exc.value.problems[0] for name in STRATEGIES)


def test_operator_variables():
    assert resolve_strategy(None, {"HIGH_AVAILABILITY": "retry,dump"}).values == {"retry", "dump"}
    assert resolve_strategy(None, {"PROCESS_RECOVER": "on"}).values == {"recover"}
    both = resolve_strategy(None, {"PROCESS_RECOVER": "on", "ENABLE_RESTART_FAULT_PROCESS": "on"})
    assert both.values == {"recover-in-place"}
    tft = resolve_strategy(None, {"MS_ENABLE_TFT": "{TTP:1,UCE:1,ARF:0}"})
    assert tft.values == {"dump", "retry"} and tft.source == "MS_ENABLE_TFT"
    with pytest.raises(UsageError):
        resolve_strategy(None, {"HIGH_AVAILABILITY": "sometimes"})


def test_unknown_strategy_on_the_command_line_exits_2(capsys):
    from launcher.commands.cli import main

    code = main(["run", "--nproc-per-node", "1", "--recover-strategy", "pray", "--dry-run", "--", "true"])
    assert code == 2
    assert "unknown recovery strategy 'pray'" in capsys.readouterr().err
