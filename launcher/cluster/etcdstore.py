"""The records of coordinated restarts in etcd (``--coordinator etcd://...``), with leased membership.

The same records as ``--sync-dir``'s files (:mod:`launcher.cluster.syncdir`), as keys under
``/launcher/<run-id>/inc_<k>/``, plus one that the files cannot have::

    join.<i>                  server i joined this incarnation (created in one transaction with member.<i>),
                              with the address it gives for the master (``address``, elastic regroups)
    member.<i>                attached to server i's lease: gone within the TTL once its launcher is
    closed                    a launcher of this incarnation ended: a new start does not join it
    gen_<g>/...               failed.<i>.json, stopped.<i>, done.<i>, abort (created only if absent)

A server that joined, whose ``member.<i>`` is gone and that did not finish the generation is
**lost** (``Generation.lost``). Nothing here blocks the supervisor's loop: three daemon threads keep
the lease alive, follow the keys (a watch, re-read on every change and at least every
``WATCH_IDLE`` seconds) into an in-memory snapshot that :meth:`EtcdStore.read` parses, and write the
records queued by :meth:`EtcdStore.write` in order, retrying while etcd is away.
"""

import dataclasses
import json
import logging
import queue
import re
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import tenacity

from launcher.cluster.etcdclient import EtcdClient, EtcdError
from launcher.common.errors import UsageError
from launcher.cluster.syncdir import CLOSED, JOIN_NOTE, Generation, collect, stamp, valid

log = logging.getLogger(__name__)

ROOT = "/launcher/"
#: A watch that says nothing for this long is re-opened after a fresh read (also the fallback poll).
WATCH_IDLE = 5.0
MIN_WATCH_ROUND = 0.1  # seconds: a watch that ends sooner is not reopened at once
_INCARNATION = re.compile(r"inc_(\d+)/")
_MEMBER = re.compile(r"(join|member)\.(\d+)")
_GENERATION = re.compile(r"gen_(\d+)/")
_Put = Tuple[str, bytes, bool]


class EtcdStore:
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
    """

    def __init__(self, client: EtcdClient, prefix: str, index: int, names: Sequence[str], ttl: int, lease: int,
                 write_for: float = 300.0, address: Optional[str] = None):
        self.client, self.prefix, self.index, self.ttl, self.lease = client, prefix, index, ttl, lease
        self.names = tuple(names)
        self.count = len(self.names)
        self.path = f"etcd://{client.endpoints[0][0]}:{client.endpoints[0][1]}{prefix}"
        self.write_for = write_for
        self._snapshot: Dict[str, bytes] = {}
        self._mine: Dict[str, bytes] = {}  # what this node queued: visible to itself before etcd has it
        self._writes: "queue.Queue[Optional[_Put]]" = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, name=f"etcd-{what}", daemon=True)
                         for what, target in (("lease", self._keep_alive), ("watch", self._follow),
                                              ("write", self._write_queued))]
        self._outage: Optional[str] = None
        self.running: Optional[int] = None  # the generation this server joined a running job in
        self.address = address  # where this server hosts the master if it comes to host rank 0

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""
        return f"server {index} ({self.names[index]})" if 0 <= index < self.count else f"server {index}"

    @classmethod
    def join(cls, client: EtcdClient, run_id: str, index: int, names: Sequence[str], ttl: int,
             write_for: float = 300.0, wait: float = 3.0, elastic: bool = False,
             address: Optional[str] = None) -> "EtcdStore":
        """Join the current incarnation of ``run_id`` (or start the next one), as ``SyncDir.join``.

        ``write_for``: seconds a record is retried while etcd is away; ``wait``: how long etcd may
        take to answer the first time. With ``elastic``, a server whose place is free (its launcher
        lost) or that arrives after the job's first restart joins the running job instead: see
        :meth:`_join_running`; ``running`` is then the generation it joined in. ``address`` goes into
        ``join.<i>``: where this server's ranks host the master if it comes to host rank 0.

        Raises:
            EtcdError: etcd did not answer within ``wait`` seconds, or this server's place is taken.
        """
        retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(wait), wait=tenacity.wait_fixed(0.25),
                                     retry=tenacity.retry_if_exception_type(EtcdError), reraise=True,
                                     before_sleep=lambda state: log.debug("etcd: %s (retrying)", state.outcome.exception()))
        return retrying(cls._join, client, run_id, index, names, ttl, write_for, elastic, address)

    @classmethod
    def _join(cls, client: EtcdClient, run_id: str, index: int, names: Sequence[str], ttl: int,
              write_for: float, elastic: bool, address: Optional[str] = None) -> "EtcdStore":
        root = f"{ROOT}{run_id}/"
        _, keys = client.range(root)
        number = max((int(m.group(1)) for m in map(_INCARNATION.match, (k[len(root):] for k in keys)) if m),
                     default=0)
        lease = client.grant(ttl)
        while True:
            store = cls(client, f"{root}inc_{number}/", index, names, ttl, lease, write_for, address)
            if store.prefix + CLOSED not in keys:
                if elastic and store._join_running(keys):
                    break
                if client.create(store.prefix + f"join.{index}", store._joined(), 0,
                                 [(store.prefix + f"member.{index}", b"{}", lease)]):
                    break
            number += 1
        store._snapshot = client.range(store.prefix)[1]
        for thread in store._threads:
            thread.start()
        return store

    def _join_running(self, keys: Dict[str, bytes]) -> bool:
        """Elastic: join the incarnation while it runs, when this server's place is free and the job is
        past its start (some generation has records: ``gen_0/start.json`` once its servers are decided).

        One transaction, if ``member.<i>`` is absent: ``member.<i>`` and ``join.<i>``, then
        ``failed.<i>.json`` (so that the running servers stop and restart with this one) and
        ``stopped.<i>`` (it has nothing running) in the running generation ``g``: this server passes
        the barrier of ``g`` like the others and starts ``g + 1``.
        """
        names = [k[len(self.prefix):] for k in keys if k.startswith(self.prefix)]
        mine = {m.group(1) for m in map(_MEMBER.fullmatch, names) if m and int(m.group(2)) == self.index}
        generations = [int(m.group(1)) for m in map(_GENERATION.match, names) if m]
        running = max(generations) if generations else None
        alive = any(name.startswith("member.") for name in names)
        if running is None or not alive:  # not started yet (gen_0 has records once it is decided)
            return False
        taken = UsageError(f"{self.name(self.index)} is already a live member of the running job",
                           ["give each launcher its own --node-rank (or --server-id)"])
        if "member" in mine:
            raise taken
        gen = f"{self.prefix}gen_{running}/"
        note = self._record(JOIN_NOTE)
        if not self.client.create(f"{self.prefix}member.{self.index}", b"{}", self.lease,
                                  [(f"{self.prefix}join.{self.index}", self._joined(), 0),
                                   (f"{gen}failed.{self.index}.json", note, 0), (f"{gen}stopped.{self.index}", b"{}", 0)]):
            raise taken
        self.running = running
        return True

    def _joined(self) -> bytes:
        return self._record({"address": self.address} if self.address else {})

    def _record(self, data: dict) -> bytes:
        return json.dumps(stamp(self.index, self.name(self.index), data)).encode()

    # -- the supervisor's side (never blocks) -------------------------------------------------------
    def gen_path(self, generation: int) -> str:
        """Where generation ``generation``'s records are, for messages."""
        return f"{self.path}gen_{generation}/"

    def read(self, generation: int) -> Generation:
        """Generation ``generation`` as of the last snapshot, with the servers lost so far."""
        snapshot = {**self._mine, **self._snapshot}
        sub = f"{self.prefix}gen_{generation}/"
        names = [key[len(sub):] for key in snapshot if key.startswith(sub)]
        state = collect(generation, names, lambda name: _parse(snapshot.get(sub + name)))
        present: Dict[str, set] = {"join": set(), "member": set()}
        for key in snapshot:
            match = _MEMBER.fullmatch(key[len(self.prefix):]) if key.startswith(self.prefix) else None
            if match:
                present[match.group(1)].add(int(match.group(2)))
        lost = present["join"] - present["member"] - set(state.done) - {self.index}
        return dataclasses.replace(state, lost=frozenset(lost))

    def addresses(self) -> Dict[int, str]:
        """The address each server that joined this incarnation gave (``join.<i>``), by index."""
        snapshot = self._snapshot
        found = {}
        for index in range(self.count):
            record = _parse(snapshot.get(f"{self.prefix}join.{index}")) or {}
            if record.get("address"):
                found[index] = str(record["address"])
        return found

    def not_joined(self) -> List[int]:
        """Servers that have not joined this incarnation yet (the barrier before the first generation)."""
        snapshot = self._snapshot
        return [i for i in range(self.count) if f"{self.prefix}join.{i}" not in snapshot]

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Queue ``gen_<g>/<name>`` for the writer thread (always True: the first ``abort`` wins in etcd).

        This node reads its own records before etcd has them, except the ``exclusive`` ones: a
        proposal (``next.json``, ``start.json``) is read once etcd holds the winning one.
        """
        key, value = f"{self.prefix}gen_{generation}/{name}", self._record(data)
        if not exclusive:
            self._mine[key] = value
        self._writes.put((key, value, exclusive))
        return True

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended: a later start of the job does not join it."""
        self._writes.put((self.prefix + CLOSED, self._record({"reason": reason}), True))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), then give up the lease and stop."""
        self._writes.put(None)
        self._threads[2].join(timeout)
        self._stop.set()
        try:
            self.client.revoke(self.lease)
        except EtcdError as exc:
            log.info("etcd: cannot revoke the lease (%s); it expires within %d s", exc, self.ttl)

    # -- threads ------------------------------------------------------------------------------------
    def _reachable(self, problem: Optional[str]) -> None:
        """Log once when etcd goes away and once when it is back."""
        if problem and self._outage is None:
            log.warning("etcd unreachable (%s); the job goes on, coordination resumes when it is back", problem)
        elif problem is None and self._outage is not None:
            log.warning("etcd reachable again")
        self._outage = problem

    def _keep_alive(self) -> None:
        """Renew the lease every third of its TTL; a lease etcd forgot is granted again."""
        while not self._stop.wait(self.ttl / 3):
            try:
                if self.client.keepalive(self.lease) <= 0 and not self._stop.is_set():
                    self.lease = self.client.grant(self.ttl)
                    self.client.put(f"{self.prefix}member.{self.index}", b"{}", self.lease)
                    log.warning("etcd: this server's lease had expired; granted a new one")
                self._reachable(None)
            except EtcdError as exc:
                self._reachable(str(exc))

    def _follow(self) -> None:
        """Keep the snapshot current: read the prefix, then watch it and read again on every change."""
        while not self._stop.is_set():
            try:
                revision, self._snapshot = self.client.range(self.prefix)
                opened = time.monotonic()
                for _ in self.client.watch(self.prefix, revision + 1, WATCH_IDLE):
                    self._snapshot = self.client.range(self.prefix)[1]
                    if self._stop.is_set():
                        return
                if time.monotonic() - opened < MIN_WATCH_ROUND:
                    # A stream the server closes at once (compaction, a proxy) must not turn
                    # this thread into a busy loop of range requests.
                    self._stop.wait(MIN_WATCH_ROUND)
            except EtcdError as exc:
                self._reachable(str(exc))
                self._stop.wait(0.5)

    def _write_queued(self) -> None:
        """Write the queued records in order, each retried for up to ``write_for`` seconds."""
        retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(self.write_for),
                                     wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
                                     retry=tenacity.retry_if_exception_type(EtcdError), reraise=True,
                                     before_sleep=lambda state: self._reachable(str(state.outcome.exception())))
        while True:
            item = self._writes.get()
            if item is None:
                return
            key, value, exclusive = item
            try:
                retrying(self.client.create if exclusive else self.client.put, key, value)
            except EtcdError as exc:
                log.error("etcd: gave up writing %s after %.0f s: %s", key, self.write_for, exc)


def _parse(raw: Optional[bytes]) -> Optional[dict]:
    try:
        return valid(json.loads(raw)) if raw is not None else None
    except ValueError:
        return None
