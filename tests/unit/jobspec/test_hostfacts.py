"""Unit tests for ``launcher.jobspec.hostfacts``: visible NPUs and this container's addresses."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.errors import UsageError
from launcher.jobspec.hostfacts import davinci_devices, local_addresses, parse_visible_devices, visible_devices


@pytest.mark.parametrize("text, expected", [
    ("0", (0,)), ("1,3", (1, 3)), ("3,1", (1, 3)), ("0-3", (0, 1, 2, 3)), ("0-2,4", (0, 1, 2, 4)),
    ("Ascend910-0,Ascend910-3", (0, 3)), (" 5 , 7 ", (5, 7)), ("2-2", (2,)), ("1,1,0-1", (0, 1)),
    ("Ascend910B-7", (7,)), ("Ascend310P-1,Ascend310P-0", (0, 1)),
])
def test_parse_visible_devices(text, expected):
    assert parse_visible_devices(text) == expected


MALFORMED = ["", "a", "1,,2", "3-1", "-1", "1-", "0x1", "1 2", "Ascend910-", "Ascend910-a", "1-2-3", "1.5", "Ascend910"]


@pytest.mark.parametrize("text", MALFORMED)
def test_parse_visible_devices_rejects_malformed_items(text):
    with pytest.raises(ValueError):
        parse_visible_devices(text)


@st.composite
def visible_texts(draw):
    """A set of ids written as a mix of single ids, ranges and device names, in any order."""
    ids = draw(st.sets(st.integers(0, 31), min_size=1, max_size=16))
    items, rest = [], sorted(ids)
    while rest:
        run = 1
        while run < len(rest) and rest[run] == rest[0] + run:
            run += 1
        style = draw(st.sampled_from(["id", "name", "range"]))
        if style == "range" and run > 1:
            items.append(f"{rest[0]}-{rest[run - 1]}")
            rest = rest[run:]
        else:
            items.append(f"Ascend910-{rest[0]}" if style == "name" else str(rest[0]))
            rest = rest[1:]
    return ",".join(draw(st.permutations(items))), ids


@settings(max_examples=200, deadline=None, database=None)
@given(visible_texts())
def test_parse_visible_devices_roundtrip(case):
    text, ids = case
    assert parse_visible_devices(text) == tuple(sorted(ids))


def test_davinci_devices_lists_npus_by_number(tmp_path):
    for name in ("davinci10", "davinci2", "davinci_manager", "vdavinci100", "devmm_svm", "davinci3x", "hisi_hdc"):
        (tmp_path / name).touch()
    assert davinci_devices(str(tmp_path)) == (2, 10)


def test_davinci_devices_without_dev_dir(tmp_path):
    assert davinci_devices(str(tmp_path / "missing")) == ()


def test_visible_devices_prefers_the_variable_then_dev_then_none(tmp_path):
    (tmp_path / "davinci4").touch()
    assert visible_devices({"ASCEND_VISIBLE_DEVICES": "0-1"}, str(tmp_path)) == (0, 1)
    assert visible_devices({"ASCEND_VISIBLE_DEVICES": " "}, str(tmp_path)) == (4,)
    assert visible_devices({}, str(tmp_path)) == (4,)
    assert visible_devices({}, str(tmp_path / "none")) is None


def test_malformed_visible_devices_variable_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as exc:
        visible_devices({"ASCEND_VISIBLE_DEVICES": "0,x"}, str(tmp_path))
    assert "'x'" in exc.value.message


@pytest.mark.parametrize("environ, reads", [
    ({}, False), ({"XDL_IP": "10.0.0.1", "POD_IP": "10.0.0.1"}, False),
    ({"XDL_IP": "10.0.0.1"}, True), ({"XDL_IP": "10.0.0.1", "POD_IP": "172.16.0.5"}, True),
])
def test_local_addresses_read_only_when_they_decide_something(monkeypatch, environ, reads):
    monkeypatch.setattr("launcher.jobspec.topology.host_addresses", lambda: ["127.0.0.1", "10.0.0.1"])
    assert local_addresses(environ) == (("127.0.0.1", "10.0.0.1") if reads else ())
