"""Unit tests for ``launcher.__main__``: ``launcher status``'s click-free path answers exactly as the click
command does (options, output, messages, exit codes), and falls back to it for anything else."""

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.__main__ import fast_status_args, main
from launcher.commands.cli import main as click_main
from launcher.commands.status import status as status_command
from launcher.common import rundir as rundir_mod

from tests.unit.monitoring.test_status import EVENTS, write_run_dir


@pytest.mark.parametrize("args, parsed", [
    ([], (None, None, False)),
    (["--json"], (None, None, True)),
    (["--run-dir", "/r", "--json"], ("/r", None, True)),
    (["--run-dir=/r", "--job=a"], ("/r", "a", False)),
    (["--job", "a", "--job", "b"], (None, "b", False)),   # the last one wins, as with click
    (["--watch"], None), (["--watch", "1"], None), (["--help"], None), (["-h"], None),
    (["--bogus"], None), (["extra"], None), (["--run-dir"], None), (["--run-dir="], None),
    (["--job", "--json"], None), (["--json=1"], None), (["--"], None),
])
def test_what_the_fast_path_parses_and_what_it_leaves_to_click(args, parsed, clean_env):
    assert fast_status_args(args) == parsed


def test_a_run_dir_click_would_refuse_goes_to_click(tmp_path, clean_env, monkeypatch, capsys):
    afile = tmp_path / "file"
    afile.write_text("")
    assert fast_status_args(["--run-dir", str(afile)]) is None
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(afile))
    assert fast_status_args([]) is None
    with pytest.raises(SystemExit) as exit_:
        main(["status"])
    assert exit_.value.code == 2 and "is a file" in capsys.readouterr().err


TOKENS = st.sampled_from(["--json", "--run-dir", "--job", "--run-dir=/x", "--job=j", "j", "/y", "--watch", "1",
                          "-h", "--bogus", "", "--job=", "-"])


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=6))
def test_the_fast_parse_agrees_with_click_whenever_it_answers(args):
    """For any command line, the fast path either declines or reads exactly what click reads."""
    parsed = fast_status_args(args)
    if parsed is None:
        return
    params = status_command.make_context("status", list(args), resilient_parsing=False).params
    assert parsed == (params["run_dir"], params["job"], params["as_json"]) and params["watch"] is None


def both(argv, capsys, monkeypatch):
    """(exit code, stdout, stderr) of the fast path and of the click command for ``argv``, at one fixed time."""
    monkeypatch.setattr(time, "time", lambda: 1020.0)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    fast = (exit_.value.code, *capsys.readouterr())
    slow = (click_main(argv), *capsys.readouterr())
    return fast, slow


@pytest.fixture
def jobs_base(tmp_path, monkeypatch, clean_env):
    """Two running jobs and an ended one under the base dir."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    base = tmp_path / "launcher"
    fds = []
    for name in ("one", "two"):
        path = write_run_dir(base / name, 3, os.getpid(), EVENTS)
        fds.append(os.open(os.path.join(path, rundir_mod.LOCK), os.O_RDONLY))
        fcntl.flock(fds[-1], fcntl.LOCK_EX)
    write_run_dir(base / "old", 1, 2 ** 22 + 1, EVENTS[:2], ended=1030.0)
    yield base
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("argv, code", [
    (["status", "--job", "one"], 0),
    (["status", "--job", "two", "--json"], 0),
    (["status", "--job=old", "--json"], 0),
    (["status"], 2),                          # several running jobs: listed
    (["status", "--job", "no/such"], 2),      # not a job name
    (["status", "--job", "absent"], 1),       # no such run dir
])
def test_fast_path_and_click_answer_alike(jobs_base, argv, code, capsys, monkeypatch):
    fast, slow = both(argv, capsys, monkeypatch)
    assert fast == slow and fast[0] == code
    if code == 0 and "--json" in argv:
        assert json.loads(fast[1])["job"] == argv[-2].split("=")[-1]


def test_no_job_at_all_alike(tmp_path, capsys, monkeypatch, clean_env):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    fast, slow = both(["status"], capsys, monkeypatch)
    assert fast == slow and fast[0] == 1 and "no jobs under" in fast[2]


def test_a_bad_option_gets_clicks_message(capsys, clean_env):
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--bogus"])
    assert exit_.value.code == 2 and "No such option '--bogus'" in capsys.readouterr().err


def test_the_fast_path_loads_no_heavy_module(jobs_base):
    """What the lean-status import contract cannot see (function-level imports of the standard library)."""
    heavy = ("click", "logging", "dataclasses", "statistics", "psutil", "jsonschema", "yaml")
    code = (f"import atexit, sys; atexit.register(lambda: print(sorted(m for m in {heavy!r} if m in sys.modules), "
            "file=sys.stderr)); from launcher.__main__ import main; main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", code, "status", "--job", "one", "--json"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0 and json.loads(done.stdout)["job"] == "one"
    assert done.stderr.strip() == "[]"
