"""Unit tests for ``launcher.commands.control``: ``launcher exit`` against a scripted supervisor.

The supervisor is a real unix socket in a private run dir, served by a thread that reads the
request and sends a fixed list of answers, then closes; ``launcher exit`` runs through the CLI.
"""

import json
import os
import socket
import tempfile
import threading

import pytest

from launcher.commands.cli import main
from launcher.common.rundir import CONTROL_SOCKET


@pytest.fixture
def run_dir(clean_env, restore_launcher_logger):
    path = tempfile.mkdtemp(dir="/tmp", prefix="lx-")  # short: unix socket paths are limited
    os.chmod(path, 0o700)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def serve(run_dir, answers):
    """Accept one client on the run dir's socket, record its request, answer, close."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(run_dir, CONTROL_SOCKET))
    listener.listen(1)
    seen = {}

    def run():
        with listener:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as reader:
                seen["request"] = json.loads(reader.readline())
                for answer in answers:
                    conn.sendall((json.dumps(answer) + "\n").encode())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def launcher_exit(capsys, run_dir, *args):
    code = main(["exit", "--run-dir", run_dir, "--timeout", "10", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("exit_code, expected", [(0, 0), (3, 1)])
def test_exit_waits_for_the_job_to_end(capsys, run_dir, exit_code, expected):
    thread, seen = serve(run_dir, [{"ok": True, "accepted": True},
                                   {"ok": True, "done": True, "reason": "graceful-exit", "exit_code": exit_code}])
    code, out, _ = launcher_exit(capsys, run_dir)
    thread.join(10)
    assert seen["request"] == {"command": "exit", "args": {}}
    assert code == expected
    assert out.splitlines() == ["launcher exit: requested; ranks stop at their next step boundary",
                                f"launcher exit: job ended (graceful-exit, exit {exit_code})"]


def test_exit_no_wait_returns_once_accepted(capsys, run_dir):
    thread, _ = serve(run_dir, [{"ok": True, "accepted": True}])
    code, out, _ = launcher_exit(capsys, run_dir, "--no-wait")
    thread.join(10)
    assert code == 0 and "requested" in out


def test_a_connection_closed_before_the_end_is_a_failure(capsys, run_dir):
    """The supervisor died after accepting: the job did not end as asked, so no exit 0."""
    thread, _ = serve(run_dir, [{"ok": True, "accepted": True}])
    code, _, err = launcher_exit(capsys, run_dir)
    thread.join(10)
    assert code == 1
    assert "closed the connection before the job ended" in err


def test_a_refusal_is_a_failure(capsys, run_dir):
    thread, _ = serve(run_dir, [{"ok": False, "error": "busy"}])
    code, _, err = launcher_exit(capsys, run_dir)
    thread.join(10)
    assert code == 1 and "the launcher refused: busy" in err


def test_no_supervisor_says_what_to_check(capsys, run_dir):
    code, _, err = launcher_exit(capsys, run_dir)
    assert code == 1
    assert "no launcher is listening" in err and f"run dir {run_dir}" in err


def test_no_run_dir(capsys, tmp_path, clean_env, restore_launcher_logger):
    code, _, err = launcher_exit(capsys, str(tmp_path / "missing"))
    assert code == 1 and "no launcher is running here" in err
