"""One process of the coordination simulator (``bench.simnodes``): many nodes, each the launcher's own
coordination (:class:`launcher.cluster.syncjoin.SyncCoordination` over
:class:`launcher.cluster.etcdstore.EtcdStore` and :class:`launcher.cluster.sync.Coordinator`) with a
stand-in for the supervisor's loop and ranks that cost nothing.

``python -m bench.simworker URL RUN_ID COUNT NODES [--ttl S] [--min-nodes M --elastic-wait S]``:
hosts the nodes ``NODES`` (``a,b,c`` or ``a-b``) of a job of ``COUNT`` servers. Reads commands on
stdin (``go``: join; ``fail I``: node I's rank fails; ``stop``: every node leaves), writes one JSON
line per thing a node did to stdout: ``{"node", "what", "t", ...}`` with ``what`` one of ``ready``
(the process, once imported), ``joining``, ``generation`` (a generation agreed and started:
``gen``), ``failed`` (this node's rank failed), ``told`` (a peer's failure, loss or join reached the
node: ``reason``), ``agreed`` (``settle`` returned: ``exit_code``, ``membership``), ``left``,
``error``.

What stands in for the supervisor: ``attempt_started`` when a generation starts; a failure is
``rank_failed`` then ``settle`` (the local group is gone at once: no rank processes); a
``PeerUpdate`` posted by the coordinator is followed by ``settle``. Timers run on one thread per
process, each callback under its node's lock, as a node's event loop would run it.
"""

from gevent import monkey  # first: every thread below (the nodes' and their stores') is a greenlet

monkey.patch_all()

import argparse  # noqa: E402
import functools  # noqa: E402
import heapq  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

from gevent.fileobject import FileObject  # noqa: E402
from launcher.cluster.syncjoin import SyncCoordination  # noqa: E402
from launcher.jobspec.options import RunOptions  # noqa: E402
from launcher.jobspec.runspec import run_spec  # noqa: E402
from launcher.supervision.policy import Failure, PeerUpdate, RunResult  # noqa: E402
from launcher.supervision.states import ExitInfo  # noqa: E402

_OUT = threading.Lock()


def say(node: int, what: str, **fields) -> None:
    """One JSON line for the controller."""
    line = json.dumps({"node": node, "what": what, "t": time.time(), **fields})
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Timers:
    """One thread that runs every hosted node's ``call_later`` callbacks when they are due."""

    def __init__(self) -> None:
        self._heap: List[tuple] = []
        self._ids = itertools.count(1)
        self._cancelled: set = set()
        self._cond = threading.Condition()
        threading.Thread(target=self._run, name="timers", daemon=True).start()

    def add(self, delay: float, lock: threading.Lock, callback: Callable[[], object]) -> int:
        ident = next(self._ids)
        entry = (time.monotonic() + delay, ident, lock, callback)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:  # due before the one the thread waits for (a node's poll mostly is not)
                self._cond.notify()
        return ident

    def cancel(self, ident: int) -> None:
        with self._cond:
            self._cancelled.add(ident)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, ident, lock, callback = heapq.heappop(self._heap)
                if ident in self._cancelled:
                    self._cancelled.discard(ident)
                    continue
            with lock:
                callback()


class Fail:
    """Command: this node's rank fails."""


class Stop:
    """Command: the job ends well on this node."""


class Group:
    """The parts of the process group the coordination uses: timers, posted events, ``wait_event``.

    The node thread holds ``lock`` while it calls the coordinator; ``wait_event`` lets go of it
    while it waits, so that timers (run under the same lock) interleave as in one event loop.
    """

    def __init__(self, timers: Timers) -> None:
        self.lock = threading.Lock()
        self.events: "queue.Queue[object]" = queue.Queue()
        self._timers = timers

    def call_later(self, delay: float, callback: Callable[[], object]) -> int:
        return self._timers.add(delay, self.lock, callback)

    def cancel(self, ident: int) -> None:
        self._timers.cancel(ident)

    def call_soon_threadsafe(self, callback: Callable[[], object]) -> None:
        """As the event loop's: run ``callback`` under the node's lock at once (a store's watch hands it)."""
        self._timers.add(0.0, self.lock, callback)

    def post(self, event: object) -> None:
        self.events.put(event)

    def wait_event(self, timeout: Optional[float]) -> Optional[object]:
        """The next posted event, or None after ``timeout`` seconds (called with ``lock`` held)."""
        self.lock.release()
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        finally:
            self.lock.acquire()


@functools.lru_cache(maxsize=1)
def _table(count: int) -> SimpleNamespace:
    """The job's rank table (one server, one rank each): read-only, so the nodes of a process share it."""
    return SimpleNamespace(servers=[SimpleNamespace(server_id=f"node{i}", container_ip=None, ranks=(i,))
                                    for i in range(count)])


def _host(index: int, count: int, args: argparse.Namespace, group: Group) -> SimpleNamespace:
    """What ``SyncCoordination.start`` reads of the launcher: the run's spec, topology, events, the group."""
    topo = SimpleNamespace(table=_table(count), server_index=index, table_file=None, master_port=29500)
    # the launcher's own options with their defaults (the coordinator's TLS and user too)
    opts = RunOptions(command=("true",), coordinator=args.url, sync_timeout=args.sync_timeout,
                      min_nodes=args.min_nodes, elastic_wait=args.elastic_wait, coordinator_ttl=args.ttl)
    ctx = SimpleNamespace(run_id=args.run_id, topology=topo, base_env={"POD_IP": "127.0.0.1"})
    return SimpleNamespace(spec=run_spec(opts, {}), ctx=ctx, group=group, emit=lambda name, **fields: None)


def node_main(index: int, args: argparse.Namespace, timers: Timers, groups: Dict[int, Group]) -> None:
    """One node: join, then generations until the job ends on it."""
    group = groups[index]
    sync = group.sync = SyncCoordination()
    with group.lock:
        try:
            say(index, "joining")
            sync.start(_host(index, args.count, args, group))
            _generations(index, sync, group)
        except Exception as exc:  # a node's end, reported; the others go on
            say(index, "error", error=f"{type(exc).__name__}: {exc}")
        finally:
            sync.stop()
            say(index, "left")


def _generations(index: int, sync: SyncCoordination, group: Group) -> None:
    coordinator, generation = sync.coordinator, sync.first_generation

    def wait(seconds: float) -> bool:  # the supervisor's wait: no stop signal comes here
        group.wait_event(seconds)
        return True

    while True:
        say(index, "generation", gen=generation)
        coordinator.attempt_started(generation)
        event = group.wait_event(None)
        if isinstance(event, Stop):
            coordinator.leave(generation, RunResult(0, "succeeded", generation + 1))
            sync.on_event("job_end", {})
            return
        if isinstance(event, Fail):
            failure = Failure(generation, index, f"rank {index} on node{index}", ExitInfo(1, time.time()))
            say(index, "failed", gen=generation)
            coordinator.rank_failed(generation, [index], failure)
            ranks = [index]
        else:
            assert isinstance(event, PeerUpdate), event
            say(index, "told", gen=generation, reason=event.reason, membership=event.membership)
            failure, ranks = event.failure, []
        agreed = coordinator.settle(generation, None, failure, ranks, wait)
        say(index, "agreed", gen=generation, exit_code=agreed.exit_code, membership=agreed.membership)
        if agreed.exit_code is not None:
            coordinator.leave(generation, RunResult(agreed.exit_code, agreed.reason or "failed", generation + 1))
            sync.on_event("job_end", {})
            return
        generation += 1


def _start(threads: List[threading.Thread], spread: float) -> None:
    """Start the nodes at uniformly random moments over ``spread`` seconds, as pods started together do."""
    began = time.monotonic()
    for thread, offset in sorted(zip(threads, (random.uniform(0, spread) for _ in threads)),
                                 key=lambda pair: pair[1]):
        time.sleep(max(0.0, began + offset - time.monotonic()))
        thread.start()


def _nodes(spec: str) -> List[int]:
    if "-" in spec:
        first, last = spec.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(part) for part in spec.split(",")]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simworker")
    parser.add_argument("url")
    parser.add_argument("run_id")
    parser.add_argument("count", type=int)
    parser.add_argument("nodes", type=_nodes)
    parser.add_argument("--ttl", type=int, default=5)
    parser.add_argument("--sync-timeout", type=float, default=120.0)
    parser.add_argument("--min-nodes", type=int, default=None)
    parser.add_argument("--elastic-wait", type=float, default=0.5)
    parser.add_argument("--join-spread", type=float, default=1.0, help="seconds over which the nodes start")
    args = parser.parse_args(argv)
    timers = Timers()
    groups = {index: Group(timers) for index in args.nodes}
    threads = [threading.Thread(target=node_main, args=(i, args, timers, groups), name=f"node{i}", daemon=True)
               for i in args.nodes]
    say(-1, "ready", nodes=len(args.nodes))
    for line in FileObject(sys.stdin.fileno(), "r", close=False):  # read without blocking the other greenlets
        command = line.split()
        if command == ["go"]:
            threading.Thread(target=_start, args=(threads, args.join_spread), daemon=True).start()
        elif command[:1] == ["fail"] and int(command[1]) in groups:
            groups[int(command[1])].post(Fail())
        elif command == ["dump"]:  # where each node is, for debugging the simulator
            for index, group in groups.items():
                files = getattr(getattr(group, "sync", None), "files", None)
                say(index, "dump", leading=getattr(files, "leading", None), not_joined=len(files.not_joined())
                    if files is not None else None, view=len(getattr(files, "_view", (b"",))[0] or b""))
        elif command == ["stop"]:
            for group in groups.values():
                group.post(Stop())
            break
    for thread in threads:
        thread.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
