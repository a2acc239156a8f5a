"""Unit tests for ``launcher.jobspec.options`` (config file, precedence, defaults) and ``--console-ranks`` parsing.

Precedence is checked end to end through ``launcher.commands.cli.main(["run", "--dry-run", "--json", ...])``:
default < config file < ``LAUNCHER_*`` environment < command line.
"""

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.commands.cli import main
from launcher.common.errors import UsageError
from launcher.jobspec.options import (DEFAULT_MASTER_PORT, FRAMEWORKS, RunOptions, env_var_for,
                                      load_config)
from launcher.jobspec import options
from launcher.jobspec.options import default_gasp_timeout, parse_rank_filter


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger):
    """Every test runs with a clean environment (fixtures in conftest.py)."""


def dry_run(capsys, *args):
    """``launcher run --dry-run --json ARGS`` (ARGS must include ``-- COMMAND``): (exit code, doc, stderr)."""
    code = main(["run", "--dry-run", "--json", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err



def write_config(tmp_path, text, name="launcher.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def env0(doc):
    return doc["ranks"][0]["env"]


# --------------------------------------------------------------------------- precedence, each source

def test_defaults(capsys):
    code, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert code == 0
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "0"
    assert doc["master_port"] not in (None, 29500)  # one node: a free port (issue #10.3)
    assert doc["master_addr"] == "127.0.0.1"
    assert doc["framework"] == "pytorch"
    assert len(doc["ranks"]) == 1


def test_config_file_beats_default(capsys, tmp_path):
    cfg = write_config(tmp_path, "max-restarts: 3\nnproc-per-node: 2\nmaster_port: 1111\n")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--", "true")
    assert code == 0
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "3"
    assert len(doc["ranks"]) == 2
    assert doc["master_port"] == 1111
    assert env0(doc)["MASTER_PORT"] == "1111"


def test_env_beats_config_file(capsys, tmp_path, monkeypatch):
    cfg = write_config(tmp_path, "max_restarts: 3\nnproc_per_node: 2\nmaster_port: 1111\n")
    monkeypatch.setenv("LAUNCHER_MAX_RESTARTS", "5")
    monkeypatch.setenv("LAUNCHER_MASTER_PORT", "2222")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--", "true")
    assert code == 0
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "5"
    assert doc["master_port"] == 2222
    assert len(doc["ranks"]) == 2  # not overridden by the environment: still the config's value


def test_command_line_beats_env_and_config(capsys, tmp_path, monkeypatch):
    cfg = write_config(tmp_path, "max_restarts: 3\nnproc_per_node: 2\nmaster_port: 1111\n")
    monkeypatch.setenv("LAUNCHER_MAX_RESTARTS", "5")
    monkeypatch.setenv("LAUNCHER_MASTER_PORT", "2222")
    monkeypatch.setenv("LAUNCHER_NPROC_PER_NODE", "4")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--max-restarts", "7", "--master-port", "3333",
                           "--nproc-per-node", "3", "--", "true")
    assert code == 0
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "7"
    assert doc["master_port"] == 3333
    assert len(doc["ranks"]) == 3


def test_env_beats_default_without_config(capsys, monkeypatch):
    monkeypatch.setenv("LAUNCHER_NPROC_PER_NODE", "2")
    monkeypatch.setenv("LAUNCHER_MAX_RESTARTS", "9")
    monkeypatch.setenv("LAUNCHER_RUN_ID", "from-env")
    code, doc, _ = dry_run(capsys, "--", "true")
    assert code == 0
    assert len(doc["ranks"]) == 2
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "9"
    assert env0(doc)["TORCHELASTIC_RUN_ID"] == "from-env"


def test_config_file_from_launcher_config_env(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_CONFIG", write_config(tmp_path, "nproc-per-node: 2\nrun-id: cfg-job\n"))
    code, doc, _ = dry_run(capsys, "--", "true")
    assert code == 0
    assert len(doc["ranks"]) == 2
    assert {r["env"]["JOB_ID"] for r in doc["ranks"]} == {"cfg-job"}


def test_config_keys_with_dashes_and_underscores_mixed(capsys, tmp_path):
    run_dir = tmp_path / "rd"
    cfg = write_config(tmp_path, "\n".join([
        "nproc-per-node: 2", "nnodes: 2", "node_rank: 1", "master-addr: 10.2.3.4", "run_id: mixed",
        f"run-dir: {run_dir}", f"group_info_root: {tmp_path / 'gi'}", "framework: tensorflow",
        "console-ranks: 0", "stop_timeout: 1.5", "rank-table-timeout: 0", ""]))
    code, doc, err = dry_run(capsys, "--config", cfg, "--", "true")
    assert code == 0, err
    assert doc["framework"] == "tensorflow"
    assert doc["master_addr"] == "10.2.3.4"
    assert doc["run_dir"] == str(run_dir)
    assert [r["rank"] for r in doc["ranks"]] == [2, 3]
    assert [r["env"]["DEVICE_INDEX"] for r in doc["ranks"]] == ["2", "3"]
    assert env0(doc)["JOB_ID"] == "mixed"
    assert env0(doc)["LAUNCHER_RUN_DIR"] == str(run_dir)
    assert env0(doc)["GROUP_INFO_FILE"] == str(tmp_path / "gi" / "device2" / "group_info.pb")


def test_config_can_turn_on_dry_run(capsys, tmp_path):
    cfg = write_config(tmp_path, f"dry-run: true\nnproc-per-node: 1\nrun-dir: {tmp_path / 'rd'}\n")
    code = main(["run", "--config", cfg, "--json", "--", "true"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["ranks"][0]["rank"] == 0
    assert not (tmp_path / "rd").exists()  # nothing was started


def test_empty_config_file_means_defaults(capsys, tmp_path):
    code, doc, _ = dry_run(capsys, "--config", write_config(tmp_path, "# nothing\n"), "--nproc-per-node", "1",
                           "--", "true")
    assert code == 0
    assert env0(doc)["TORCHELASTIC_MAX_RESTARTS"] == "0"


def test_framework_precedence_option_config_mindx_env(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("framework", "tensorflow")  # what the MindX samples export
    code, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert (code, doc["framework"]) == (0, "tensorflow")
    cfg = write_config(tmp_path, "framework: mindspore\n")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--nproc-per-node", "1", "--", "true")
    assert (code, doc["framework"]) == (0, "mindspore")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--framework", "PyTorch", "--nproc-per-node", "1", "--", "true")
    assert (code, doc["framework"]) == (0, "pytorch")


def test_run_id_from_mindx_task_id_unless_given(capsys, monkeypatch):
    monkeypatch.setenv("MINDX_TASK_ID", "uid-123")
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert env0(doc)["TORCHELASTIC_RUN_ID"] == "uid-123"
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--run-id", "mine", "--", "true")
    assert env0(doc)["TORCHELASTIC_RUN_ID"] == "mine"


def test_generated_run_id_is_shared_by_every_rank(capsys):
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "3", "--", "true")
    ids = {r["env"]["TORCHELASTIC_RUN_ID"] for r in doc["ranks"]} | {r["env"]["JOB_ID"] for r in doc["ranks"]}
    assert len(ids) == 1 and len(ids.pop()) >= 8


# --------------------------------------------------------------------------- config errors -> exit 2

def config_error(capsys, tmp_path, text):
    code = main(["run", "--dry-run", "--config", write_config(tmp_path, text), "--nproc-per-node", "1", "--",
                 "true"])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def test_invalid_yaml_exit_2(capsys, tmp_path):
    code, out, lines = config_error(capsys, tmp_path, "max_restarts: [1,\n")
    assert code == 2
    assert out == ""
    assert lines[0].startswith("launcher: config file ") and "is not valid YAML" in lines[0]
    assert len(lines) == 1 and "line 2" in lines[0]


def test_schema_violations_one_line_each_with_path(capsys, tmp_path):
    code, out, lines = config_error(capsys, tmp_path,
                                    "max_restarts: -1\nmaster-port: 70000\nstop_timeout: soon\nframework: caffe\n")
    assert code == 2
    assert "is invalid" in lines[0]
    problems = lines[1:]
    assert len(problems) == 4
    assert all(p.startswith("  $.") for p in problems)
    joined = "\n".join(problems)
    for path in ("$.max_restarts:", "$.master_port:", "$.stop_timeout:", "$.framework:"):
        assert path in joined


def test_unknown_key_is_rejected(capsys, tmp_path):
    code, _, lines = config_error(capsys, tmp_path, "max_restarts: 1\nmax_retries: 4\n")
    assert code == 2
    assert any("max_retries" in line for line in lines[1:])


def test_unknown_keys_one_line_each_with_their_path(capsys, tmp_path):
    code, _, lines = config_error(capsys, tmp_path, "max_retries: 4\nnprocs: 2\n")
    assert code == 2
    assert sorted(line.strip().split(":")[0] for line in lines[1:]) == ["$.max_retries", "$.nprocs"]


def test_config_must_be_a_mapping(capsys, tmp_path):
    code, _, lines = config_error(capsys, tmp_path, "- max_restarts\n- 3\n")
    assert code == 2
    assert len(lines) == 2 and lines[1].startswith("  $:") and "object" in lines[1]


def test_missing_config_file_exit_2(capsys, tmp_path):
    code = main(["run", "--dry-run", "--config", str(tmp_path / "nope.yaml"), "--", "true"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "cannot read config file" in err and "nope.yaml" in err


def test_load_config_normalises_dashes(tmp_path):
    path = write_config(tmp_path, "max-restarts: 2\nrank_table: /x/hccl.json\nconsole-ranks: 0-3\n")
    assert load_config(path) == {"max_restarts": 2, "rank_table": "/x/hccl.json", "console_ranks": "0-3"}


def test_load_config_empty_and_errors(tmp_path):
    assert load_config(write_config(tmp_path, "")) == {}
    with pytest.raises(UsageError) as exc:
        load_config(write_config(tmp_path, "nnodes: 0\nnode_rank: -2\n", "bad.yaml"))
    assert exc.value.problems == ["$.nnodes: 0 is less than the minimum of 1",
                                  "$.node_rank: -2 is less than the minimum of 0"]
    assert exc.value.exit_code == 2


# --------------------------------------------------------------------------- RunOptions / helpers

def test_env_var_for():
    assert env_var_for("max_restarts") == "LAUNCHER_MAX_RESTARTS"
    assert env_var_for("nproc_per_node") == "LAUNCHER_NPROC_PER_NODE"


def test_resolved_framework_order_and_case():
    assert RunOptions(("x",)).resolved_framework({}) == "pytorch"
    assert RunOptions(("x",)).resolved_framework({"framework": "MindSpore"}) == "mindspore"
    assert RunOptions(("x",), framework="tensorflow").resolved_framework({"framework": "mindspore"}) == "tensorflow"
    assert FRAMEWORKS == ("pytorch", "mindspore", "tensorflow")
    assert DEFAULT_MASTER_PORT == {"pytorch": 29500, "mindspore": 8118, "tensorflow": 29500}


@pytest.mark.parametrize("name", ["caffe", "torch", "jax"])
def test_resolved_framework_unknown(name):
    with pytest.raises(UsageError) as exc:
        RunOptions(("x",)).resolved_framework({"framework": name})
    assert repr(name) in exc.value.message
    assert "pytorch, mindspore, tensorflow" in exc.value.problems[0]


def test_dry_run_uses_default_run_dir(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--job-name", "exp-1", "--", "true")
    assert doc["run_dir"] == str(tmp_path / "launcher" / "exp-1")
    assert "GROUP_INFO_FILE" not in env0(doc)  # only with --group-info-root


def test_each_job_gets_its_own_run_dir_under_the_base(capsys, monkeypatch, tmp_path):
    """Issue #10.3: two jobs without --run-dir no longer share /tmp/launcher-<uid>."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert os.path.dirname(doc["run_dir"]) == str(tmp_path / "launcher")
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-{os.getpid()}", os.path.basename(doc["run_dir"]))
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--run-id", "exp/7", "--", "true")
    assert doc["run_dir"] == str(tmp_path / "launcher" / "exp_7")
    monkeypatch.setenv("MINDX_TASK_ID", "task-9")
    _, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert doc["run_dir"] == str(tmp_path / "launcher" / "task-9")


@pytest.mark.parametrize("name", ["a/b", "..", ".hidden", "x y"])
def test_bad_job_name_refused(capsys, name):
    code, _doc, err = dry_run(capsys, "--nproc-per-node", "1", "--job-name", name, "--", "true")
    assert code == 2 and err.startswith("launcher: --job-name")


# --------------------------------------------------------------------------- --console-ranks

@pytest.mark.parametrize("text, expected", [
    ("all", None), (" ALL ", None), ("none", []), ("None", []), ("0", [0]), ("0,3,5-7", [0, 3, 5, 6, 7]),
    (" 2 , 4-5 ", [2, 4, 5]), ("7-7", [7]), ("1,", [1]), ("10-12,0", [10, 11, 12, 0]),
])
def test_parse_rank_filter(text, expected):
    assert parse_rank_filter(text) == expected


@pytest.mark.parametrize("text", ["a", "-1", "1-x", "1-2-3", "0;1", "1.5", "*"])
def test_parse_rank_filter_malformed(text):
    with pytest.raises(UsageError) as exc:
        parse_rank_filter(text)
    assert "--console-ranks" in exc.value.message
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("text", ["5-3", "3-"])
def test_parse_rank_filter_rejects_bad_ranges(text):
    with pytest.raises(UsageError):
        parse_rank_filter(text)


def _format_ranks(ranks):
    """Compress a sorted list of ints into ``0,3,5-7`` form."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


@settings(max_examples=100, deadline=None, database=None)
@given(st.sets(st.integers(0, 300), min_size=1, max_size=40), st.booleans())
def test_parse_rank_filter_round_trip(ranks, spaced):
    ordered = sorted(ranks)
    text = _format_ranks(ordered)
    if spaced:
        text = " " + text.replace(",", " , ") + " "
    assert parse_rank_filter(text) == ordered


# --------------------------------------------------------------------------- --gasp-signal (issue #17.6)

@pytest.mark.parametrize("value", ["99", "0", "FOO", "SIGKILL", "kill", "9", "STOP", "19", "-1", ""])
def test_gasp_signal_refused_at_parse_time_even_with_dry_run(capsys, value):
    code, _doc, err = dry_run(capsys, "--gasp-signal", value, "--nproc-per-node", "1", "--", "true")
    assert code == 2
    assert err.startswith("launcher: --gasp-signal") and "Traceback" not in err


@pytest.mark.parametrize("value,name", [("SIGUSR1", "SIGUSR1"), ("usr2", "SIGUSR2"), ("15", "SIGTERM"),
                                        (" term ", "SIGTERM"), ("SIGRTMIN", "SIGRTMIN")])
def test_gasp_signal_names_and_numbers(value, name):
    import signal

    from launcher.commands.optiontypes import SignalType
    from launcher.jobspec.options import parse_signal

    assert parse_signal(value) == int(signal.Signals[name])
    assert SignalType().convert(value, None, None) == name


def test_gasp_signal_from_environment_is_checked_too(capsys, monkeypatch):
    monkeypatch.setenv("LAUNCHER_GASP_SIGNAL", "99")
    code, _doc, err = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert code == 2 and "--gasp-signal '99'" in err


@given(st.integers(min_value=-5, max_value=200))
def test_parse_signal_property(number):
    import signal

    from launcher.jobspec.options import UNCATCHABLE, parse_signal

    try:
        signum = parse_signal(str(number))
    except UsageError:
        assert number not in {int(s) for s in signal.Signals} or number in UNCATCHABLE
    else:
        assert signum == number and signum not in UNCATCHABLE and signum in {int(s) for s in signal.Signals}


def test_prestop_signal_option_checked(capsys):
    assert main(["prestop", "--signal", "99"]) == 2
    assert "--signal '99'" in capsys.readouterr().err


# -- the gasp timeout --------------------------------------------------------------------------------

@pytest.mark.parametrize("grace, timeout", [(30, 25), (50, 45), (100, 90), (300, 270), (6, 1), (5.5, 1),
                                            (3, 1), (0, 1)])
def test_default_gasp_timeout_keeps_5s_or_10_percent(grace, timeout):
    assert default_gasp_timeout(grace) == pytest.approx(timeout)


@given(st.floats(6, 1e6))
def test_default_gasp_timeout_plus_margin_fits_the_grace_period(grace):
    timeout = default_gasp_timeout(grace)
    assert timeout >= 1.0
    assert timeout + options.MIN_MARGIN <= grace + 1e-9 * grace
    assert timeout <= 0.9 * grace + 1e-9 * grace


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_default_gasp_timeout_is_monotonic_with_a_1s_floor(a, b):
    low, high = sorted((a, b))
    assert 1.0 <= default_gasp_timeout(low) <= default_gasp_timeout(high)


# --------------------------------------------------------------------------- hang detection (issue #12)

def test_heartbeat_options_give_each_rank_a_slot_and_the_client_on_its_path(capsys, tmp_path):
    cfg = write_config(tmp_path, "heartbeat-timeout: 30\nsection_timeout: [checkpoint=600, eval=60]\n")
    code, doc, _ = dry_run(capsys, "--config", cfg, "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
                           "--", "true")
    assert code == 0
    assert [r["env"]["LAUNCHER_HEARTBEAT_FILE"] for r in doc["ranks"]] == [
        str(tmp_path / "run" / "heartbeats" / f"rank_{r}") for r in range(2)]
    assert env0(doc)["PYTHONPATH"].endswith(os.path.join("launcher", "rankhooks"))


def test_no_heartbeat_slot_by_default(capsys):
    code, doc, _ = dry_run(capsys, "--nproc-per-node", "1", "--", "true")
    assert "LAUNCHER_HEARTBEAT_FILE" not in env0(doc)


def test_malformed_section_timeout_is_a_usage_error(capsys):
    code = main(["run", "--dry-run", "--section-timeout", "checkpoint", "--nproc-per-node", "1", "--", "true"])
    assert code == 2
    assert "expected NAME=SECONDS" in capsys.readouterr().err
