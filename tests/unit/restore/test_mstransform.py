"""MindSpore checkpoint conversion: the cache key, the atomic cache, failures, a kill mid-conversion."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from launcher.common import signals
from launcher.common.errors import LauncherError
from launcher.restore.mstransform import CONVERTED_DIR, convert, is_cached, plan_job

from tests.helpers.procs import wait_until
from tests.helpers.paths import REPO

FAKE = REPO / "tests" / "workers" / "fake_transform.py"


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """An 'interpreter' that runs tests/workers/fake_transform.py instead of MindSpore."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    path.chmod(0o755)
    monkeypatch.setenv("FAKE_TRANSFORM_LOG", str(tmp_path / "runs.log"))
    return str(path)


@pytest.fixture
def step(tmp_path):
    """A step written by 2 ranks, with source and destination strategy files."""
    ckpt = tmp_path / "ckpt"
    sources = []
    for rank in range(2):
        (ckpt / f"rank_{rank}").mkdir(parents=True)
        path = ckpt / f"rank_{rank}" / "ms-1_10.ckpt"
        path.write_bytes(b"shard %d" % rank)
        sources.append((rank, str(path)))
    (tmp_path / "src.ckpt").write_bytes(b"src strategy")
    (tmp_path / "dst.ckpt").write_bytes(b"dst strategy")
    return ckpt, sources, str(tmp_path / "src.ckpt"), str(tmp_path / "dst.ckpt")


def runs(tmp_path):
    log = tmp_path / "runs.log"
    return log.read_text().split() if log.exists() else []


def test_key_depends_on_every_input(step, tmp_path):
    ckpt, sources, src, dst = step
    job = plan_job(str(ckpt), sources, src, dst, 4)
    assert job.output.startswith(str(ckpt / CONVERTED_DIR) + os.sep)
    assert job.file_for(3) == os.path.join(job.output, "rank_3", "ms-1_10.ckpt")
    assert plan_job(str(ckpt), list(reversed(sources)), src, dst, 4) == job  # order does not matter
    assert plan_job(str(ckpt), sources, src, dst, 3).output != job.output
    assert plan_job(str(ckpt), sources, dst, src, 4).output != job.output
    Path(dst).write_bytes(b"another dst strategy")
    assert plan_job(str(ckpt), sources, src, dst, 4).output != job.output
    before = plan_job(str(ckpt), sources, src, dst, 4).output
    Path(sources[1][1]).write_bytes(b"shard 1, saved again")
    assert plan_job(str(ckpt), sources, src, dst, 4).output != before


def test_convert_once_then_cached(step, fake_python, tmp_path):
    ckpt, sources, src, dst = step
    job = plan_job(str(ckpt), sources, src, dst, 3)
    assert not is_cached(job)
    assert convert(job, fake_python) is True
    assert is_cached(job)
    assert Path(job.file_for(2)).read_text() == "converted 2 from ['0', '1']"
    assert convert(job, fake_python) is False
    assert runs(tmp_path) == ["ok"]
    assert sorted(os.listdir(ckpt / CONVERTED_DIR)) == [os.path.basename(job.output)]  # no temp left


def test_failure_raises_with_the_cause_and_leaves_nothing(step, fake_python, tmp_path, monkeypatch):
    ckpt, sources, src, dst = step
    monkeypatch.setenv("FAKE_TRANSFORM_MODE", "fail")
    job = plan_job(str(ckpt), sources, src, dst, 2)
    with pytest.raises(LauncherError, match="exit 3.*strategy files do not match"):
        convert(job, fake_python)
    assert not is_cached(job) and os.listdir(ckpt / CONVERTED_DIR) == []


def test_missing_interpreter_is_a_launcher_error(step):
    ckpt, sources, src, dst = step
    with pytest.raises(LauncherError, match="cannot run"):
        convert(plan_job(str(ckpt), sources, src, dst, 2), "/nonexistent/python")


def test_killed_mid_conversion_is_never_loaded(step, fake_python, tmp_path):
    """The launcher is SIGKILLed while the interpreter has written one rank's file: the interpreter
    dies with it (parent-death signal), nothing counts as converted; the next conversion removes the
    leftover and publishes a complete result."""
    ckpt, sources, src, dst = step
    ready = tmp_path / "ready"
    code = ("import sys; from launcher.restore.mstransform import convert, plan_job; "
            f"convert(plan_job({str(ckpt)!r}, {sources!r}, {src!r}, {dst!r}, 3), {fake_python!r})")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_TRANSFORM_MODE": "partial",
           "FAKE_TRANSFORM_READY": str(ready)}
    launcher = subprocess.Popen([sys.executable, "-c", code], env=env)
    interpreter = None
    try:
        assert wait_until(ready.exists, timeout=60), "the conversion never started"
        interpreter = int(ready.read_text())
        launcher.kill()
        assert wait_until(lambda: not _running(interpreter), timeout=30), "the conversion outlived the launcher"
    finally:
        launcher.kill()
        launcher.wait()
        if interpreter is not None and _running(interpreter):
            os.kill(interpreter, signal.SIGKILL)
    job = plan_job(str(ckpt), sources, src, dst, 3)
    assert not is_cached(job) and not os.path.exists(job.output)
    leftovers = os.listdir(ckpt / CONVERTED_DIR)
    assert len(leftovers) == 1 and leftovers[0].startswith("." + os.path.basename(job.output) + ".tmp-")
    assert convert(job, fake_python) is True
    assert is_cached(job) and os.listdir(ckpt / CONVERTED_DIR) == [os.path.basename(job.output)]


def test_stop_signal_interrupts_the_conversion(step, fake_python, tmp_path, monkeypatch):
    """SIGTERM (the kubelet's) while a conversion runs stops it at once, not when it ends."""
    ckpt, sources, src, dst = step
    ready = tmp_path / "ready"
    monkeypatch.setenv("FAKE_TRANSFORM_MODE", "partial")
    monkeypatch.setenv("FAKE_TRANSFORM_READY", str(ready))
    job = plan_job(str(ckpt), sources, src, dst, 3)

    def terminate_when_started():
        if wait_until(ready.exists, timeout=60):
            os.kill(os.getpid(), signal.SIGTERM)

    signals.install()
    sender = threading.Thread(target=terminate_when_started)
    sender.start()
    try:
        with pytest.raises(LauncherError, match="interrupted by a stop signal"):
            convert(job, fake_python, timeout=600)
    finally:
        sender.join()
        signals.uninstall()
    assert not _running(int(ready.read_text()))
    assert not is_cached(job)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
