"""Joining an incarnation of the job in etcd: the part of :class:`launcher.cluster.etcdstore.EtcdStore`
that runs once, before its threads start (``join.<i>`` and ``member.<i>`` in one transaction; an
elastic job's late joiner announcing itself in the running generation).
"""

import logging
import os
import re
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tenacity

from launcher.cluster.etcdclient import EtcdClient, EtcdError, EtcdRejected
from launcher.cluster.syncdir import CLOSED, JOIN_NOTE, checked
from launcher.common.errors import UsageError

log = logging.getLogger(__name__)

ROOT = "/launcher/"
#: Seconds a join may take when etcd answers slowly (calls time out: every node of a large job at once).
SLOW_JOIN_WAIT = 30.0
MEMBER = re.compile(r"(join|member)\.(\d+)")
_GENERATION = re.compile(r"gen_(\d+)/")


class Joining:
    """How :class:`~launcher.cluster.etcdstore.EtcdStore` joins (a mixin: the store's attributes)."""

    @classmethod
    def join(cls, client: EtcdClient, run_id: str, index: int, names: Sequence[str], ttl: int,
             write_for: float = 300.0, wait: float = 3.0, elastic: bool = False,
             address: Optional[str] = None, emit: Optional[Callable[..., object]] = None) -> "Joining":
        """Join the current incarnation of ``run_id`` (or start the next one), as ``SyncDir.join``.

        ``write_for``: seconds a record is retried while etcd is away; ``wait``: how long etcd may
        take to answer the first time. With ``elastic``, a server whose place is free (its launcher
        lost) or that arrives after the job's first restart joins the running job instead: see
        :meth:`_join_running`; ``running`` is then the generation it joined in. ``address`` goes into
        ``join.<i>``: where this server's ranks host the master if it comes to host rank 0. ``emit``:
        see the class.

        Raises:
            EtcdError: etcd did not answer within ``wait`` seconds, or this server's place is taken.
            EtcdRejected: etcd refused this client (TLS, user, permission): at once, not retried.
        """
        def give_up(state: tenacity.RetryCallState) -> bool:  # an etcd that is there but slow gets longer
            slow = "timed out" in str(state.outcome.exception())
            return state.seconds_since_start >= (max(wait, SLOW_JOIN_WAIT) if slow else wait)

        retrying = tenacity.Retrying(stop=give_up, wait=tenacity.wait_fixed(0.25),
                                     retry=tenacity.retry_if_exception(_transient), reraise=True,
                                     before_sleep=lambda state: log.debug("etcd: %s (retrying)",
                                                                          state.outcome.exception()))
        token = os.urandom(8).hex()  # tells this call's join record from a previous start's
        store = retrying(cls._enter, client, run_id, index, names, ttl, write_for, elastic, address, emit, token)
        store._threads[0].start()  # the lease is renewed from now on: the first read may be slow too
        try:
            retrying(store._begin)
        except BaseException:
            store._stop.set()
            raise
        for thread in store._threads[1:]:
            thread.start()
        return store

    @classmethod
    def _enter(cls, client: EtcdClient, run_id: str, index: int, names: Sequence[str], ttl: int,
               write_for: float, elastic: bool, address: Optional[str], emit: Optional[Callable[..., object]],
               token: str) -> "Joining":
        """Create this server's ``join.<i>`` and ``member.<i>`` in the incarnation it joins (again
        after an answer that timed out: a join record with ``token`` is this call's own)."""
        root = f"{ROOT}{run_id}/"
        number = 0  # the newest incarnation, found by counting (every node joins: no key list travels)
        while client.count(f"{root}inc_{number + 1}/"):
            number += 1
        granted: List[Tuple[int, float]] = []

        def leased(store: "Joining") -> int:
            """The lease, granted just before the first write that holds it: etcd counts its TTL from
            the grant, and nothing renews it before the lease thread starts (:meth:`join`)."""
            if not granted:
                asked = time.monotonic()
                granted.append((client.grant(ttl), asked))
            store.lease, store._renewed = granted[0]
            return store.lease

        while True:
            store = cls(client, f"{root}inc_{number}/", index, names, ttl, 0, write_for, address, emit)
            store.token = token
            mine = store.prefix + f"join.{index}"
            if (parse(client.get(mine), mine) or {}).get("token") == token:
                client.put(store.prefix + f"member.{index}", b"{}", leased(store))  # onto this attempt's lease
                break
            if client.get(store.prefix + CLOSED) is None:
                # only a late joiner of a running elastic job reads the incarnation's keys
                if elastic and client.count(store.prefix + "gen_") > 0:
                    keys = client.range(store.prefix)[1]
                    leased(store)  # after the read: the join's transaction is next
                    if store._join_running(keys):
                        break
                if client.create(store.prefix + f"join.{index}", store._joined(), 0,
                                 [(store.prefix + f"member.{index}", b"{}", leased(store))]):
                    break
            number += 1
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
        mine = {m.group(1) for m in map(MEMBER.fullmatch, names) if m and int(m.group(2)) == self.index}
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
                                   (f"{gen}failed.{self.index}.json", note, 0),
                                   (f"{gen}stopped.{self.index}", b"{}", 0)]):
            raise taken
        self.running = running
        return True

    def _joined(self) -> bytes:
        return self._record({**({"address": self.address} if self.address else {}),
                             **({"token": self.token} if self.token else {})})


def _transient(exc: BaseException) -> bool:
    """An error worth retrying at the start: etcd away, not etcd refusing this client."""
    return isinstance(exc, EtcdError) and not isinstance(exc, EtcdRejected)


def parse(raw: Optional[bytes], key: str) -> Optional[dict]:
    """The record etcd holds at ``key`` (None: absent, or unusable: warned once, the job goes on)."""
    return checked(raw, key, key.rsplit("/", 1)[-1]) if raw is not None else None
