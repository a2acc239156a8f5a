"""The barrier before the first generation of an elastic job (``--nnodes MIN:MAX``, ``--coordinator``).

torchrun's rendezvous (``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``) completes at
once when ``MAX`` nodes joined; when the count of joined nodes reaches ``MIN`` it sets a deadline
``last_call_timeout`` ahead (not moved by later joins) and completes with whoever joined by then.
The same here, with ``--elastic-wait`` as the last call (the wait for more nodes before going on
with fewer, as after a loss). The nodes agree through ``gen_0/start.json``: the first proposal wins
(etcd's create-if-absent), every node takes that list, and a launcher that joined too late for it
joins the running job at the next generation, as one started later does.
"""

import logging
from typing import Callable, Collection, List, NoReturn, Optional, Tuple

from launcher.cluster.sync import Coordinator
from launcher.cluster.syncdir import JOIN_NOTE, START, STOPPED
from launcher.common.errors import LauncherError
from launcher.supervision.policy import Wait

log = logging.getLogger(__name__)


def elastic_start(sync: Coordinator, joined: Callable[[], Collection[int]], wait: Wait) -> Optional[Tuple[int, ...]]:
    """Wait for the servers of generation 0: every one of the table, or at least ``MIN`` and then
    ``--elastic-wait`` seconds more. Sets ``sync.members`` when this server is one of them.

    Args:
        sync: This node's coordinator (its ``elastic`` is set).
        joined: ``() -> servers`` that have joined the incarnation so far.
        wait: ``wait(seconds) -> bool`` runs the event loop; False on a stop signal.

    Returns:
        The agreed servers (this one may be missing from them: it came too late, see
        :func:`announce_join`), or None when a stop signal ended the wait.

    Raises:
        LauncherError: fewer than ``MIN`` servers joined within ``--sync-timeout``.
    """
    files, elastic, started = sync.files, sync.elastic, sync.clock()
    last_call: Optional[float] = None
    proposed = False
    while True:
        record = files.read(0).start
        if record is not None:
            return _agreed(sync, tuple(int(i) for i in record.get("servers", ())))
        now, present = sync.clock(), sorted(joined())
        if last_call is None and len(present) >= elastic.min_nodes:
            last_call = _last_call(sync, present, now)
        if not proposed and (len(present) == files.count or (last_call is not None and now >= last_call)):
            files.write(0, f"{START}.json", {"servers": present}, exclusive=True)  # the first proposal wins
            proposed = True
        if now - started >= sync.timeout:
            _timed_out(sync, present)
        if not wait(sync.interval):
            return None


def _last_call(sync: Coordinator, present: List[int], now: float) -> float:
    """``MIN`` servers joined at ``now``: when generation 0 starts without the others."""
    count, elastic = sync.files.count, sync.elastic
    if len(present) < count:
        sync.emit("sync_last_call", joined=present, min_nodes=elastic.min_nodes, wait=elastic.wait)
        log.info("%d of %d servers joined (--nnodes needs %d): starting within %.0f s, with more if they "
                 "join (--elastic-wait)", len(present), count, elastic.min_nodes, elastic.wait)
    return now + elastic.wait


def _timed_out(sync: Coordinator, present: List[int]) -> NoReturn:
    missing = ", ".join(sync.files.name(i) for i in range(sync.files.count) if i not in present)
    what = f"{missing} did not join" if len(present) < sync.elastic.min_nodes else "no start agreed"
    raise LauncherError(f"--sync-timeout: {what} within {sync.timeout:.0f} s "
                        f"(--nnodes needs at least {sync.elastic.min_nodes} servers)")


def _agreed(sync: Coordinator, servers: Tuple[int, ...]) -> Tuple[int, ...]:
    if sync.files.index in servers and servers != sync.members:
        sync.emit("sync_membership", generation=0, servers=list(servers), previous=list(sync.members))
        log.warning("generation 0 starts on %d of %d servers (--nnodes MIN:MAX): %s", len(servers),
                    sync.files.count, ", ".join(sync.files.name(i) for i in servers))
        sync.members = servers
    return servers


def announce_join(sync: Coordinator) -> None:
    """This server joined after generation 0 was decided without it: tell the running servers, as a
    launcher started later does in its join transaction (``EtcdStore._join_running``)."""
    index = sync.files.index
    log.warning("generation 0 was decided without this server: joining the running job")
    sync.files.write(0, f"failed.{index}.json", JOIN_NOTE)
    sync.files.write(0, f"{STOPPED}.{index}", {})
