"""Hosts for multi-node tests: network namespaces joined by a bridge, so that launchers really talk
across network stacks (a stale address does not reach a store, a port busy on one host is free on
another, a host's link can go down).

Layout of one :class:`Network` (names unique per test run, so parallel runs do not meet)::

    switch namespace  <prefix>-sw : bridge "br0" 10.213.0.1/24, one veth end per host ("h<i>")
    host namespace    <prefix>-h<i>: loopback, and "eth0" 10.213.0.<i+2>/24, the other end

Nothing is added to the root namespace (no address, no route, no link), so two runs with the same
subnet cannot clash and nothing outlives :meth:`Network.close` there. A command runs in a host
through ``ip netns exec``, which execs it: the ``Popen``'s pid is the command's own, a child of
pytest, so the autouse leftover-process fixture (tests/conftest.py) sees it and its children.
Processes still alive at :meth:`Network.close` keep their (now anonymous) namespace until they die;
the links go with the switch namespace at once.

The machine must let us make namespaces (root, ``ip`` from iproute2); otherwise the ``network``
fixture skips, unless ``NETNS_TESTS=required`` (``.ci/run`` exports it) or ``$CI`` (set by CI
systems) is set: there the skip becomes a failure, so CI cannot pass without running them.
"""

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from tests.integration.etcd_server import ETCD_TIMEOUT, EtcdServer, etcd_binary

IP = shutil.which("ip") or "/usr/sbin/ip"
SUBNET = "10.213.0"
#: The host-side interface name: the same in every host, hence one ``GLOO_SOCKET_IFNAME``.
IFNAME = "eth0"
#: Namespace names start with this, then the pid namespace and pytest's pid: stale ones of a dead
#: run of this pid namespace are removed (another container's runs, whose pids we cannot see, are not).
PREFIX = "xdlt"
#: ``NETNS_TESTS=required``: a machine that cannot make hosts fails these tests instead of skipping.
REQUIRED = "NETNS_TESTS"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> Optional[str]:
    """Why this machine cannot make hosts (None when it can): not root, no ``ip``, no namespaces."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.access(IP, os.X_OK):
        return f"no iproute2 ({IP})"
    probe = f"{PREFIX}-{_owner()}-probe{secrets.token_hex(2)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _owner() -> str:
    """``<pid namespace inode>-<pid>``: who made a namespace, as this process can check it later."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


def _remove_stale() -> None:
    """Delete namespaces left by an earlier run (of this pid namespace) killed before its teardown."""
    pidns = _owner().split("-")[0]
    for line in _ip("netns", "list").stdout.splitlines():
        parts = (line.split() or [""])[0].split("-")
        if len(parts) > 3 and parts[:2] == [PREFIX, pidns] and parts[2].isdigit() \
                and not os.path.exists(f"/proc/{parts[2]}"):
            _ip("netns", "del", "-".join(parts), check=False)


class Host:
    """One host: a network namespace with ``address`` on ``eth0`` and loopback up.

    Args:
        network: The network it is on.
        index: Its number (address ``10.213.0.<index + 2>``).
    """

    def __init__(self, network: "Network", index: int):
        self.network, self.index = network, index
        self.netns = f"{network.prefix}-h{index}"
        self.address = f"{SUBNET}.{index + 2}"
        self.link = f"h{index}"  # its veth end in the switch namespace

    def command(self, argv: Sequence[str]) -> List[str]:
        """``argv`` run in this host (``ip netns exec`` execs it: same pid)."""
        return [IP, "netns", "exec", self.netns, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in this host."""
        return subprocess.Popen(self.command(argv), **kwargs)

    def listen(self, port: int, ready: Path) -> subprocess.Popen:
        """A process that holds ``port`` on every address of this host (and accepts connections);
        returns once it listens (``ready`` written) or died."""
        proc = self.popen([sys.executable, "-c", _LISTENER, str(port), str(ready)])
        wait_for(lambda: ready.exists() or proc.poll() is not None, 30, f"a listener on {self.address}:{port}")
        return proc

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` (default ``os.environ``) plus this host's identity for the launcher and gloo."""
        return {**(os.environ if base is None else base), "XDL_IP": self.address, "POD_IP": self.address,
                "GLOO_SOCKET_IFNAME": IFNAME}

    def partition(self) -> None:
        """Cut this host off the network (its switch port down: its ``eth0`` loses carrier)."""
        _ip("-n", self.network.switch, "link", "set", self.link, "down")

    def heal(self) -> None:
        """Connect it again."""
        _ip("-n", self.network.switch, "link", "set", self.link, "up")


class Network:
    """A private subnet of ``count`` hosts; :meth:`close` removes every namespace and link it made.

    Args:
        count: How many hosts.
    """

    def __init__(self, count: int):
        _remove_stale()
        self.prefix = f"{PREFIX}-{_owner()}-{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-sw"
        self.address = f"{SUBNET}.1"  # the bridge's: where the switch namespace's servers listen
        self.hosts: List[Host] = []
        self._made: List[str] = []
        try:
            self._add_switch()
            for index in range(count):
                self._add_host(Host(self, index))
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _add_switch(self) -> None:
        self._netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "addr", "add", f"{self.address}/24", "dev", "br0")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def _add_host(self, host: Host) -> None:
        self._netns(host.netns)
        _ip("-n", self.switch, "link", "add", host.link, "type", "veth", "peer", "name", IFNAME, "netns", host.netns)
        _ip("-n", self.switch, "link", "set", host.link, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", IFNAME)
        _ip("-n", host.netns, "link", "set", IFNAME, "up")
        self.hosts.append(host)

    def command(self, argv: Sequence[str]) -> List[str]:
        """``argv`` run in the switch namespace (listening on the bridge address)."""
        return [IP, "netns", "exec", self.switch, *argv]

    def close(self) -> None:
        """Delete the links, the bridge and every namespace made (whatever is still running)."""
        if self.switch in self._made:
            for link in [host.link for host in self.hosts] + ["br0"]:
                _ip("-n", self.switch, "link", "del", link, check=False)
        for name in reversed(self._made):
            _ip("netns", "del", name, check=False)
        self._made.clear()

    def names(self) -> List[str]:
        """The namespaces of this network that exist now (for the teardown test)."""
        listed = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.split()}
        return sorted(name for name in listed if name.startswith(self.prefix))


_LISTENER = """
import socket, sys
sock = socket.socket()
sock.bind(("0.0.0.0", int(sys.argv[1])))
sock.listen()
open(sys.argv[2], "w").close()
while True:
    sock.accept()[0].close()
"""
_PROBE = """
import json, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        request = urllib.request.Request(sys.argv[1] + "/v3/kv/range", json.dumps({"key": "AA=="}).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=1).read()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise SystemExit(1)
        time.sleep(0.05)
"""


class NetnsEtcd(EtcdServer):
    """One etcd member in the switch namespace, on the bridge address (every host reaches it).

    A fresh namespace has every port free, so it takes etcd's own 2379 and 2380.
    """

    def __init__(self, data_dir: Path, network: Network):
        super().__init__(data_dir)
        self.network, self.port, self.peer_port = network, 2379, 2380

    @property
    def url(self) -> str:
        """``etcd://10.213.0.1:2379``, for ``--coordinator``."""
        return f"etcd://{self.network.address}:{self.port}"

    def start(self) -> "NetnsEtcd":
        """Start etcd in the switch namespace; wait until it answers (probed from inside)."""
        client = f"http://{self.network.address}:{self.port}"
        peer = f"http://{self.network.address}:{self.peer_port}"
        with open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab") as log:
            self.proc = subprocess.Popen(self.network.command(
                [etcd_binary(), "--name", "default", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"default={peer}"]), stdout=log, stderr=log)
        probe = subprocess.run(self.network.command([sys.executable, "-c", _PROBE, client, str(ETCD_TIMEOUT)]))
        if probe.returncode or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("etcd did not start in the switch namespace")
        return self


def network_or_skip(count: int) -> Network:
    """A :class:`Network`, or skip the test saying why the machine cannot make one (fail when required)."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get(REQUIRED) == "required" or os.environ.get("CI"):
            pytest.fail(f"{REQUIRED}=required or CI is set, and the tests across hosts cannot run: {reason}")
        pytest.skip(f"tests across hosts (network namespaces) cannot run here: {reason}")
    return Network(count)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.02):
    """Poll ``predicate`` until it returns something true (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def network():
    """Three hosts on one private subnet (import this fixture into the test module)."""
    made = network_or_skip(3)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def netns_etcd(tmp_path, network):
    """A real etcd in the switch namespace, on the bridge address."""
    server = NetnsEtcd(tmp_path / "etcd", network).start()
    try:
        yield server
    finally:
        server.stop()
