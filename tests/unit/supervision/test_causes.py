"""The table of start-up failure causes, on the messages the tools print (as users reported them)."""

import pytest

from launcher.supervision.causes import DETERMINISTIC, TRANSIENT, classify

MINDSPORE_BIND = """\
[WARNING] DISTRIBUTED(31,ffff979150f0,python):2025-08-19-10:34:38.043.650 [mindspore/ccsrc/distributed/rpc/tcp/tcp_comm.cc:191] StartServerSocket] Failed to call bind, url: 127.0.0.1:2229 Address already in use
[WARNING] DISTRIBUTED(31,ffff979150f0,python):2025-08-19-10:34:38.043.689 [mindspore/ccsrc/distributed/rpc/tcp/tcp_comm.cc:195] StartServerSocket] Failed to call socket listen, url: 127.0.0.1:2229
[ERROR] DISTRIBUTED(31,ffff979150f0,python):2025-08-19-10:34:38.043.706 [mindspore/ccsrc/distributed/cluster/topology/meta_server_node.cc:114] InitTCPServer] Failed to init the tcp server
"""
TCPSTORE_BIND = """\
[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
[E socket.cpp:462] [c10d] The server socket has failed to listen on any local network address.
RuntimeError: The server socket has failed to listen on any local network address.
"""
HCCP = """\
RuntimeError: [ERROR] HCCL error in: torch_npu/csrc/distributed/ProcessGroupHCCL.cpp:64
[ERROR] 2024-05-21-11:57:54 (PID:927000, Device:3, RankID:3) ERR02200 DIST call hccl api failed.
EJ0001: 2024-05-21-11:57:54.167.645 Failed to initialize the HCCP process. Reason: Maybe the last training process is running.
        Solution: Wait for 10s after killing the last training process and try again.
"""


@pytest.mark.parametrize("text, name, wait", [(MINDSPORE_BIND, "mindspore-port-in-use", 5.0),
                                              (TCPSTORE_BIND, "tcpstore-port-in-use", 5.0),
                                              (HCCP, "hccp-busy", 10.0)])
def test_transient_causes(text, name, wait):
    found = classify(text)
    assert (found.cause.name, found.cause.kind, found.cause.wait) == (name, TRANSIENT, wait)


@pytest.mark.parametrize("line, name", [
    ("SyntaxError: invalid syntax", "syntax-error"),
    ("IndentationError: unexpected indent", "syntax-error"),
    ("ModuleNotFoundError: No module named 'transformerz'", "missing-module"),
    ("ImportError: cannot import name 'foo' from 'bar' (/x/bar.py)", "missing-module"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/data/train.bin'", "missing-file"),
    ("/usr/bin/python3: can't open file '/job/trian.py': [Errno 2] No such file or directory", "missing-file"),
    ("train.py: error: unrecognized arguments: --lr0.1", "bad-argument"),
    ("train.py: error: the following arguments are required: --data", "bad-argument"),
])
def test_deterministic_causes_and_their_line(line, name):
    text = f"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n{line}\n"
    found = classify(text)
    assert (found.cause.name, found.cause.kind, found.line) == (name, DETERMINISTIC, line)


def test_a_transient_cause_wins_over_the_exception_that_carries_it():
    assert classify(HCCP + "ImportError: late\n").cause.name == "hccp-busy"


@pytest.mark.parametrize("text", ["", "RuntimeError: CUDA error\n", "step 3 loss 0.2\nKilled\n",
                                  "  raise ValueError('SyntaxError: in a message')\nValueError: x\n"])
def test_unknown_failures_have_no_cause(text):
    assert classify(text) is None
