"""Unit tests for ``launcher.jobspec.preload``: which commands a standby can run, which variables count,
the ``--preload`` parser, and the option's sources (command line, ``LAUNCHER_PRELOAD``, ``--config``)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.commands.cli import main
from launcher.common.errors import UsageError
from launcher.jobspec.preload import (PythonEntry, is_start_variable, learned_modules, parse_modules, preload_mode,
                                      python_entry, start_env_diff)

PY = "/usr/bin/python3"


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger):
    """A clean environment (fixtures in tests/unit/conftest.py)."""


@pytest.mark.parametrize("command, expected", [
    ([PY, "train.py", "--lr", "1"], PythonEntry((PY,), False, "train.py", ("--lr", "1"))),
    ([PY, "-u", "train.py"], PythonEntry((PY, "-u"), False, "train.py", ())),
    ([PY, "-u", "-X", "dev", "-W", "error", "t.py", "-m", "x"],
     PythonEntry((PY, "-u", "-X", "dev", "-W", "error"), False, "t.py", ("-m", "x"))),
    ([PY, "-Werror", "t.py"], PythonEntry((PY, "-Werror"), False, "t.py", ())),
    ([PY, "-u", "-m", "pkg.train", "--x"], PythonEntry((PY, "-u"), True, "pkg.train", ("--x",))),
    ([PY, "-mpkg", "a"], PythonEntry((PY,), True, "pkg", ("a",))),
    (["python", "--", "t.py"], PythonEntry(("python", "--"), False, "t.py", ())),
    (["python3.11", "t.py"], PythonEntry(("python3.11",), False, "t.py", ())),
])
def test_python_entry_accepts_scripts_and_modules(command, expected):
    assert python_entry(command) == expected


@pytest.mark.parametrize("command", [
    [], ["bash", "run.sh"], ["./train.py"], ["torchrun", "t.py"], [PY], [PY, "-u"], [PY, "-c", "print(1)"],
    [PY, "-cprint(1)"], [PY, "-"], [PY, "-i", "t.py"], [PY, "-V"], [PY, "-m"], ["/opt/ipython", "t.py"],
])
def test_python_entry_refuses_everything_else(command):
    assert python_entry(command) is None


@given(st.lists(st.sampled_from(["-u", "-m", "-c", "-W", "x", "t.py", "--", "-", "-mpkg", "-i"]) | st.text(max_size=8),
                max_size=6))
def test_python_entry_splits_the_command_without_losing_a_token(tail):
    command = [PY, *tail]
    entry = python_entry(command)
    if entry is None:
        return
    if not entry.module:
        assert [*entry.interpreter, entry.target, *entry.args] == command
    else:
        assert command in ([*entry.interpreter, "-m", entry.target, *entry.args],
                           [*entry.interpreter, "-m" + entry.target, *entry.args])


def test_parse_modules():
    assert parse_modules(None) == ()
    assert parse_modules("") == ()
    assert parse_modules(" torch, numpy ,torch,,a.b_c") == ("torch", "numpy", "a.b_c")


@pytest.mark.parametrize("text", ["torch numpy", "1abc", "a..b", "torch,-x", "os.path."])
def test_parse_modules_refuses_non_names(text):
    with pytest.raises(UsageError, match="--preload"):
        parse_modules(text)


@given(st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}(\.[a-z_][a-z0-9_]{0,6}){0,2}", fullmatch=True), max_size=5))
def test_parse_modules_round_trip(names):
    assert parse_modules(",".join(names)) == tuple(dict.fromkeys(names))


def test_start_variables():
    for name in ("PYTHONPATH", "PYTHONHASHSEED", "LD_PRELOAD", "OMP_NUM_THREADS", "MALLOC_ARENA_MAX", "LC_ALL",
                 "LANG", "HOME", "PATH", "TORCH_SHOW_CPP_STACKTRACES", "GLIBC_TUNABLES"):
        assert is_start_variable(name)
    for name in ("RANK", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT", "LAUNCHER_JOB_TOKEN", "LAUNCHER_ATTEMPT"):
        assert not is_start_variable(name)
    assert is_start_variable("MY_MODEL_FLAG", extra=["MY_MODEL_FLAG"])


def test_start_env_diff_ignores_per_attempt_variables():
    standby = {"PATH": "/bin", "RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0", "LD_PRELOAD": "/lib/taskd.so"}
    rank = {**standby, "TORCHELASTIC_RESTART_COUNT": "1", "MASTER_PORT": "1234"}
    assert start_env_diff(standby, rank) == []


def test_start_env_diff_names_changed_added_and_removed():
    standby = {"PYTHONPATH": "/a", "LD_PRELOAD": "/lib/taskd.so", "OMP_NUM_THREADS": "4"}
    rank = {"PYTHONPATH": "/b", "OMP_NUM_THREADS": "4", "MALLOC_ARENA_MAX": "2"}
    assert start_env_diff(standby, rank) == ["LD_PRELOAD", "MALLOC_ARENA_MAX", "PYTHONPATH"]


def test_start_env_diff_counts_what_the_imports_read():
    assert start_env_diff({"MODEL_CFG": "a"}, {"MODEL_CFG": "b"}) == []
    assert start_env_diff({"MODEL_CFG": "a"}, {"MODEL_CFG": "b"}, extra=["MODEL_CFG"]) == ["MODEL_CFG"]


def _dry_run(capsys, *args):
    code = main(["run", "--dry-run", "--json", *args])
    out, err = capsys.readouterr()
    return code, err


def test_preload_option_from_each_source(capsys, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("launcher.run.runner.execute", lambda opts: seen.append(opts) or 0)
    config = tmp_path / "c.yaml"
    config.write_text("preload: numpy\npreload-max-rss: 512\n")
    assert main(["run", "--config", str(config), "--nproc-per-node", "1", "--", PY, "t.py"]) == 0
    monkeypatch.setenv("LAUNCHER_PRELOAD", "json")
    assert main(["run", "--config", str(config), "--nproc-per-node", "1", "--", PY, "t.py"]) == 0
    assert main(["run", "--preload", "torch", "--nproc-per-node", "1", "--", PY, "t.py"]) == 0
    assert [(o.preload, o.preload_max_rss) for o in seen] == [("numpy", 512.0), ("json", 512.0), ("torch", 4096.0)]


def test_bad_preload_is_a_usage_error(capsys):
    code, err = _dry_run(capsys, "--preload", "torch numpy", "--nproc-per-node", "1", "--", PY, "t.py")
    assert code == 2
    assert "--preload 'torch numpy'" in err and "Traceback" not in err


@pytest.mark.parametrize("options, learns", [((), True), (("--preload", "auto"), True),
                                             (("--preload", "none"), False), (("--preload", "numpy"), False)])
def test_default_is_auto_and_its_ranks_record_their_imports(capsys, tmp_path, options, learns):
    script = tmp_path / "t.py"
    script.write_text("")
    code = main(["run", "--dry-run", "--json", *options, "--nproc-per-node", "1", "--", PY, str(script)])
    doc = json.loads(capsys.readouterr().out)
    rank = doc["ranks"][0]
    assert code == 0 and rank["argv"] == [PY, str(script)]
    assert ("LAUNCHER_IMPORTS_FILE" in rank["env"]) == learns
    if learns:
        assert rank["env"]["LAUNCHER_IMPORTS_FILE"].endswith("/standby/imports.txt")
        assert rank["env"]["PYTHONPATH"].endswith("rankhooks")  # where sitecustomize installs the recorder


@pytest.mark.parametrize("text, expected", [
    (None, (True, ())), ("auto", (True, ())), (" auto ", (True, ())), ("none", (False, ())), ("", (False, ())),
    ("torch,torch._dynamo", (False, ("torch", "torch._dynamo"))),
])
def test_preload_mode(text, expected):
    assert preload_mode(text) == expected


def test_learned_modules_keeps_installed_candidates_once_in_order():
    recorded = ["torch", "os", "numpy", "torch", "launcher_heartbeat", "__main__", "sitecustomize", "json.decoder",
                "torch_npu", "torch_npu.contrib", "torch._dynamo", "numpy", "bad name", "mymodel"]
    assert learned_modules(recorded, ["numpy"], ["torch_npu"]) == ["torch", "torch._dynamo", "mymodel"]
    assert learned_modules(["torch_npu2"], [], ["torch_npu"]) == ["torch_npu2"]  # a prefix is a whole name
