"""`launcher ranktable show | validate | generate`."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.commands.ranktable import format_ranks, ranktable
from launcher.common.errors import UsageError
from launcher.jobspec.ranktable import RankTableError, RankTableNotReady, load_rank_table
from tests.helpers.paths import DATA as TEST_DATA

DATA = TEST_DATA / "ranktables"
TWO = str(DATA / "good" / "v1.0-two-servers.json")
BAD = str(DATA / "bad" / "duplicate-rank-id.json")


def invoke(*args):
    return CliRunner().invoke(ranktable, list(args))


def test_show_prints_servers_and_world_size():
    result = invoke("show", TWO)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Rank table {TWO} (format 1.0)"
    assert lines[1].split() == ["#", "server_id", "host_ip", "container_ip", "devices", "ranks"]
    assert lines[2].split() == ["0", "10.0.0.1", "10.0.0.1", "172.16.0.5", "2", "0-1"]
    assert lines[3].split() == ["1", "10.0.0.2", "10.0.0.2", "172.16.0.6", "2", "2-3"]
    assert lines[4] == "World size: 4 (2 servers, master 172.16.0.5)"


def test_show_marks_missing_addresses_and_revision(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_text((DATA / "good" / "v1.0-uneven-devices.json").read_text())
    (tmp_path / "version").write_text("1700000000")
    result = invoke("show", str(path))
    assert result.exit_code == 0, result.output
    assert "(format 1.0, revision 1700000000)" in result.output
    assert result.output.splitlines()[4].split() == ["2", "10.0.0.3", "-", "-", "2", "12-13"]


def test_show_json():
    result = invoke("show", str(DATA / "good" / "v1.2-superpod.json"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["world_size"], summary["server_count"], summary["format_version"]) == (4, 2, "1.2")
    assert summary["servers"][1]["ranks"] == "2-3" and summary["servers"][1]["super_pod_id"] == "0"
    assert summary["servers"][0]["devices"][1] == {
        "rank_id": 1, "device_id": 1, "device_ip": "192.168.0.2", "super_device_id": "101", "local_id": None}


def test_show_not_ready_table():
    result = invoke("show", str(DATA / "initializing.json"))
    assert isinstance(result.exception, RankTableNotReady)


def test_validate_ok():
    result = invoke("validate", str(DATA / "good" / "v2.0-strings-uneven.json"))
    assert result.exit_code == 0, result.output
    assert result.output == "OK: 2 servers, 5 ranks (format 2.0)\n"


def test_validate_reports_every_problem(tmp_path):
    data = json.loads(Path(TWO).read_text())
    data["server_count"] = "3"
    data["server_list"][0]["device"][0]["device_ip"] = 1
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(data))
    result = invoke("validate", str(path))
    assert isinstance(result.exception, RankTableError)
    assert result.exception.message == f"invalid rank table {path}"
    assert result.exception.problems == [
        "$.server_count: says 3 but server_list has 2 servers",
        "$.server_list[0].device[0].device_ip: 1 is not of type 'string'",
    ]


def test_validate_malformed_json_names_line_and_column(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_text('{\n  "version": "1.0",\n  oops\n}')
    result = invoke("validate", str(path))
    assert isinstance(result.exception, RankTableError)
    assert result.exception.message.startswith(f"rank table {path} is not valid JSON: line 3 column 3")


def test_validate_missing_file(tmp_path):
    result = invoke("validate", str(tmp_path / "none.json"))
    assert isinstance(result.exception, RankTableError) and "not found" in result.exception.message


def test_generate_to_stdout():
    result = invoke("generate", "--server", "10.0.0.1:2", "--server", "10.0.0.2:3")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["server_count"] == "2"
    assert [len(s["device"]) for s in data["server_list"]] == [2, 3]


def test_generate_to_file(tmp_path):
    path = tmp_path / "hccl.json"
    result = invoke("generate", "--servers", "3", "--devices", "4", "--output", str(path))
    assert result.exit_code == 0, result.output
    table = load_rank_table(path)
    assert [s.server_id for s in table.servers] == ["node0", "node1", "node2"] and table.world_size == 12
    assert [p.name for p in tmp_path.iterdir()] == ["hccl.json"]  # no temporary file left behind


def test_generate_ipv6_and_default_device_count():
    result = invoke("generate", "--server", "[fe80::1]:2", "--server", "fe80::2", "--server", "h3",
                    "--devices", "1")
    assert result.exit_code == 0, result.output
    servers = json.loads(result.output)["server_list"]
    shape = [(s["server_id"], len(s["device"])) for s in servers]
    assert shape == [("fe80::1", 2), ("fe80::2", 1), ("h3", 1)]


@pytest.mark.parametrize("args, fragment", [
    ([], "nothing to generate"),
    (["--server", "a:1", "--servers", "2"], "not both"),
    (["--servers", "2"], "--servers needs --devices"),
    (["--servers", "0", "--devices", "1"], "--servers must be a positive integer"),
    (["--servers", "1", "--devices", "0"], "--devices must be a positive integer"),
    (["--server", "a"], "no device count"),
    (["--server", "a:x"], "device count 'x' must be a positive integer"),
    (["--server", "[fe80::1]x"], "device count 'x' must be a positive integer"),
    (["--server", "a:0"], "device count '0' must be a positive integer"),
])
def test_generate_usage_errors(args, fragment):
    result = invoke("generate", *args)
    assert isinstance(result.exception, UsageError)
    assert fragment in result.exception.message


def test_generate_repeated_server_lists_problem():
    result = invoke("generate", "--server", "a:1", "--server", "a:2")
    assert isinstance(result.exception, UsageError)
    assert result.exception.problems == ["server a is listed twice"]


@pytest.mark.parametrize("ranks, text", [((0, 1, 2, 3), "0-3"), ((5,), "5"), ((0, 1, 4, 6, 7), "0-1,4,6-7")])
def test_format_ranks(ranks, text):
    assert format_ranks(ranks) == text


def test_through_the_cli_exit_codes_and_lines(capsys):
    from launcher.commands.cli import main

    assert main(["ranktable", "validate", TWO]) == 0
    assert capsys.readouterr().out == "OK: 2 servers, 4 ranks (format 1.0)\n"
    assert main(["ranktable", "validate", BAD]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"launcher: invalid rank table {BAD}",
        "  $.server_list: rank_ids must be 0..3 without gaps for 4 ranks: missing 2",
        "  $.server_list[1].device[0].rank_id: duplicate rank_id 1 (also at $.server_list[0].device[1])",
    ]
    assert main(["ranktable", "show", str(DATA / "initializing.json")]) == 1
    assert 'is not ready: status "initializing"' in capsys.readouterr().err
