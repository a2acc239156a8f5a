"""Unit tests for ``launcher.commands.cli`` and ``launcher.commands.run``: exit codes, messages, dry-run output,
lazy imports."""

import json
import re
import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from launcher import __version__
from launcher.commands.cli import main
from tests.helpers.cli import run_cli


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger, monkeypatch, tmp_path):
    """A clean environment (conftest.py) and a private run dir."""
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))


def dry_json(capsys, *args):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def write_table(path, servers):
    """A 1.0 hccl.json: servers = [(server_id, container_ip, [(device_id, rank_id), ...]), ...]."""
    doc = {"status": "completed", "version": "1.0", "server_count": str(len(servers)), "server_list": [
        {"server_id": sid, "container_ip": cip,
         "device": [{"device_id": str(d), "device_ip": f"192.168.100.{r + 1}", "rank_id": str(r)} for d, r in devs]}
        for sid, cip, devs in servers]}
    path.write_text(json.dumps(doc))
    return str(path)


TWO_BY_TWO = [("10.0.0.1", "172.16.0.5", [(0, 0), (1, 1)]), ("10.0.0.11", "172.16.0.6", [(2, 2), (3, 3)])]


# --------------------------------------------------------------------------- exit codes and messages

def test_missing_command_exit_2(capsys):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1")
    assert code == 2
    assert "Missing argument" in err and "COMMAND" in err
    assert out == ""


def test_missing_command_after_double_dash_exit_2(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--")
    assert code == 2
    assert "Missing argument" in err


def test_command_not_found_exit_2(capsys):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--", "no-such-program-xyz", "a")
    assert code == 2
    assert out == ""
    assert err.splitlines() == ["launcher: command not found: no-such-program-xyz", "  (searched $PATH)"]


def test_command_path_not_executable_exit_2(capsys, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    for program in (str(script), str(tmp_path / "missing.sh"), str(tmp_path)):
        code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--", program)
        assert code == 2
        assert f"launcher: command not found or not executable: {program}" in err


def test_command_found_through_path(capsys, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "my-trainer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    doc = dry_json(capsys, "--nproc-per-node", "1", "--", "my-trainer", "--epochs", "1")
    assert doc["ranks"][0]["argv"] == ["my-trainer", "--epochs", "1"]


def test_unknown_framework_option_exit_2(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--framework", "caffe", "--nproc-per-node", "1", "--", "true")
    assert code == 2
    assert "caffe" in err and "--framework" in err


def test_unknown_framework_from_mindx_env_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("framework", "caffe")
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--", "true")
    assert code == 2
    assert err.splitlines() == ["launcher: unknown framework 'caffe'",
                                "  expected one of pytorch, mindspore, tensorflow"]


def test_framework_option_is_case_insensitive(capsys):
    assert dry_json(capsys, "--framework", "MindSpore", "--nproc-per-node", "1", "--", "true")["framework"] == \
        "mindspore"


@pytest.mark.parametrize("args", [["--nproc-per-node", "0"], ["--master-port", "70000"], ["--nnodes", "0"],
                                  ["--max-restarts", "-1"], ["--stop-timeout", "x"], ["--no-such-option"]])
def test_invalid_option_values_exit_2(capsys, args):
    code, out, err = run_cli(capsys, "run", "--dry-run", *args, "--", "true")
    assert code == 2
    assert out == "" and err.strip()


def test_no_source_of_ranks_exit_2(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--", "true")
    assert code == 2
    assert err.startswith("launcher: no ranks to start")


def test_node_rank_out_of_range_exit_2(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2",
                           "--", "true")
    assert code == 2
    assert "--node-rank 2 must be below --nnodes 2" in err


def test_unknown_subcommand_exit_2(capsys):
    code, _, err = run_cli(capsys, "frobnicate")
    assert code == 2
    assert "frobnicate" in err


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert __version__ in out


def test_options_after_the_command_belong_to_the_command(capsys):
    doc = dry_json(capsys, "--nproc-per-node", "1", "true", "train.py", "--max-restarts", "3")
    assert doc["ranks"][0]["argv"] == ["true", "train.py", "--max-restarts", "3"]
    assert doc["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "0"


def test_arguments_after_double_dash_belong_to_the_command(capsys):
    doc = dry_json(capsys, "--nproc-per-node", "1", "--", "true", "train.py", "--max-restarts", "3", "--", "-x")
    assert doc["ranks"][0]["argv"] == ["true", "train.py", "--max-restarts", "3", "--", "-x"]
    assert doc["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "0"


# --------------------------------------------------------------------------- dry-run output

def test_dry_run_json_shape(capsys, tmp_path):
    doc = dry_json(capsys, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--max-restarts", "4",
                   "--run-id", "r1", "--master-addr", "10.0.0.9", "--", "true", "a b")
    assert set(doc) == {"framework", "source", "rank_table_file", "world_size", "server", "master_addr",
                        "master_port", "run_dir", "restore_plan", "ranks"}
    assert doc["restore_plan"] is None  # no --checkpoint-dir
    assert doc["framework"] == "pytorch"
    assert doc["source"] == "--nproc-per-node"
    assert doc["rank_table_file"] is None
    assert doc["world_size"] == 4
    assert doc["server"] == {"index": 1, "server_id": "node1", "addresses": ["node1"]}
    assert (doc["master_addr"], doc["master_port"]) == ("10.0.0.9", 29500)
    assert doc["run_dir"] == str(tmp_path / "run")
    ranks = doc["ranks"]
    assert [set(r) for r in ranks] == [{"rank", "local_rank", "device_id", "role", "env", "argv"}] * 2
    assert [(r["rank"], r["local_rank"], r["device_id"], r["role"]) for r in ranks] == [
        (2, 0, 0, "worker"), (3, 1, 1, "worker")]
    assert [r["argv"] for r in ranks] == [["true", "a b"]] * 2
    for r in ranks:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in r["env"].items())
        assert r["env"]["RANK"] == str(r["rank"])
        assert r["env"]["LOCAL_RANK"] == str(r["local_rank"])
        assert r["env"]["TORCHELASTIC_MAX_RESTARTS"] == "4"
        # the per-attempt variables a real start adds are in the dry run too
        assert r["env"]["LAUNCHER_GRACEFUL_EXIT_FILE"] == str(tmp_path / "run" / "graceful_exit.json")
        assert r["env"]["LAUNCHER_GASP_SAVE_ALLOWED"] == "1"
        assert r["env"]["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/rank_{r['rank']}_error.json")
        assert r["env"]["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert r["env"]["TORCHELASTIC_RUN_ID"] == "r1"
        assert r["env"]["MASTER_ADDR"] == "10.0.0.9"
    assert not (tmp_path / "run").exists()  # a dry run creates nothing


def test_dry_run_mindspore_scheduler_listed_first(capsys):
    doc = dry_json(capsys, "--framework", "mindspore", "--nproc-per-node", "2", "--", "true")
    assert [(r["role"], r["rank"], r["local_rank"], r["device_id"]) for r in doc["ranks"]] == [
        ("scheduler", -1, -1, -1), ("worker", 0, 0, 0), ("worker", 1, 1, 1)]
    assert doc["ranks"][0]["env"]["MS_ROLE"] == "MS_SCHED"
    assert str(doc["master_port"]) == doc["ranks"][1]["env"]["MS_SCHED_PORT"] != "8118"  # one node: a free port


def test_dry_run_text_output(capsys):
    code, out, _ = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "2", "--run-id", "t1", "--", "true", "x")
    assert code == 0
    assert out.startswith("framework pytorch; ranks from --nproc-per-node; world size 2\n")
    assert re.search(r"this server: #0 node0; master 127\.0\.0\.1:\d+\n", out)
    assert "worker rank=1 local_rank=1 device=1" in out
    assert "  argv: true x" in out
    assert "  TORCHELASTIC_RUN_ID=t1" in out
    with pytest.raises(ValueError):
        json.loads(out)


def test_dry_run_with_rank_table_option_and_xdl_ip(capsys, tmp_path, monkeypatch):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setenv("XDL_IP", "10.0.0.1")  # must not match 10.0.0.11
    doc = dry_json(capsys, "--rank-table", table, "--rank-table-timeout", "0", "--", "true")
    assert doc["rank_table_file"] == table
    assert doc["server"]["index"] == 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["master_addr"] == "172.16.0.5"
    for r in doc["ranks"]:
        assert r["env"]["RANK_TABLE_FILE"] == table
        assert "HCCL_IF_IP" not in r["env"]  # 10.0.0.1 is no address of this machine: no host networking
        assert r["env"]["WORLD_SIZE"] == "4"


def test_dry_run_device_ids_are_logical_among_the_visible_npus(capsys, tmp_path, monkeypatch):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setenv("XDL_IP", "10.0.0.11")
    monkeypatch.setenv("ASCEND_VISIBLE_DEVICES", "Ascend910-2,Ascend910-3")  # the Ascend Operator's form
    doc = dry_json(capsys, "--rank-table", table, "--rank-table-timeout", "0", "--", "true")
    assert [r["env"]["DEVICE_ID"] for r in doc["ranks"]] == ["0", "1"]
    assert [r["env"]["LAUNCHER_PHYSICAL_DEVICE_ID"] for r in doc["ranks"]] == ["2", "3"]


@pytest.mark.parametrize("visible, message", [("0-1", "rank 2: device_id 2"), ("2,x", "'x'")])
def test_npus_the_container_does_not_see_exit_2(capsys, tmp_path, monkeypatch, visible, message):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setenv("XDL_IP", "10.0.0.11")
    monkeypatch.setenv("ASCEND_VISIBLE_DEVICES", visible)
    code, _, err = run_cli(capsys, "run", "--dry-run", "--rank-table", table, "--rank-table-timeout", "0", "--", "true")
    assert code == 2 and message in err


@pytest.mark.parametrize("args, env, expected", [
    ([], {}, None), (["--hccl-if-ip", "10.1.1.1"], {}, "10.1.1.1"), ([], {"LAUNCHER_HCCL_IF_IP": "10.2.2.2"}, "10.2.2.2"),
    (["--hccl-if-ip", "10.1.1.1"], {"HCCL_IF_IP": "10.3.3.3"}, None),  # the operator's own value is inherited
])
def test_dry_run_hccl_if_ip_option(capsys, monkeypatch, args, env, expected):
    monkeypatch.delenv("HCCL_IF_IP", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    doc = dry_json(capsys, "--nproc-per-node", "1", *args, "--", "true")
    assert doc["ranks"][0]["env"].get("HCCL_IF_IP") == expected


def test_hccl_if_ip_must_be_an_address(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--hccl-if-ip", "eth0", "--", "true")
    assert code == 2 and "'eth0' is not an IPv4 or IPv6 address" in err


@pytest.mark.parametrize("args, env, expected", [
    ([], {}, None), (["--graceful-exit"], {}, "1"), ([], {"LAUNCHER_GRACEFUL_EXIT": "1"}, "1"),
])
def test_dry_run_graceful_exit_option(capsys, monkeypatch, args, env, expected):
    monkeypatch.delenv("MS_ENABLE_GRACEFUL_EXIT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    doc = dry_json(capsys, "--nproc-per-node", "1", "--framework", "mindspore", *args, "--", "true")
    assert {r["env"].get("MS_ENABLE_GRACEFUL_EXIT") for r in doc["ranks"] if r["rank"] >= 0} == {expected}


def test_dry_run_two_nodes_derive_the_same_job_id(capsys):
    ids = [{r["env"]["JOB_ID"] for r in dry_json(capsys, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank",
                                                  str(node), "--master-addr", "10.0.0.1", "--", "true")["ranks"]}
           for node in (0, 1)]
    assert ids[0] == ids[1] and len(ids[0]) == 1


def test_dry_run_with_rank_table_file_env_and_pod_ip(capsys, tmp_path, monkeypatch):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setenv("RANK_TABLE_FILE", table)
    monkeypatch.setenv("POD_IP", "172.16.0.6")
    doc = dry_json(capsys, "--rank-table-timeout", "0", "--", "true")
    assert doc["rank_table_file"] == table
    assert [r["rank"] for r in doc["ranks"]] == [2, 3]
    assert [r["env"]["GROUP_RANK"] for r in doc["ranks"]] == ["1", "1"]


def test_dry_run_with_default_rank_table_path(capsys, tmp_path, monkeypatch):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setattr("launcher.jobspec.options.DEFAULT_RANK_TABLE", table)
    monkeypatch.setattr("launcher.jobspec.topology.DEFAULT_RANK_TABLE", table)
    doc = dry_json(capsys, "--server-id", "10.0.0.11", "--rank-table-timeout", "0", "--", "true")
    assert doc["rank_table_file"] == table
    assert doc["server"]["server_id"] == "10.0.0.11"
    # --nproc-per-node ignores the default table
    doc = dry_json(capsys, "--nproc-per-node", "1", "--", "true")
    assert doc["rank_table_file"] is None


def test_dry_run_this_server_not_in_table_exit_2(capsys, tmp_path, monkeypatch):
    table = write_table(tmp_path / "hccl.json", TWO_BY_TWO)
    monkeypatch.setenv("XDL_IP", "10.0.0.2")
    code, _, err = run_cli(capsys, "run", "--dry-run", "--rank-table", table, "--rank-table-timeout", "0",
                           "--", "true")
    assert code == 2
    assert "XDL_IP: 10.0.0.2" in err and "not in the rank table" in err


def test_dry_run_operator_env(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "pt-master-0")
    monkeypatch.setenv("MASTER_PORT", "23456")
    doc = dry_json(capsys, "--", "true")
    assert [r["env"]["RANK"] for r in doc["ranks"]] == ["2", "3"]
    assert {r["env"]["MASTER_ADDR"] for r in doc["ranks"]} == {"pt-master-0"}
    assert {r["env"]["MASTER_PORT"] for r in doc["ranks"]} == {"23456"}


def test_main_returns_int_and_never_raises_for_usage_errors(capsys):
    for argv in (["run"], ["run", "--dry-run", "--", "true"], ["run", "--bogus"]):
        assert main(argv) == 2
    capsys.readouterr()


# --------------------------------------------------------------------------- help and lazy imports

def test_help_lists_commands(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in ("run", "prestop", "exit", "plan", "ranktable"):
        assert name in out


def test_run_help_shows_env_vars(capsys):
    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0
    assert "--nproc-per-node" in out and "LAUNCHER_MAX_RESTARTS" in out and "LAUNCHER_CONFIG" in out


_PROBE = ("import sys, io, contextlib\n"
          "from launcher.commands.cli import main\n"
          "with contextlib.redirect_stdout(io.StringIO()):\n"
          "    code = main({argv!r})\n"
          "print(code, sorted(m for m in ('jsonschema', 'yaml', 'google.protobuf', 'launcher.run.session',"
          " 'launcher.supervision.procgroup', 'hypothesis') if m in sys.modules))\n")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_does_not_import_heavy_modules(argv):
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True,
                          timeout=30, env={k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 []"


def test_dry_run_refuses_sync_dir_without_a_shared_run_id(capsys, tmp_path):
    """--sync-dir is scoped by run id: with several servers a generated one is refused, dry run too."""
    from launcher.jobspec.ranktable import generate_rank_table

    table = tmp_path / "hccl.json"
    table.write_text(json.dumps(generate_rank_table([("10.0.0.1", 1), ("10.0.0.2", 1)])))
    args = ["run", "--rank-table", str(table), "--server-id", "10.0.0.1", "--sync-dir", str(tmp_path / "s"),
            "--dry-run", "--", "true"]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "same run id on every node" in err
    code, _, _ = run_cli(capsys, *args[:1], "--run-id", "job7", *args[1:])
    assert code == 0


# --------------------------------------------------------------------------- help in sections

def _run_command():
    from launcher.commands.run import run
    return run


def test_every_shown_run_option_is_in_exactly_one_help_section():
    import click

    from launcher.commands.run import HELP_SECTIONS, long_name

    run = _run_command()
    ctx = click.Context(run, info_name="run", help_option_names=["-h", "--help"])
    shown = [long_name(p) for p in run.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    listed = [name for _title, names in HELP_SECTIONS for name in names]
    assert sorted(listed) == sorted(set(listed)), "an option is in two sections"
    assert sorted(shown) == sorted(listed)


def test_run_help_is_in_sections_without_torchrun_aliases(capsys):
    from launcher.commands.run import HELP_SECTIONS

    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0
    titles = [line[:-1] for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles[-len(HELP_SECTIONS):] == [title for title, _ in HELP_SECTIONS]
    assert "Unsorted options" not in out
    options = out.split("Where the ranks come from:")[1]
    for hidden in ("--standalone", "--rdzv", "--nproc_per_node", "--tee", "--shutdown-timeout"):
        assert hidden not in options
    for jargon in ("dying", "gasp ", "replica", "RESTORE_RANKS", "rendezvous", "Rendezvous", "barrier"):
        assert jargon not in options, jargon


# --------------------------------------------------------------------------- torchrun habits

def test_torchrun_spellings_are_the_same_options(capsys):
    dashed = dry_json(capsys, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--max-restarts", "3",
                      "--master-addr", "10.0.0.9", "--master-port", "1234", "--run-id", "r", "--", "true")
    underscored = dry_json(capsys, "--nproc_per_node=2", "--nnodes=2", "--node_rank", "1", "--max_restarts=3",
                           "--master_addr", "10.0.0.9", "--master_port=1234", "--run_id", "r", "--", "true")
    assert underscored == dashed
    assert dashed["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "3"


def test_a_py_command_runs_with_the_interpreter(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    doc = dry_json(capsys, "--nproc-per-node", "1", "train.py", "--lr", "1")
    assert doc["ranks"][0]["argv"] == [sys.executable, "-u", "train.py", "--lr", "1"]
    monkeypatch.setenv("PYTHON_EXEC", "/usr/bin/python3")  # torchrun's override
    assert dry_json(capsys, "--nproc-per-node", "1", "--", "train.py")["ranks"][0]["argv"] == \
        ["/usr/bin/python3", "-u", "train.py"]


def test_no_python_and_module(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "run.py"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert dry_json(capsys, "--nproc-per-node", "1", "--no-python", "./run.py", "x")["ranks"][0]["argv"] == \
        ["./run.py", "x"]
    assert dry_json(capsys, "--nproc-per-node", "1", "-m", "json.tool", "--help")["ranks"][0]["argv"] == \
        [sys.executable, "-u", "-m", "json.tool", "--help"]
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--no_python", "--module", "pkg")
    assert code == 2 and err.splitlines() == ["launcher: --no-python and --module contradict each other: "
                                              "pass one of them"]


def test_a_missing_py_script_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "train.py")
    assert code == 2 and out == ""
    assert err.splitlines()[0] == "launcher: script not found: train.py"


def test_a_file_here_without_dot_slash_says_how(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "train.sh")
    assert code == 2
    assert err.splitlines() == ["launcher: command not found: train.sh",
                                "  (searched $PATH; to run the file in this directory, write ./train.sh)"]


def test_standalone_is_one_node_on_a_free_local_port(capsys):
    doc = dry_json(capsys, "--standalone", "--nproc_per_node", "2", "--", "true")
    assert doc["world_size"] == 2 and doc["master_addr"] == "127.0.0.1"
    assert doc["master_port"] != 29500 and {r["env"]["MASTER_PORT"] for r in doc["ranks"]} == \
        {str(doc["master_port"])}
    assert dry_json(capsys, "--standalone", "--", "true")["world_size"] == 1  # torchrun's default
    code, _, err = run_cli(capsys, "run", "--dry-run", "--standalone", "--nnodes", "2", "--", "true")
    assert code == 2 and err.splitlines() == ["launcher: --standalone is a single node: drop --nnodes 2"]


def test_rdzv_endpoint_and_id_are_master_and_run_id(capsys):
    doc = dry_json(capsys, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv_endpoint", "node0:29555", "--rdzv-id", "job7", "--", "true")
    assert (doc["master_addr"], doc["master_port"]) == ("node0", 29555)
    assert doc["ranks"][0]["env"]["TORCHELASTIC_RUN_ID"] == "job7"
    assert dry_json(capsys, "--nproc-per-node", "1", "--rdzv-endpoint", "node0", "--", "true")["master_port"] == 29400


@pytest.mark.parametrize("args, line", [
    (["--rdzv-backend", "zk"], "--rdzv-backend zk: not supported"),
    (["--rdzv-backend", "etcd"], "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT"),
    (["--rdzv-endpoint", "h:1", "--master-port", "2"], "--rdzv-endpoint h:1 and --master-port 2 differ"),
    (["--rdzv-endpoint", "h:x"], "--rdzv-endpoint 'h:x': expected HOST:PORT"),
    (["--rdzv-id", "a", "--run-id", "b"], "--rdzv-id a and --run-id b differ"),
    (["--nnodes", "2", "--rdzv-backend", "c10d"], "pass --node-rank on each node"),
    (["--nnodes", "1:4"], "--nnodes 1:4 (elastic) needs --coordinator etcd://"),
    (["--nnodes", "4:1"], "MIN is above MAX"),
    (["--nproc-per-node", "gpu"], "the launcher does not count GPUs"),
])
def test_torchrun_options_the_launcher_cannot_honour_exit_2(capsys, args, line):
    argv = ["run", "--dry-run", *args] + ([] if "--nproc-per-node" in args else ["--nproc-per-node", "1"])
    code, out, err = run_cli(capsys, *argv, "--", "true")
    assert code == 2 and out == ""
    assert line in err and "Traceback" not in err


def test_refused_torchrun_options_each_say_what_to_do(capsys):
    from launcher.commands.optiontable import FLAG, REFUSED, foreign_rows

    refused = [row for row in foreign_rows("torchrun") if row.handling == REFUSED]
    assert refused
    for row in refused:
        option = row.torchrun
        for spelling in (option, option.replace("-", "_").replace("__", "--")):
            code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", spelling,
                                     *([] if row.type is FLAG else ["3"]), "--", "true")
            assert code == 2 and out == "", spelling
            assert err.splitlines() == [f"launcher: {option} is torchrun's: {row.note}"], spelling
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--local-addr", "h", "--logs-specs",
                           "x", "--", "true")
    assert code == 2 and err.splitlines()[0] == "launcher: 2 options cannot be used here"


def test_shutdown_timeout_is_stop_timeout(capsys, monkeypatch):
    import launcher.run.runner

    seen = []
    monkeypatch.setattr(launcher.run.runner, "execute", lambda opts: seen.append(opts.stop_timeout) or 0)
    assert run_cli(capsys, "run", "--shutdown_timeout", "7", "--", "true")[0] == 0
    assert seen == [7.0]


def test_nproc_per_node_counts(capsys, monkeypatch, tmp_path):
    from launcher.commands import torchrun

    assert dry_json(capsys, "--nproc-per-node", "cpu", "--", "true")["world_size"] == torchrun.cpu_count()
    assert dry_json(capsys, "--nproc-per-node", "auto", "--", "true")["world_size"] == \
        (torchrun.npu_count() or torchrun.cpu_count())
    for name in ("davinci0", "davinci3", "davinci_manager", "devmm_svm"):
        (tmp_path / name).write_text("")
    assert torchrun.npu_count(str(tmp_path)) == 2
    monkeypatch.setattr(torchrun, "npu_count", lambda dev="/dev": 2)
    assert dry_json(capsys, "--nproc-per-node", "npu", "--", "true")["world_size"] == 2
    assert dry_json(capsys, "--nproc-per-node", "auto", "--", "true")["world_size"] == 2
    monkeypatch.setattr(torchrun, "npu_count", lambda dev="/dev": 0)
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "npu", "--", "true")
    assert code == 2 and "no Ascend devices" in err


def test_nnodes_accepts_a_fixed_range(capsys):
    assert dry_json(capsys, "--nproc-per-node", "1", "--nnodes", "2:2", "--", "true")["world_size"] == 2


# --------------------------------------------------------------------------- options after the command

def _warnings(err):
    return [line for line in err.splitlines() if line.startswith("[launcher WARNING]")]


def test_launcher_option_after_the_command_is_one_warning(capsys):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "true", "--max-restarts", "3",
                             "--lr", "1", "--nproc_per_node=2")
    assert code == 0
    [warning] = _warnings(err)
    assert warning.endswith("--max-restarts, --nproc_per_node after the command are passed to true, not to the "
                            "launcher: put launcher options before true (or -- before true if it takes them itself)")


def test_no_warning_with_double_dash_or_script_options(capsys):
    for argv in (["--", "true", "--max-restarts", "3"], ["true", "--lr", "1", "-m", "x"],
                 ["--max-restarts", "3", "true"]):
        code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", *argv)
        assert code == 0 and _warnings(err) == [], argv


_LAUNCHER_OPTIONS = ["--max-restarts", "--nproc-per-node", "--log-dir", "--checkpoint-dir", "--dp"]
_SCRIPT_TOKENS = ["--lr", "-m", "x", "1", "--", "--steps=3", "-v"]


@given(before=st.lists(st.sampled_from(_LAUNCHER_OPTIONS), max_size=3),
       after=st.lists(st.sampled_from(_LAUNCHER_OPTIONS + _SCRIPT_TOKENS), max_size=6),
       separated=st.booleans())
def test_options_after_command_finds_exactly_the_launcher_options_after_it(before, after, separated):
    """Whatever comes before the command is the launcher's; after it, only launcher options are reported,
    and nothing at all once ``--`` marks where the command starts."""
    from launcher.commands.run import options_after_command

    run = _run_command()
    args = [token for option in before for token in (option, "1")] + (["--"] if separated else []) + \
        ["train.py"] + after
    misplaced, program = options_after_command(args, run.params)
    expected = [] if separated else list(dict.fromkeys(t for t in after if t in _LAUNCHER_OPTIONS))
    assert misplaced == expected
    assert program == ("" if separated else "train.py")


def test_node_rank_from_the_config_file_counts_as_given(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("node_rank: 1\nnnodes: 2\nnproc_per_node: 1\n")
    doc = dry_json(capsys, "--config", str(config), "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:1", "--", "true")
    assert doc["server"]["index"] == 1


@given(text=st.text(alphabet="0123456789:-abcdu[] .", max_size=12))
def test_torchrun_value_parsers_accept_or_refuse_cleanly(text):
    """Whatever the text, --nproc-per-node, --nnodes and --rdzv-endpoint give a number / an address or
    one usage line: never another exception."""
    import click

    from launcher.commands.optiontypes import NnodesType, NprocType
    from launcher.commands.torchrun import _endpoint

    for kind in (NprocType(), NnodesType()):
        try:
            value = kind.convert(text, None, None)
        except click.BadParameter:
            continue
        # a count, or --nnodes MIN:MAX as the pair (elastic membership)
        assert value >= 1 if isinstance(value, int) else 1 <= value[0] < value[1]
    kwargs = {"master_addr": None, "master_port": None}
    problems = _endpoint(kwargs, text)
    # port 0 is torchrun's "a free port": no --master-port, topology.resolve picks one
    assert problems or (kwargs["master_addr"] and (kwargs["master_port"] is None or 0 < kwargs["master_port"] < 65536))
