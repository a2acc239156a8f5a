"""The lease of one server's ``member.<i>`` in etcd: kept alive, and what a lease etcd no longer knows
means: etcd lost its data (the records are put back and the job goes on) or this server's lease
expired while etcd kept the records (the others count it lost: it stays out).

:class:`Leased` is a mixin of :class:`launcher.cluster.etcdstore.EtcdStore` (its client, lock,
snapshot and notices); its ``_keep_alive`` is the store's lease thread, and ``_refresh`` the read
both the lease and the watch threads make. Tested through the store (tests/unit/cluster/test_etcdstore.py).
"""

import logging
import time
from typing import Dict, Optional, Tuple

from launcher.cluster import etcdview
from launcher.cluster.etcdclient import EtcdError
from launcher.cluster.etcdreset import Seen, lost_data, put_back, resets

log = logging.getLogger(__name__)

RENEW_AGAIN = 0.5  # seconds from a renewal of the lease that failed to the next try


class Leased:
    """Keeping the lease, and telling lost data from an expired lease (see the module's docstring)."""

    def _keep_alive(self) -> None:
        """Renew the lease every TTL/3; ``RENEW_AGAIN`` s after a failed renewal, doubling up to TTL/3
        (two late answers must not cost the lease, nor a slow etcd get a storm of renewals); a lease
        etcd no longer knows: see :meth:`_refresh`."""
        failed = 0
        while not self._stop.wait(self._renew_in(failed)) and not self.expelled:
            lease, asked = self.lease, time.monotonic()
            try:
                if self.client.keepalive(lease) > 0:
                    self._renewed = asked
                elif not self._stop.is_set():
                    self._refresh(gone=lease)
                self._reachable(None)
                failed = 0
            except EtcdError as exc:
                self._reachable(str(exc))
                failed += 1

    def _renew_in(self, failed: int) -> float:
        """Seconds to the next renewal: TTL/3 after the last grant or renewal (at once when the join
        took longer than that: etcd counts the TTL from the grant, and a slow join used to leave the
        lease unrenewed for join + TTL/3, past its TTL); after ``failed`` failures, sooner."""
        if failed:
            return min(self.ttl / 3, RENEW_AGAIN * 2 ** (failed - 1))
        return max(0.0, self._renewed + self.ttl / 3 - time.monotonic())

    def _refresh(self, gone: Optional[int] = None) -> int:
        """Read the incarnation into the snapshot (a follower: the view), after putting the records
        back if etcd lost them.

        Args:
            gone: A lease etcd just said it does not know. Without a sign of lost data it expired
                while etcd kept the job's records: the others count this server as lost (:meth:`_expel`).

        Returns:
            The revision read.
        """
        with self._lock:
            if gone is not None and (gone != self.lease or self.expelled):
                return self._seen.revision  # a reset granted a new lease meanwhile
            if gone is not None and not self._begun.is_set():  # lost while the join's first read runs:
                self._expel()  # nothing seen yet to tell lost data by (a reset before this join is not one)
                return self._seen.revision
            revision, keys, seen = self._read(gone)
            why = lost_data(self._seen, self.prefix, self.index, revision, self.client.cluster_id, seen)
            if why is not None:
                self._reset(why, seen)
                revision, keys, seen = self._read(self.lease)  # with the reset record just written
            elif gone is not None:
                self._expel()
            self._seen = Seen(revision, self.client.cluster_id, max(self._seen.resets, resets(self.prefix, seen)))
            if not self.leading:  # what else a follower read once stays: records are only ever added
                low, high = self._view_keys
                keys = {**{k: v for k, v in self._snapshot.items() if not low <= k < high}, **keys}
            self._snapshot = keys
            if self.prefix + etcdview.LEADER not in keys:
                self._campaign()
            return revision

    def _read(self, gone: Optional[int]) -> Tuple[int, Dict[str, bytes], Dict[str, bytes]]:
        """``(revision, keys, what tells lost data)``: the leader reads every key; a follower the view,
        and when its lease is gone the reset records and its own join record too (a few keys, not
        every node's: when many leases go at once, N full reads would be N x N)."""
        if self.leading:
            revision, keys = self.client.range(self.prefix)
            return revision, keys, keys
        revision, keys = self.client.range(*self._view_keys)
        own = f"{self.prefix}join.{self.index}"
        if gone is None:  # no sign of anything: only the revision and the cluster tell lost data
            return revision, keys, {**keys, own: b""}
        keys.update(self.client.range(self.prefix + "reset.")[1])
        joined = self.client.get(own)
        return revision, keys, {**keys, **({own: joined} if joined is not None else {})}

    def _reset(self, why: str, keys: Dict[str, bytes]) -> None:
        """etcd lost its data: put back this server's records and what it knew of the others'."""
        number = max(resets(self.prefix, keys), self._seen.resets + 1)
        if number not in self._announced:  # once per reset, even when etcd goes away halfway
            self._announced.add(number)
            log.warning("etcd lost this job's records (%s); putting them back, the ranks go on", why)
            self._notices.append(("coordinator_reset", {"reason": why, "reset": number,
                                                        "revision_before": self._seen.revision}))
        low, high = self._view_keys  # the view and its leader are published again, not put back
        before = {k: v for k, v in {**self._mine, **self._snapshot}.items() if not low <= k < high}
        marker = self._record({"reason": why, "revision_before": self._seen.revision})
        self._renewed = time.monotonic()  # put_back grants the new lease
        self.lease = put_back(self.client, self.prefix, self.index, before, self.ttl, number, marker, self._joined())
        self.leading = False

    def _expel(self) -> None:
        """This server's lease expired while etcd kept the job's records: it stays out."""
        self.expelled = f"{self.name(self.index)}: its lease expired while etcd kept the job's records"
        self.leading = False
        self._version = next(self._versions)
        self._tell()
        log.error("etcd: this server's lease expired (not renewed for %d s) while etcd kept the job's records: "
                  "the other nodes count it as lost and may go on without it; stopping the local ranks, not "
                  "rejoining (start the launcher again to rejoin an elastic job)", self.ttl)
        self._notices.append(("coordinator_lease_expired", {"server": self.index, "ttl": self.ttl}))
