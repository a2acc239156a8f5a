"""launcher.supervision.debugging and the rank-side hooks: environment, argv, Ctrl-C and terminal requests,
and the supervisor's policy while a rank holds the terminal (scripted events, no processes)."""

import os
import signal
import subprocess
import sys

import pytest

from launcher.supervision import debugging
from launcher.supervision.debugging import DOUBLE_PRESS_SECONDS, HOOKS_DIR, HOOKS_FILE, DebugConsole
from launcher.common.errors import UsageError
from launcher.supervision.policy import RestartPolicy
from launcher.supervision.procgroup import ControlRequest, SignalReceived
from tests.unit.supervision.test_supervisor import ScriptedGroup, exited, specs_for, supervisor

SOCKET = "/run/x/control.sock"


# -- per-rank environment ----------------------------------------------------------------------
def test_ranks_without_the_terminal_get_the_breakpoint_hint_after_the_jobs_pythonpath():
    env = debugging.rank_env({"PYTHONPATH": "/job/src"}, 2, 1, False, SOCKET)
    assert env == {"LAUNCHER_DEBUG_RANK": "1", "PYTHONBREAKPOINT": "launcher_rankhooks.breakpoint_hint",
                   "PYTHONPATH": f"/job/src{os.pathsep}{HOOKS_DIR}"}


def test_the_debug_rank_keeps_the_real_breakpoint():
    assert debugging.rank_env({}, 1, 1, False, SOCKET) == {"LAUNCHER_DEBUG_RANK": "1"}


def test_an_operator_pythonbreakpoint_is_kept_and_pdb_gets_the_socket():
    env = debugging.rank_env({"PYTHONBREAKPOINT": "0"}, 0, None, True, SOCKET)
    assert env == {"LAUNCHER_CONTROL_SOCKET": SOCKET}


def test_without_options_every_rank_gets_only_the_hint():
    assert set(debugging.rank_env({}, 0, None, False, SOCKET)) == {"PYTHONBREAKPOINT", "PYTHONPATH"}


# -- --pdb argv and option checks --------------------------------------------------------------
@pytest.mark.parametrize("command, expected", [
    (("python3", "-u", "train.py", "--lr", "1"), ("python3", "-u", HOOKS_FILE, "train.py", "--lr", "1")),
    (("/usr/bin/python3.11", "-u", "-m", "pkg.train", "-x"), ("/usr/bin/python3.11", "-u", HOOKS_FILE, "-m",
                                                              "pkg.train", "-x")),
    (("python", "-X", "dev", "-W", "error", "t.py"), ("python", "-X", "dev", "-W", "error", HOOKS_FILE, "t.py")),
    ((sys.executable, "t.py"), (sys.executable, HOOKS_FILE, "t.py")),
])
def test_pdb_wraps_the_script_after_the_interpreter_options(command, expected):
    assert debugging.postmortem_argv(command) == expected


@pytest.mark.parametrize("command", [("bash", "run.sh"), ("python", "-c", "1/0"), ("python", "-m"),
                                     ("python", "-u")])
def test_pdb_refuses_what_it_cannot_wrap(command):
    with pytest.raises(UsageError) as info:
        debugging.postmortem_argv(command)
    assert "--pdb needs a Python command" in info.value.message


def test_debug_rank_must_be_a_local_rank():
    with pytest.raises(UsageError) as info:
        debugging.check_options(5, False, ("x",), [0, 1, 2, 3])
    assert info.value.lines()[-2:] == ["launcher: --debug-rank 5: not a rank of this machine",
                                       "  local ranks: 0, 1, 2, 3"]
    debugging.check_options(3, False, ("x",), [0, 1, 2, 3])


# -- Ctrl-C and terminal requests --------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def tty():
    master, slave = os.openpty()
    yield slave
    os.close(master)
    os.close(slave)


def console(debug_rank=None, postmortem=False, fd=None, clock=None):
    events = []
    if fd is None:
        read, fd = os.pipe()
        os.close(read)
    con = DebugConsole(debug_rank, postmortem, lambda name, **kw: events.append((name, kw)),
                       clock=clock or Clock(), terminal_fd=fd)
    return con, events


def test_ctrl_c_goes_to_the_debug_rank_and_a_quick_second_one_to_the_launcher():
    clock, sent = Clock(), []
    con, events = console(debug_rank=1, clock=clock)
    send = lambda ranks, signum: sent.append((tuple(ranks), signum))
    assert con.interrupt({0: 10, 1: 11}, send)
    clock.now += DOUBLE_PRESS_SECONDS / 2
    assert not con.interrupt({0: 10, 1: 11}, send)  # pressed twice: the launcher's own Ctrl-C
    clock.now += DOUBLE_PRESS_SECONDS / 2
    assert con.interrupt({0: 10, 1: 11}, send)  # a fresh press goes to the debugger again
    assert sent == [((1,), signal.SIGINT), ((1,), signal.SIGINT)]
    assert [name for name, _ in events] == ["debug_interrupt", "debug_interrupt"]


def test_ctrl_c_is_the_launchers_when_the_debug_rank_is_not_running():
    con, _ = console(debug_rank=1)
    assert not con.interrupt({0: 10}, lambda ranks, signum: pytest.fail("sent"))


def test_post_mortem_terminal_goes_to_the_first_failing_rank_of_an_attempt(tty):
    con, events = console(postmortem=True, fd=tty)
    assert con.request({"rank": 2, "pid": 42}, 0, False) == {"ok": True, "tty": os.ttyname(tty)}
    assert con.request({"rank": 3, "pid": 43}, 0, False) == {"ok": False,
                                                             "error": "rank 2 already has the terminal"}
    assert con.holding({2: 42, 3: 43}) == {2}
    assert con.holding({2: 99}) == set()  # rank 2 restarted: a new process, not the debugger
    assert con.request({"rank": 1, "pid": 44}, 0, True)["error"].startswith("the job is already stopping")
    assert con.request({"rank": 1, "pid": 45}, 1, False)["ok"]  # a later attempt: its own first failure
    assert [name for name, _ in events] == ["debugger_attached", "debugger_refused", "debugger_refused",
                                            "debugger_attached"]


@pytest.mark.parametrize("kwargs, args, error", [
    ({"postmortem": False}, {"rank": 1}, "the launcher was not started with --pdb"),
    ({"postmortem": True, "debug_rank": 0}, {"rank": 1}, "rank 0 has the terminal (--debug-rank)"),
    ({"postmortem": True}, {"rank": "x"}, "malformed request"),
])
def test_post_mortem_refusals(tty, kwargs, args, error):
    con, _ = console(fd=tty, **kwargs)
    assert con.request(args, 0, False) == {"ok": False, "error": error}


def test_no_post_mortem_without_a_terminal():
    con, _ = console(postmortem=True)
    assert con.request({"rank": 1}, 0, False) == {"ok": False, "error": "the launcher has no terminal"}


# -- the supervisor while a rank holds the terminal --------------------------------------------
class TimedGroup(ScriptedGroup):
    """Also records the timeout of every wait."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self.timeouts = []

    def wait_event(self, timeout):
        self.timeouts.append(timeout)
        return super().wait_event(timeout)


def supervise_debug(script, debug, n=2, **policy):
    group = TimedGroup([script])
    sup = supervisor(group, specs_for(n), RestartPolicy(**policy), lambda name, **kw: None, debug=debug)
    return sup.run(), group


def test_a_failure_elsewhere_neither_signals_nor_times_out_the_debugged_rank():
    con, _ = console(debug_rank=1)
    result, group = supervise_debug([exited(0, 1), exited(1, 0)], con, stop_timeout=0.0)
    assert result.exit_code == 1 and result.root_cause.rank == 0
    assert not [c for c in group.calls if c[0] in ("signal", "kill") and 1 in c[1]]
    assert group.timeouts[-1] is None  # waited for rank 1 without a deadline


def test_the_other_ranks_are_still_stopped_and_killed_at_their_deadline():
    con, _ = console(debug_rank=1)
    result, group = supervise_debug([exited(0, 1), None, exited(2, -9), exited(1, 0)], con, n=3,
                                    stop_timeout=0.0)
    assert ("signal", (2,), signal.SIGTERM) in group.calls and ("kill", (2,)) in group.calls
    assert not [c for c in group.calls if c[0] in ("signal", "kill") and 1 in c[1]]


def test_ctrl_c_twice_while_the_debugged_rank_is_spared_kills_it():
    clock = Clock()
    con, _ = console(debug_rank=1, clock=clock)
    script = [exited(0, 1), SignalReceived(signal.SIGINT), SignalReceived(signal.SIGINT), None, exited(1, -9)]
    result, group = supervise_debug(script, con)
    assert group.calls.count(("signal", (1,), signal.SIGINT)) == 1  # the first press: to the debugger
    assert ("kill", (1,)) in group.calls
    assert result.reason == "failed"


def test_ctrl_c_while_debugging_does_not_stop_the_job():
    con, _ = console(debug_rank=1)
    result, group = supervise_debug([SignalReceived(signal.SIGINT), exited(0, 0), exited(1, 0)], con)
    assert (result.exit_code, result.reason) == (0, "succeeded")
    assert [c for c in group.calls if c[0] == "signal"] == [("signal", (1,), signal.SIGINT)]


def test_a_user_stop_is_not_spared():
    con, _ = console(debug_rank=1)
    result, group = supervise_debug([SignalReceived(signal.SIGTERM), exited(0, -15), exited(1, -15)], con)
    assert ("signal", (0, 1), signal.SIGTERM) in group.calls and result.reason == "gasp"


def test_terminal_request_reaches_the_debug_console(tty):
    con, _ = console(postmortem=True, fd=tty)
    replies = []
    request = ControlRequest("debug-terminal", {"rank": 1, "pid": 1001},
                             lambda payload, final=False: replies.append((payload, final)))
    result, group = supervise_debug([request, exited(0, 0), exited(1, 0)], con)
    assert replies == [({"ok": True, "tty": os.ttyname(tty)}, True)] and result.exit_code == 0


# -- the rank-side wrapper -----------------------------------------------------------------------
def test_wrapper_without_a_launcher_prints_the_traceback_and_exits_1(tmp_path):
    (tmp_path / "boom.py").write_text("import sys\nprint(sys.argv[1:])\nraise RuntimeError('boom')\n")
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHER_CONTROL_SOCKET"}
    result = subprocess.run([sys.executable, HOOKS_FILE, str(tmp_path / "boom.py"), "a", "b"], env=env,
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert result.stdout == "['a', 'b']\n"
    assert result.stderr.splitlines()[1].startswith(f'  File "{tmp_path / "boom.py"}", line 3')
    assert result.stderr.splitlines()[-2:] == ["RuntimeError: boom",
                                               "post-mortem debugger not started: no launcher control socket"]


def test_wrapper_runs_a_module_and_passes_its_exit_code(tmp_path):
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(sys.argv[1])\n")
    result = subprocess.run([sys.executable, HOOKS_FILE, "-m", "quitter", "3"], cwd=str(tmp_path),
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                            timeout=30)
    assert (result.returncode, result.stderr) == (1, "3\n")  # sys.exit("3") prints it and exits 1


def test_root_cause_hint_for_a_debugger_that_read_end_of_file():
    tail = ["[rank1]:     if self.quitting: raise BdbQuit", "[rank1]: bdb.BdbQuit"]
    assert debugging.root_cause_hint(1, tail) == [
        "rank 1 stopped at a debugger without a terminal (bdb.BdbQuit): run with --debug-rank 1 to debug it here"]
    assert debugging.root_cause_hint(1, ["ValueError: x"]) == []


# -- the options through the CLI (dry run: nothing starts) -------------------------------------
@pytest.fixture
def cli(clean_env, restore_launcher_logger, monkeypatch, tmp_path, capsys):
    from launcher.commands.cli import main

    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))
    script = tmp_path / "train.py"
    script.write_text("")

    def run(*argv):
        code = main(["run", "--dry-run", "--json", "--nproc-per-node", "2", *argv])
        out, err = capsys.readouterr()
        return code, out, err
    run.script = str(script)
    return run


def test_dry_run_shows_the_wrapper_and_the_debug_variables(cli):
    import json

    code, out, err = cli("--pdb", "--debug-rank", "1", cli.script, "--lr", "1")
    assert code == 0, err
    ranks = json.loads(out)["ranks"]
    assert ranks[0]["argv"][-4:] == [HOOKS_FILE, cli.script, "--lr", "1"]
    assert ranks[0]["env"]["PYTHONBREAKPOINT"] == "launcher_rankhooks.breakpoint_hint"
    assert "PYTHONBREAKPOINT" not in ranks[1]["env"]
    assert {r["env"]["LAUNCHER_DEBUG_RANK"] for r in ranks} == {"1"}


@pytest.mark.parametrize("argv, message", [
    (("--debug-rank", "2", "TRAIN"), "launcher: --debug-rank 2: not a rank of this machine"),
    (("--pdb", "--", "true"), "launcher: --pdb needs a Python command: SCRIPT.py, -m MODULE or python SCRIPT ..."),
])
def test_bad_debug_options_exit_2_with_one_line(cli, argv, message):
    code, out, err = cli(*[cli.script if a == "TRAIN" else a for a in argv])
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == message
