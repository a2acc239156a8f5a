"""Idle clients of the control socket cannot starve the launcher of file descriptors (issue 27, item 4).

The launcher runs under ``ulimit -n 256``; 400 connections from the same user connect and say nothing.
Before: ~90000 "cannot accept" lines in 4 s, ``launcher status`` found no supervisor, and the next
restart failed (``cannot start rank 0: ... Too many open files``, exit 1). Now the server holds at most
16 of them (a sixteenth of the limit), closing the oldest silent one for each new client: a status
request is answered, the restart starts its ranks and the job ends 0 with ``job_end``.
"""

import resource
import socket
import time

from launcher.control.client import request
from tests.helpers.launch import Launcher


def test_400_idle_control_connections_under_ulimit_256_do_not_stop_a_restart(tmp_path):
    node = Launcher(tmp_path)
    trigger = tmp_path / "fail-now"
    node.start(["--nproc-per-node", "2", "--max-restarts", "1"],
               ["--fail-rank", "1", "--fail-when", str(trigger), "--run", "4"],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    idle = []
    try:
        node.wait_ready(2)
        path = str(node.run_dir / "control.sock")
        deadline = time.monotonic() + 20
        while len(idle) < 400 and time.monotonic() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(1)
            try:
                sock.connect(path)
                idle.append(sock)
            except OSError:
                sock.close()
        assert len(idle) == 400  # before: ~260, then the backlog stayed full
        answers = list(request(path, "status"))
        assert answers and answers[0].get("ok") is True
        trigger.touch()
        code = node.wait(60)
    finally:
        for sock in idle:
            sock.close()
    assert code == 0, node.stderr
    assert sorted(int(line[1]) for line in node.ready_lines()) == [0, 0, 1, 1]  # the restart started both
    assert node.stderr.count("cannot accept") == 0 and "Traceback" not in node.stderr
    assert [e["event"] for e in node.events()][-2:] == ["job_end", "stop"]
