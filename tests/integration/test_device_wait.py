"""Before the ranks start: waiting for a device another process holds, and the node's health check,
with real processes (a stand-in device file held open by a process of "another job", a stand-in
``npu-smi`` on PATH printing the real tool's layout, a failing health-check script)."""

import os
import subprocess
import sys
import time

import pytest

from tests.unit.run.test_devicewait import NPU_SMI_BUSY


def named(events, name):
    return [e for e in events if e["event"] == name]


def wait_for_event(launcher, name, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (launcher.run_dir / "events.jsonl").exists():
            found = named(launcher.events(), name)
            if found:
                return found[0]
        assert launcher.proc.poll() is None, launcher.stderr
        time.sleep(0.05)
    raise AssertionError(f"no {name} event; stderr:\n{launcher.stderr}")


@pytest.fixture
def devices(tmp_path, monkeypatch):
    """A stand-in /dev with davinci0 and davinci1, which the launcher is pointed at."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in range(2):
        (dev / f"davinci{n}").write_text("")
    monkeypatch.setenv("LAUNCHER_DEV_DIR", str(dev))
    return dev


def test_a_rank_starts_only_once_another_jobs_process_released_its_device(launcher, devices):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(120)",
                               str(devices / "davinci1")], start_new_session=True)
    try:
        launcher.start(["--nproc-per-node", "2", "--device-wait-timeout", "60"], ["--run", "0.2"])
        wait = wait_for_event(launcher, "device_wait")
        assert wait["devices"] == [1] and wait["holders"]["1"][0].startswith(f"pid {holder.pid} (")
        assert not launcher.ready_lines()  # no rank started while the device was held
    finally:
        holder.kill()
        holder.wait()
    assert launcher.wait(60) == 0, launcher.stderr
    events = launcher.events()
    [end] = named(events, "device_wait_end")
    assert end["free"] is True
    assert events.index(end) < events.index(named(events, "attempt_start")[0])
    assert "waiting for device(s) 1, still held by another process (1: pid" in launcher.stderr
    assert "device_wait" in launcher.stdout + launcher.stderr  # the goodput line names the phase


def test_npu_smi_listing_a_process_holds_the_start_until_the_timeout(launcher, devices, tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    listing = tmp_path / "npu-smi.txt"
    listing.write_text(NPU_SMI_BUSY)
    (tools / "npu-smi").write_text(f"#!/bin/sh\ncat {listing}\n")
    (tools / "npu-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    code = launcher.run(["--nproc-per-node", "2", "--device-wait-timeout", "1"], ["--run", "0.1"])
    assert code == 0, launcher.stderr
    [wait] = named(launcher.events(), "device_wait")
    assert wait["holders"] == {"0": ["pid 124528 (npu-smi)", "pid 124529 (npu-smi)"]}
    [end] = named(launcher.events(), "device_wait_end")
    assert end["free"] is False and end["seconds"] >= 1
    assert "device(s) 0 still held after 1 s: starting the ranks anyway" in launcher.stderr


def test_a_failing_health_check_ends_the_node_with_the_node_fault_code(launcher, tmp_path):
    seen = tmp_path / "devices.txt"
    check = f"echo $LAUNCHER_DEVICES > {seen}; echo 'HBM ECC errors on NPU 1' >&2; exit 3"
    code = launcher.run(["--nproc-per-node", "2", "--health-check", check, "--node-fault-exit-code", "99"],
                        ["--run", "0.1"])
    assert code == 99
    assert seen.read_text().strip() == "0,1"
    assert not launcher.ready_lines()
    [failed] = named(launcher.events(), "health_check_failed")
    assert failed["reason"] == "exit code 3: HBM ECC errors on NPU 1"
    assert "the node's health check failed before attempt 0 (exit code 3: HBM ECC errors on NPU 1)" in launcher.stderr


def test_a_passing_health_check_runs_before_every_attempt(launcher, tmp_path):
    runs = tmp_path / "runs.txt"
    code = launcher.run(["--nproc-per-node", "1", "--max-restarts", "1", "--health-check", f"echo x >> {runs}"],
                        ["--fail-rank", "0", "--exit-code", "5", "--run", "0.1"])
    assert code == 0, launcher.stderr
    assert runs.read_text().splitlines() == ["x", "x"]
