"""Heartbeat slots: the rank client writes what the launcher reads; when a rank counts as hung."""

import importlib
import sys

import pytest
from hypothesis import given, strategies as st

from launcher.jobspec.options import parse_section_timeouts
from launcher.monitoring import heartbeats
from launcher.jobspec.runspec import HangRules
from launcher.monitoring.heartbeats import Beat, judge, read_slot
from tests.helpers.paths import REPO

HOOKS = str(REPO / "launcher" / "rankhooks")


@pytest.fixture
def client(tmp_path, monkeypatch):
    """``launcher_heartbeat`` imported fresh, as a rank would, with its slot in ``tmp_path``."""
    monkeypatch.setenv("LAUNCHER_HEARTBEAT_FILE", str(tmp_path / "rank_0"))
    monkeypatch.syspath_prepend(HOOKS)
    sys.modules.pop("launcher_heartbeat", None)
    module = importlib.import_module("launcher_heartbeat")
    yield module
    sys.modules.pop("launcher_heartbeat", None)


def test_client_layout_is_the_launchers(client):
    assert (client.SLOT_FORMAT, client.SLOT_SIZE, client.FLAG_FAULTHANDLER, client.FLAG_EXITING,
            client.STACKS_SUFFIX) == (heartbeats.SLOT_FORMAT, heartbeats.SLOT_SIZE, heartbeats.FLAG_FAULTHANDLER,
                                      heartbeats.FLAG_EXITING, heartbeats.STACKS_SUFFIX)


def test_beats_steps_and_sections_are_read_back(client, tmp_path):
    first = read_slot(str(tmp_path / "rank_0"))
    assert (first.at, first.step, first.faulthandler, first.section) == (0.0, -1, True, "")  # import is no beat
    client.heartbeat(step=7)
    beat = read_slot(str(tmp_path / "rank_0"))
    assert beat.step == 7 and beat.at > 0
    with client.section("checkpoint"):
        inside = read_slot(str(tmp_path / "rank_0"))
        assert inside.section == "checkpoint" and inside.section_start > 0 and inside.step == 7
    assert read_slot(str(tmp_path / "rank_0")).section == ""


def test_client_without_the_variable_does_nothing(monkeypatch):
    monkeypatch.delenv("LAUNCHER_HEARTBEAT_FILE", raising=False)
    monkeypatch.syspath_prepend(HOOKS)
    sys.modules.pop("launcher_heartbeat", None)
    module = importlib.import_module("launcher_heartbeat")
    module.heartbeat(step=1)
    with module.section("x"):
        pass
    sys.modules.pop("launcher_heartbeat", None)


def test_missing_or_short_slot_reads_as_none(tmp_path):
    assert read_slot(str(tmp_path / "absent")) is None
    (tmp_path / "short").write_bytes(b"\0" * 10)
    assert read_slot(str(tmp_path / "short")) is None


def beat(at=0.0, step=-1, section="", start=0.0):
    return Beat(at, step, section, start, 1, False)


RULES = HangRules(steady=10, initial=60, sections={"checkpoint": 300})


def test_initial_timeout_until_the_first_sign_of_progress():
    assert judge(RULES, 100, None, 0, 150) is None
    assert "initial timeout 60" in judge(RULES, 100, None, 0, 161)
    assert judge(RULES, 100, beat(at=155), 0, 161) is None  # beat after start: steady from then
    assert judge(RULES, 100, None, 158, 161) is None  # output counts as progress too


def test_steady_timeout_after_progress():
    assert judge(RULES, 100, beat(at=120), 0, 130) is None
    assert "timeout 10" in judge(RULES, 100, beat(at=120), 0, 130.5)
    assert judge(RULES, 100, beat(at=120), 125, 130.5) is None


def test_a_stale_slot_from_before_a_respawn_is_not_progress():
    assert judge(RULES, 100, beat(at=90), 0, 150) is None
    assert "after start" in judge(RULES, 100, beat(at=90), 0, 161)


def test_named_section_has_its_own_limit_and_others_use_the_steady_one():
    inside = beat(at=120, section="checkpoint", start=120)
    assert judge(RULES, 100, inside, 0, 400) is None
    assert "'checkpoint'" in judge(RULES, 100, inside, 0, 421)
    assert "timeout 10" in judge(RULES, 100, beat(at=120, section="eval", start=120), 0, 131)


def test_initial_defaults_to_steady_and_all_off_never_judges():
    assert "initial timeout 10" in judge(HangRules(steady=10), 0, None, 0, 11)
    assert judge(HangRules(), 0, None, 0, 1e9) is None
    assert not HangRules().enabled and HangRules(no_progress=2).enabled


@given(st.lists(st.tuples(st.text(alphabet="abcdefgh_", min_size=1, max_size=8),
                          st.floats(min_value=0.001, max_value=1e6)), max_size=5))
def test_section_timeouts_round_trip(pairs):
    parsed = parse_section_timeouts([f"{name}={seconds!r}" for name, seconds in pairs])
    assert parsed == {name: seconds for name, seconds in pairs}


@pytest.mark.parametrize("bad", ["checkpoint", "=5", "x=", "x=0", "x=-1", "x=abc", "x=inf", "x=nan"])
def test_section_timeout_malformed(bad):
    with pytest.raises(ValueError, match="NAME=SECONDS"):
        parse_section_timeouts([bad])


def test_step_rate_needs_a_long_enough_history():
    from collections import deque

    from launcher.monitoring.heartbeats import step_rate

    assert step_rate(deque([(0.0, 0), (1.0, 10)])) is None
    assert step_rate(deque([(0.0, 0), (2.0, 10), (5.0, 50)])) == 10.0


def test_stragglers_are_below_the_median_of_their_peers():
    from launcher.monitoring.heartbeats import stragglers

    assert stragglers({0: 10.0, 1: 10.5, 2: 4.0, 3: 9.8, 4: None}, 0.2) == [2]
    assert stragglers({0: 10.0, 1: 8.5}, 0.2) == []
    assert stragglers({0: 0.0, 1: 0.0}, 0.2) == []
    assert stragglers({0: 10.0}, 0.2) == []


def test_a_rank_whose_interpreter_exits_is_never_hung(client, tmp_path):
    client.heartbeat(step=3)
    client._exiting(client._slot, client.FLAG_FAULTHANDLER)  # what atexit runs
    beat = read_slot(str(tmp_path / "rank_0"))
    assert beat.exiting and beat.faulthandler
    assert judge(HangRules(steady=1), 0, beat, 0, beat.at + 1000) is None
