"""The hosts harness (tests/integration/hosts.py): what the multi-node tests across namespaces rely on.

Each host is its own network stack: a server on one host is reached at that host's address from
another, not at a loopback address; a port busy on one host is free on the others; a partitioned
host reaches nobody until healed. Commands run in a host keep their pid (the leftover-process
fixture sees them) and teardown leaves no namespace behind.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest as top
from tests.integration import hosts
from tests.integration.hosts import network  # noqa: F401  (the fixture)

# Prints "ok" or the error's name for a connection to ADDR:PORT within 2 s.
CLIENT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("ok")
except OSError as exc:
    print(type(exc).__name__)
"""
PORT = 29400


def connect(host: hosts.Host, address: str, port: int = PORT) -> str:
    return subprocess.run(host.command([sys.executable, "-c", CLIENT, address, str(port)]), capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()


@pytest.fixture
def server(network, tmp_path):  # noqa: F811
    """A listener on host 0, port PORT, on every address of that host."""
    proc = network.hosts[0].listen(PORT, tmp_path / "listening")
    try:
        assert proc.poll() is None
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_hosts_reach_each_other_only_at_their_own_addresses(network, server, tmp_path):  # noqa: F811
    """Host 1 reaches host 0's server at 10.213.0.2, not at 127.0.0.1 (its own loopback), and the
    port that host 0 uses is free on host 1: what one machine's loopback cannot show."""
    one = network.hosts[1]
    assert connect(one, network.hosts[0].address) == "ok"
    assert connect(one, "127.0.0.1") == "ConnectionRefusedError"
    assert connect(network.hosts[0], "127.0.0.1") == "ok"
    listener = one.listen(PORT, tmp_path / "listening-1")
    try:
        assert listener.poll() is None  # bound: the port is busy on host 0 only
    finally:
        listener.kill()
        listener.wait()


def test_a_partitioned_host_reaches_nobody_until_healed(network, server):  # noqa: F811
    two = network.hosts[2]
    assert connect(two, network.hosts[0].address) == "ok"
    two.partition()
    assert connect(two, network.hosts[0].address) != "ok"
    assert connect(network.hosts[1], network.hosts[0].address) == "ok"  # the others are not cut off
    two.heal()
    hosts.wait_for(lambda: connect(two, network.hosts[0].address) == "ok", 30, "host 2 healed")


def test_a_command_in_a_host_keeps_its_pid_and_is_seen_as_a_child(network):  # noqa: F811
    """``ip netns exec`` execs: the pid is the command's, a descendant of pytest, so the autouse
    fixture against leftover processes sees (and would report) whatever a host runs."""
    proc = network.hosts[0].popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        seen = hosts.wait_for(lambda: {pid: p for (pid, _), p in top._descendants().items() if pid == proc.pid
                                       and p.cmdline()[:1] == [sys.executable]}, 30, "the command's exec")
        assert list(seen) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_teardown_deletes_every_namespace_even_with_a_process_inside(tmp_path):
    made = hosts.network_or_skip(2)
    names = made.names()
    assert len(names) == 3 and made.switch in names
    proc = made.hosts[1].popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        made.close()
        assert made.names() == []
    finally:
        made.close()
        proc.kill()
        proc.wait()


def test_a_machine_without_namespaces_skips_unless_they_are_required(monkeypatch):
    monkeypatch.setattr(hosts, "unavailable", lambda: "network namespaces need root")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(hosts.REQUIRED, raising=False)
    with pytest.raises(pytest.skip.Exception, match="need root"):
        hosts.network_or_skip(1)
    monkeypatch.setenv(hosts.REQUIRED, "required")
    with pytest.raises(pytest.fail.Exception, match="need root"):
        hosts.network_or_skip(1)


def test_ci_requires_the_tests_across_hosts():
    """.ci/run must not let them skip silently."""
    script = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert f"export {hosts.REQUIRED}=required" in script


def test_namespaces_of_a_killed_run_are_removed_and_a_live_runs_kept(network):  # noqa: F811
    """A run killed before its teardown leaves its namespaces; the next run deletes them (their
    maker's pid is gone), never those of a run still alive (here: this one's)."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # its pid is free now
    pidns = hosts._owner().split("-")[0]
    stale = f"{hosts.PREFIX}-{pidns}-{gone.pid}-0dead0-h0"
    subprocess.run([hosts.IP, "netns", "add", stale], check=True)
    try:
        second = hosts.Network(1)
        second.close()
        listed = subprocess.run([hosts.IP, "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert stale not in listed and network.switch in listed
    finally:
        subprocess.run([hosts.IP, "netns", "del", stale], capture_output=True)
