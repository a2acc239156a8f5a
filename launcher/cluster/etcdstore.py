"""The records of coordinated restarts in etcd (``--coordinator etcd://...``), with leased membership.

The same records as ``--sync-dir``'s files (:mod:`launcher.cluster.syncdir`), as keys under
``/launcher/<run-id>/inc_<k>/``, plus one that the files cannot have::

    join.<i>                  server i joined this incarnation (created in one transaction with member.<i>),
                              with the address it gives for the master (``address``, elastic regroups)
    member.<i>                attached to server i's lease: gone within the TTL once its launcher is
    closed                    a launcher of this incarnation ended: a new start does not join it
    reset.<n>                 etcd lost its data and a launcher put the records back (launcher.cluster.etcdreset)
    gen_<g>/...               failed.<i>.json, stopped.<i>, done.<i>, abort (created only if absent)

    view, view.leader         the leader's summary of every other record, and who the leader is
                              (launcher.cluster.etcdview: the others follow only these two keys)

A server that joined, whose ``member.<i>`` is gone and that did not finish the generation is
**lost** (``Generation.lost``). Nothing here blocks the supervisor's loop: three daemon threads keep
the lease alive, follow the keys (a watch whose events update an in-memory snapshot that
:meth:`EtcdStore.read` parses; read again in full when the watch is opened, at least every
``WATCH_IDLE`` to 1.5 times that: the leader every key, a follower the view), and write the records queued by
:meth:`EtcdStore.write` in order (the leader's view too), retrying while etcd is away. A lease that etcd
no longer knows means that etcd lost its data (every launcher puts its records back and the job goes
on) or that this server's lease expired (the others count it as lost: it leaves without rejoining);
:mod:`launcher.cluster.etcdreset` tells which.
"""

import dataclasses
import itertools
import json
import logging
import queue
import random
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import tenacity

from launcher.cluster import etcdview
from launcher.cluster.etcdclient import EtcdClient, EtcdError
from launcher.cluster.etcdwire import Changes
from launcher.cluster.etcdjoin import MEMBER, Joining, parse as _parse
from launcher.cluster.etcdlease import Leased
from launcher.cluster.etcdreset import Seen, resets
from launcher.cluster.syncdir import CLOSED, Generation, collect, stamp

log = logging.getLogger(__name__)

#: A watch that says nothing for 5-7.5 s (drawn at each opening: the followers' watches, opened by one
#: view, must not all be re-read at once every 5 s) is re-opened after a fresh read (the fallback poll).
WATCH_IDLE = 5.0
MIN_WATCH_ROUND = 0.1  # seconds: a watch that ends sooner is not reopened at once
_Put = Tuple[str, bytes, bool]


class EtcdStore(Joining, Leased, etcdview.Leading):
    """One incarnation of the job in etcd, as seen by server ``index`` (``SyncDir``'s interface).

    Args:
        client: The etcd client.
        prefix: ``/launcher/<run-id>/inc_<k>/``.
        index: This server's index in the rank table.
        names: Every server's name, by index.
        ttl: Lease TTL in seconds: how long a dead launcher stays a member.
        lease: This server's lease (granted by :meth:`join`).
        write_for: Seconds a record is retried before it is given up (logged).
        address: The address this server gives in ``join.<i>`` (None: none).
        emit: ``emit(event_name, **fields)`` for events.jsonl, called from :meth:`read` (the
            supervisor's thread) with what the threads noticed (``coordinator_reset``,
            ``coordinator_lease_expired``).

    Attributes:
        expelled: Why this server's lease expired while etcd kept the job's records (None while it is
            a member): it then reads itself as lost and writes nothing more.
        leading: Whether this server holds ``view.leader``: it follows every key and publishes the
            view (:mod:`launcher.cluster.etcdview`); the others follow the view.
    """

    def __init__(self, client: EtcdClient, prefix: str, index: int, names: Sequence[str], ttl: int, lease: int,
                 write_for: float = 300.0, address: Optional[str] = None,
                 emit: Optional[Callable[..., object]] = None):
        self.client, self.prefix, self.index, self.ttl, self.lease = client, prefix, index, ttl, lease
        self.names = tuple(names)
        self.count = len(self.names)
        tls = getattr(getattr(client, "security", None), "tls", False)
        self.path = f"{'etcds' if tls else 'etcd'}://{client.endpoints[0][0]}:{client.endpoints[0][1]}{prefix}"
        self.write_for = write_for
        self._mine: Dict[str, bytes] = {}  # what this node queued: visible to itself before etcd has it
        self._writes: "queue.Queue[Optional[_Put]]" = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, name=f"etcd-{what}", daemon=True)
                         for what, target in (("lease", self._keep_alive), ("watch", self._follow),
                                              ("write", self._write_queued))]
        self._outage: Optional[str] = None
        #: When the lease was last granted or renewed (asked, monotonic): its TTL runs from there, not
        #: from when the keep-alive thread starts (``join`` sets the grant's moment).
        self._renewed = time.monotonic()
        self.running: Optional[int] = None  # the generation this server joined a running job in
        self.address = address  # where this server hosts the master if it comes to host rank 0
        self.emit = emit
        self.expelled: Optional[str] = None
        self._seen = Seen(0, None, 0)
        self._begun = threading.Event()  # the first read (:meth:`_begin`) set ``_seen``: lost data can be told
        self._lock = threading.Lock()  # one reader of etcd at a time decides about lost data
        self._notices: Deque[Tuple[str, dict]] = deque()  # events the threads noticed, for read()
        self._announced: set = set()  # the resets this server has logged
        self.leading = False
        self._view_keys = etcdview.view_range(prefix)
        self._versions = itertools.count(1)
        self._version = 0  # moves on with every change of what read() looks at (next() is atomic)
        self._cache: Dict[Tuple[int, int], Generation] = {}
        self._view: Tuple[Optional[bytes], dict] = (None, {})  # the published view: raw, decoded
        self._keys: Dict[str, bytes] = {}
        self._not_joined: Tuple[int, List[int]] = (-1, [])
        self.token: Optional[str] = None  # in join.<i>: this launcher's join, not a previous start's
        #: Called (from the store's threads) when what read() looks at changed: the event loop's
        #: cue to look at once (launcher.cluster.syncjoin); None: nobody is told, readers poll.
        self.on_change: Optional[Callable[[], None]] = None

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""
        return f"server {index} ({self.names[index]})" if 0 <= index < self.count else f"server {index}"

    def _begin(self) -> None:
        """The first read after joining: every key for the leader, the view for a follower (with the
        records of a reset, which tell lost data later)."""
        self._campaign()
        if self.leading:
            revision, keys = self.client.range(self.prefix)
        else:
            revision, keys = self.client.range(*self._view_keys)
            keys.update(self.client.range(self.prefix + "reset.")[1])
            keys[f"{self.prefix}join.{self.index}"] = self._joined()
        self._snapshot = keys
        self._seen = Seen(revision, self.client.cluster_id, resets(self.prefix, keys))
        self._begun.set()

    def _record(self, data: dict) -> bytes:
        return json.dumps(stamp(self.index, self.name(self.index), data)).encode()

    # -- the supervisor's side (never blocks) -------------------------------------------------------
    def gen_path(self, generation: int) -> str:
        """Where generation ``generation``'s records are, for messages."""
        return f"{self.path}gen_{generation}/"

    def read(self, generation: int) -> Generation:
        """Generation ``generation`` as of the last snapshot and view, with the servers lost so far
        (this one too once it is ``expelled``); emits what the threads noticed since the last read."""
        while self._notices:
            event, fields = self._notices.popleft()
            if self.emit is not None:
                self.emit(event, **fields)
        key = (generation, self._version)
        state = self._cache.get(key)
        if state is None:
            state = self._cache[key] = self._state(generation)
            if len(self._cache) > 8:
                self._cache.pop(next(iter(self._cache)))
        return dataclasses.replace(state, lost=state.lost | {self.index}) if self.expelled else state

    def _state(self, generation: int) -> Generation:
        """What the snapshot, this node's own records and the view say of ``generation``."""
        snapshot, view = {**self._mine, **self._snapshot}, self._view[1]
        sub = f"{self.prefix}gen_{generation}/"
        records, stopped, done = etcdview.generation(view, generation)
        names = {key[len(sub):] for key in snapshot if key.startswith(sub)} | set(records)
        state = collect(generation, names, lambda name: _parse(snapshot[sub + name], sub + name)
                        if sub + name in snapshot else etcdview.viewed(records.get(name), sub + name, name))
        state = dataclasses.replace(state, stopped=state.stopped | stopped, done=state.done | done)  # the view's marks
        if self.leading:
            present: Dict[str, set] = {"join": set(), "member": set()}
            for key in snapshot:
                match = MEMBER.fullmatch(key[len(self.prefix):]) if key.startswith(self.prefix) else None
                if match:
                    present[match.group(1)].add(int(match.group(2)))
            lost = present["join"] - present["member"] - set(state.done)
        else:
            lost = etcdview.unbits(view.get("lost")) - set(state.done)
        return dataclasses.replace(state, lost=frozenset(lost - {self.index}))

    def addresses(self) -> Dict[int, str]:
        """The address each server that joined this incarnation gave (``join.<i>``), by index (a
        follower reads the join records from etcd: they are not in its snapshot)."""
        snapshot = self._snapshot
        if not self.leading:
            try:
                snapshot = self.client.range(self.prefix + "join.")[1]
            except EtcdError as exc:
                log.warning("etcd: cannot read the join records (%s); using what this node knows", exc)
        found = {}
        for index in range(self.count):
            record = _parse(snapshot.get(f"{self.prefix}join.{index}"), f"{self.prefix}join.{index}") or {}
            if record.get("address"):
                found[index] = str(record["address"])
        return found

    def not_joined(self) -> List[int]:
        """Servers that have not joined this incarnation yet (the barrier before the first generation)."""
        version = self._version
        if self._not_joined[0] != version:
            snapshot, joined = self._snapshot, etcdview.unbits(self._view[1].get("joined"))
            self._not_joined = (version, [i for i in range(self.count)
                                          if i not in joined and f"{self.prefix}join.{i}" not in snapshot])
        return list(self._not_joined[1])

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Queue ``gen_<g>/<name>`` for the writer thread (True: the first ``abort`` wins in etcd).

        This node reads its own records before etcd has them, except the ``exclusive`` ones: a
        proposal (``next.json``, ``start.json``) is read once etcd holds the winning one. Once
        ``expelled``, nothing is written (False): the others went on without this server, and an
        ``abort`` of its own would end the job they continue.
        """
        if self.expelled:
            return False
        key, value = f"{self.prefix}gen_{generation}/{name}", self._record(data)
        if not exclusive:
            self._mine = {**self._mine, key: value}
            self._version = next(self._versions)
        self._writes.put((key, value, exclusive))
        return True

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended: a later start of the job does not join it (not once
        ``expelled``: the job goes on, and a new start of this server's launcher may rejoin it)."""
        if self.expelled:
            return
        self._writes.put((self.prefix + CLOSED, self._record({"reason": reason}), True))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), then give up the lease and stop."""
        self._writes.put(None)
        self._threads[2].join(timeout)
        self._stop.set()
        try:
            if not self.expelled:  # else etcd dropped the lease already
                self.client.revoke(self.lease)
        except EtcdError as exc:
            log.info("etcd: cannot revoke the lease (%s); it expires within %d s", exc, self.ttl)
        finally:
            self.client.close()

    # -- threads ------------------------------------------------------------------------------------
    def _reachable(self, problem: Optional[str]) -> None:
        """Log once when etcd goes away and once when it is back."""
        if problem and self._outage is None:
            log.warning("etcd unreachable (%s); the job goes on, coordination resumes when it is back", problem)
        elif problem is None and self._outage is not None:
            log.warning("etcd reachable again")
        self._outage = problem

    @property
    def _snapshot(self) -> Dict[str, bytes]:
        """What this server last read of etcd (replaced whole, never changed in place)."""
        return self._keys

    @_snapshot.setter
    def _snapshot(self, keys: Dict[str, bytes]) -> None:
        raw = keys.get(self._view_keys[0])
        if raw is not self._view[0]:
            self._view = (raw, etcdview.decode(raw))
        self._keys = keys
        self._version = next(self._versions)
        if self.leading:
            self._view_cue()
        self._tell()

    def _tell(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _follow(self) -> None:
        """Keep the snapshot current: read, then apply the watch's events; the leader follows every
        key of the incarnation, a follower the view (and takes the lead when ``view.leader`` goes)."""
        while not self._stop.is_set():
            try:
                revision = self._refresh()
                leading, opened = self.leading, time.monotonic()
                low, high = (self.prefix, None) if leading else self._view_keys
                idle = WATCH_IDLE * random.uniform(1.0, 1.5)
                for changes in self.client.watch(low, revision + 1, idle, range_end=high):
                    self._apply(changes)
                    if self._stop.is_set():
                        return
                    if self.leading != leading:
                        break  # now the leader: read and follow every key
                if time.monotonic() - opened < MIN_WATCH_ROUND:
                    # A stream the server closes at once (compaction, a proxy) must not turn
                    # this thread into a busy loop of range requests.
                    self._stop.wait(MIN_WATCH_ROUND)
            except EtcdError as exc:
                self._reachable(str(exc))
                self._stop.wait(0.5)

    def _apply(self, changes: Changes) -> None:
        """One watch message's events into the snapshot (a new dict: read() may be iterating the old)."""
        if not changes.events:
            return
        with self._lock:
            keys = dict(self._snapshot)
            for key, value in changes.events:
                if value is None:
                    keys.pop(key, None)
                else:
                    keys[key] = value
            self._seen = dataclasses.replace(self._seen, revision=max(self._seen.revision, changes.revision))
            self._snapshot = keys
            if not self.leading and self.prefix + etcdview.LEADER not in keys:
                self._campaign()

    def _write_queued(self) -> None:
        """Write the queued records in order, each retried for up to ``write_for`` seconds; publish
        the view when cued (the leader)."""
        retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(self.write_for),
                                     wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
                                     retry=tenacity.retry_if_exception_type(EtcdError), reraise=True,
                                     before_sleep=lambda state: self._reachable(str(state.outcome.exception())))
        while True:
            due = self._view_due
            try:
                item = self._writes.get(timeout=max(0.0, due - time.monotonic()) if due else None)
            except queue.Empty:
                item = etcdview.CUE
            if item is None:
                return
            key, value, exclusive = item
            try:
                if item is etcdview.CUE:
                    retrying(self._publish_view)
                else:
                    retrying(self.client.create if exclusive else self.client.put, key, value)
            except EtcdError as exc:
                log.error("etcd: gave up writing %s after %.0f s: %s", key or "the view", self.write_for, exc)
