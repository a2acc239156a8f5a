"""The launcher as PID 1 of a container (a new PID namespace): it reaps every orphan and still
honours SIGTERM, which a PID 1 without handlers would ignore (legacy defect 5)."""

import os
import shutil
import signal
import time

import psutil
import pytest

from tests.helpers.launch import Launcher

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a PID namespace")


def start_as_pid1(tmp_path, worker_args):
    """The launcher under ``unshare``; (the unshare process, the launcher inside the namespace)."""
    job = Launcher(tmp_path, merge_output=True, wrap=lambda argv: ["unshare", "--fork", "--pid", "--mount-proc", *argv])
    job.start(["--nproc-per-node", "2"], worker_args)
    job.wait_ready(2)
    launcher = psutil.Process(job.pid).children()[0]  # unshare forked it into the namespace
    return job, launcher


def test_pid1_launcher_reaps_orphans_and_handles_sigterm(tmp_path):
    job, launcher = start_as_pid1(tmp_path, ["--orphan", "--term-delay", "0.1"])
    with open(f"/proc/{launcher.pid}/status") as fh:
        nspid = [line.split()[-1] for line in fh if line.startswith("NSpid:")]
    assert nspid == ["1"]  # really PID 1 inside its namespace
    time.sleep(0.6)  # the double-forked grandchildren have exited and were re-parented to PID 1
    assert [c.pid for c in launcher.children() if c.status() == psutil.STATUS_ZOMBIE] == []
    launcher.send_signal(signal.SIGTERM)  # the kubelet's SIGTERM to PID 1
    assert job.wait(20) == 143
    assert len(job.ready_lines(".term")) == 2  # forwarded as the gasp
