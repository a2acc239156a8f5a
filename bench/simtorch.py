"""The anchor of the coordination simulator: torchrun's own rendezvous code at N nodes in one process.

Each node is a ``DynamicRendezvousHandler`` with the ``C10dRendezvousBackend`` (torch 2.13,
``--rdzv-backend c10d``) on its own ``TCPStore`` client, the store served by a separate process as
agent 0 would host it, or (``--backend etcd-v2``) with the backend and store torch's
``etcd_rendezvous_backend.create_backend`` makes (python-etcd, etcd's v2 API: an etcd with
``--enable-v2``), one etcd client per node; the agent's loop stands in as
``torch/distributed/elastic/agent/server/api.py``
runs it: every ``--monitor-interval`` (0.1 s) ``num_nodes_waiting()``, and a re-rendezvous when it is
above 0. Measured: start -> every node through its first ``next_rendezvous()``; node N/2 "fails" (its
agent re-enters ``next_rendezvous()``, as after a worker failure) -> every node told (saw a node
waiting) and agreed (through the next round); and the store process's CPU time.

``python -m bench.simtorch [--sizes 10,100] [--backend c10d|etcd-v2]`` (results merged into
``bench/results/simtorch.json``; etcd-v2 ones under ``etcd-v2:N``).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Optional

from bench import common, simetcd

MONITOR_INTERVAL = 0.1  # torchrun's --monitor-interval default
TIMEOUT = 300.0


def _rendezvous(backend: str, count: int, port: int):
    """``(store, backend)`` of one agent, as torchrun builds them for ``--rdzv-backend``."""
    if backend == "etcd-v2":  # torch's own factory: python-etcd, etcd's v2 API
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend

        rdzv, store = create_backend(RendezvousParameters("etcd-v2", f"127.0.0.1:{port}", "sim", count, count))
        return store, rdzv
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=TIMEOUT))
    return store, C10dRendezvousBackend(store, "sim")


def _node(index: int, count: int, backend: str, port: int, events: List[tuple], fail: threading.Event,
          stop: threading.Event, lock: threading.Lock) -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

    def say(what: str, **fields) -> None:
        with lock:
            events.append((index, what, time.time(), fields))

    store, rdzv = _rendezvous(backend, count, port)
    handler = DynamicRendezvousHandler.from_backend(
        "sim", store, rdzv, count, count,
        timeout=RendezvousTimeout(join=timedelta(seconds=TIMEOUT), last_call=timedelta(seconds=1)))
    generation = 0
    handler.next_rendezvous()
    say("generation", gen=generation)
    while not stop.wait(MONITOR_INTERVAL):
        if fail.is_set() and index == count // 2:
            fail.clear()
            say("failed", gen=generation)
        elif handler.num_nodes_waiting() > 0:
            say("told", gen=generation)
        else:
            continue
        handler.next_rendezvous()
        say("agreed", gen=generation)
        generation += 1
        say("generation", gen=generation)
    handler.shutdown()


class _Server:
    """What the agents rendezvous on: agent 0's TCPStore (c10d: a process as agent 0 hosts it) or an
    etcd serving the v2 API (etcd-v2: ``--enable-v2``, data on tmpfs), with its pid for the CPU time."""

    def __init__(self, backend: str):
        self.backend, self.etcd, self.holder = backend, None, None
        if backend == "etcd-v2":
            from tests.integration.etcd_server import EtcdServer

            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.holder = tempfile.mkdtemp(prefix="simtorch-etcd-", dir=shm)
            self.etcd = EtcdServer(Path(self.holder) / "etcd", v2=True).start()
            self.port, self.pid = self.etcd.port, self.etcd.proc.pid
            return
        self.port = common.free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from datetime import timedelta; "
                                      "from torch.distributed import TCPStore; "
                                      f"s = TCPStore('127.0.0.1', {self.port}, is_master=True, wait_for_workers=False, "
                                      f"timeout=timedelta(seconds={TIMEOUT})); print('up', flush=True); "
                                      "sys.stdin.read()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.proc.stdout.readline()
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()
            shutil.rmtree(self.holder, ignore_errors=True)
            return
        self.proc.stdin.close()
        self.proc.wait(10)


def measure(count: int, backend: str = "c10d") -> dict:
    """One job of ``count`` nodes: start, one failure."""
    server = _Server(backend)
    port = server.port
    events: List[tuple] = []
    lock, fail, stop = threading.Lock(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=_node, args=(i, count, backend, port, events, fail, stop, lock), daemon=True)
               for i in range(count)]
    out: dict = {}
    try:
        cpu, start = simetcd.cpu_seconds(server.pid), time.time()
        for thread in threads:
            thread.start()
        out["join_s"] = _until(events, lambda e: _nodes(e, "generation", 0) >= count, start)
        out["join_store_cpu_s"] = round(simetcd.cpu_seconds(server.pid) - cpu, 3)
        time.sleep(1.0)
        cpu, failed = simetcd.cpu_seconds(server.pid), time.time()
        fail.set()
        out["failure_told_s"] = _until(events, lambda e: _nodes(e, "told", 0) >= count - 1, failed)
        out["failure_agreed_s"] = _until(events, lambda e: _nodes(e, "generation", 1) >= count, failed)
        out["generation_store_cpu_s"] = round(simetcd.cpu_seconds(server.pid) - cpu, 3)
        cpu = simetcd.cpu_seconds(server.pid)
        time.sleep(3.0)
        out["idle_store_cpu_pct"] = round((simetcd.cpu_seconds(server.pid) - cpu) / 3.0 * 100, 1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        server.stop()
    return out


def _nodes(events: List[tuple], what: str, gen: int) -> int:
    return len({i for i, w, _, f in list(events) if w == what and f.get("gen") == gen})


def _until(events: List[tuple], done, since: float) -> Optional[float]:
    deadline = time.monotonic() + TIMEOUT
    while not done(events):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return max(t for _, _, t, _ in list(events)) - since


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simtorch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100")
    parser.add_argument("--backend", default="c10d", choices=("c10d", "etcd-v2"), help="torchrun's --rdzv-backend")
    parser.add_argument("--json", default=os.path.join(common.REPO, "bench", "results", "simtorch.json"))
    args = parser.parse_args(argv)
    results: Dict[str, dict] = json.load(open(args.json)) if os.path.exists(args.json) else {}
    for count in (int(n) for n in args.sizes.split(",")):
        common.progress(f"simtorch {args.backend} N={count}")
        key = str(count) if args.backend == "c10d" else f"{args.backend}:{count}"
        results[key] = {**measure(count, args.backend), "loadavg": os.getloadavg()[0]}
        common.progress(json.dumps(results[key]))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
