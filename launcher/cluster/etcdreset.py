"""etcd restarted without its data (a pod without a persistent volume, a rebuilt cluster): telling it
from this server's own lease having expired, and putting the job's records back.

Both look the same to the lease: etcd answers a keep-alive with TTL 0 ("not found"). They call for
opposite answers. After lost data every launcher is still a member: each puts its records back and
the ranks go on. After an expired lease (this launcher did not renew it for the TTL: a partition, a
stopped process) the other nodes saw this server **lost** and may have gone on without it: it must
not re-enter. What tells them apart, from a fresh read of the incarnation (:func:`lost_data`):

- the revision of the read is below the highest one this launcher saw: etcd's revision never goes
  back on the same data (it does after a restart on an empty data dir, to 1);
- the cluster id changed (a cluster rebuilt with another token or other peers; the same flags on an
  empty data dir give the same id, so this alone is not enough);
- this server's ``join.<i>`` is gone: nothing in the protocol ever deletes it;
- a ``reset.<n>`` record newer than any this launcher knew: another launcher found the data lost
  first and is putting the records back (:func:`put_back` writes it before anything else, so a
  launcher that finds its own ``join.<i>`` already restored by another still sees the reset).

:func:`put_back` rebuilds the incarnation from the launcher's last view of it: each launcher restores
what it knew, so the union of the nodes' views comes back, whoever is first.
"""

import re
from typing import Dict, Optional, Protocol, Sequence, Tuple

from launcher.common.records import record

RESET = "reset"
_RESET = re.compile(r"reset\.(\d+)")
_MEMBER = re.compile(r"member\.(\d+)")
_GENERATION = re.compile(r"gen_(\d+)/(.+)")


class Client(Protocol):
    """The calls :func:`put_back` makes (``launcher.cluster.etcdclient.EtcdClient``)."""

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        """Set ``key``."""

    def create(self, key: str, value: bytes, lease: int = 0, also: Sequence[Tuple[str, bytes, int]] = ()) -> bool:
        """Put ``key`` (and ``also``) only if ``key`` does not exist."""

    def grant(self, ttl: int) -> int:
        """A new lease."""


@record(frozen=True)
class Seen:
    """What this launcher last knew of etcd.

    Attributes:
        revision: The revision of its last read of the incarnation.
        cluster: The cluster id then (None: unknown).
        resets: The highest ``reset.<n>`` it has seen (0: none).
    """

    revision: int
    cluster: Optional[str]
    resets: int


def resets(prefix: str, keys: Dict[str, bytes]) -> int:
    """The highest ``reset.<n>`` among ``keys`` (0: none)."""
    found = (_RESET.fullmatch(key[len(prefix):]) for key in keys if key.startswith(prefix))
    return max((int(m.group(1)) for m in found if m), default=0)


def lost_data(seen: Seen, prefix: str, index: int, revision: int, cluster: Optional[str],
              keys: Dict[str, bytes]) -> Optional[str]:
    """Why a read of the incarnation (``keys`` at ``revision``, cluster id ``cluster``) shows that etcd
    lost its data since ``seen``, or None when it did not."""
    if cluster and seen.cluster and cluster != seen.cluster:
        return f"etcd lost its data: cluster id {seen.cluster} -> {cluster}"
    if revision < seen.revision:
        return f"etcd lost its data: revision {revision} after {seen.revision}"
    if f"{prefix}join.{index}" not in keys:
        return "etcd lost its data: this server's join record is gone"
    number = resets(prefix, keys)
    if number > seen.resets:
        return f"another node found etcd's data lost and put the records back (reset {number})"
    return None


def restorable(prefix: str, keys: Dict[str, bytes]) -> Dict[str, bytes]:
    """The records of ``keys`` (a launcher's last view, its own queued records included) to put back:
    the incarnation's own (``join.<i>``, ``closed``, ``reset.<n>``; not the leased ``member.<i>``), the
    newest generation's (running, failed, stopped, done, abort) and the newest ``next.json`` (the
    servers of the current generation, which a launcher joining later reads)."""
    kept: Dict[str, bytes] = {}
    generations: Dict[int, Dict[str, bytes]] = {}
    newest_next: Tuple[int, Optional[str]] = (-1, None)
    for key, value in keys.items():
        name = key[len(prefix):] if key.startswith(prefix) else None
        match = _GENERATION.fullmatch(name) if name is not None else None
        if match:
            number = int(match.group(1))
            generations.setdefault(number, {})[key] = value
            if match.group(2) == "next.json" and number > newest_next[0]:
                newest_next = (number, key)
        elif name is not None and not _MEMBER.fullmatch(name):
            kept[key] = value
    if generations:
        kept.update(generations[max(generations)])
    if newest_next[1] is not None:
        kept[newest_next[1]] = keys[newest_next[1]]
    return kept


def put_back(client: Client, prefix: str, index: int, before: Dict[str, bytes], ttl: int, reset: int,
             marker: bytes, joined: bytes) -> int:
    """Put the incarnation back into an etcd that lost it, from ``before`` (this launcher's last view).

    In order: ``reset.<reset>`` (``marker``), so that the others tell lost data from an expired lease
    even once their ``join.<i>`` is back; this server's ``member.<i>`` on a new lease and its
    ``join.<i>`` (``joined`` if it had none); the other members' ``member.<j>`` with their ``join.<j>``
    in one transaction, on a lease of ``ttl`` seconds that nobody renews: a launcher that is alive
    moves its ``member.<j>`` to a lease of its own when it finds the data lost (within a third of the
    TTL), and one that died meanwhile is lost when that lease expires, as if it had just joined; then
    every other :func:`restorable` record. Every record but this server's ``member.<i>`` is created
    only if absent: whoever is first, nothing is written twice.

    Returns:
        This server's new lease.
    """
    client.create(f"{prefix}{RESET}.{reset}", marker)
    lease = client.grant(ttl)
    client.put(f"{prefix}member.{index}", b"{}", lease)
    own = f"{prefix}join.{index}"
    client.create(own, before.get(own, joined))
    others = sorted(int(m.group(1)) for m in (_MEMBER.fullmatch(k[len(prefix):]) for k in before
                                               if k.startswith(prefix)) if m and int(m.group(1)) != index)
    proxy = client.grant(ttl) if others else 0
    for other in others:
        join = f"{prefix}join.{other}"
        client.create(f"{prefix}member.{other}", b"{}", proxy, [(join, before[join], 0)] if join in before else [])
    for key, value in restorable(prefix, before).items():
        if key != own:
            client.create(key, value)
    return lease
