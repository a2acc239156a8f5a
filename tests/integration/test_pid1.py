"""The launcher as PID 1 of a container (a new PID namespace): it reaps every orphan and still
honours SIGTERM, which a PID 1 without handlers would ignore (legacy defect 5)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers.procs import wait_until
from tests.integration.conftest import FAKE_RANK

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a PID namespace")


def start_as_pid1(tmp_path, worker_args):
    ready = tmp_path / "ready"
    argv = ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, "-m", "launcher", "run",
            "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs"),
            "--", sys.executable, FAKE_RANK, "--ready-file", str(ready), *worker_args]
    out = open(tmp_path / "out.txt", "wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    assert wait_until(lambda: ready.exists() and len(ready.read_text().splitlines()) >= 2, 30), \
        (tmp_path / "out.txt").read_text()
    launcher = psutil.Process(proc.pid).children()[0]  # unshare forked it into the namespace
    return proc, launcher


def test_pid1_launcher_reaps_orphans_and_handles_sigterm(tmp_path):
    proc, launcher = start_as_pid1(tmp_path, ["--orphan", "--term-delay", "0.1"])
    try:
        with open(f"/proc/{launcher.pid}/status") as fh:
            nspid = [line.split()[-1] for line in fh if line.startswith("NSpid:")]
        assert nspid == ["1"]  # really PID 1 inside its namespace
        time.sleep(0.6)  # the double-forked grandchildren have exited and were re-parented to PID 1
        assert [c.pid for c in launcher.children() if c.status() == psutil.STATUS_ZOMBIE] == []
        launcher.send_signal(signal.SIGTERM)  # the kubelet's SIGTERM to PID 1
        assert proc.wait(20) == 143
        assert len((tmp_path / "ready.term").read_text().splitlines()) == 2  # forwarded as the gasp
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
