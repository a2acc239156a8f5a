"""Elastic membership (``--nnodes MIN:MAX``) in the restart-generation protocol: waiting for a lost
server's replacement, agreeing on the next generation's servers, following the master when it moves
with rank 0, and a late launcher's entry into a running job.

:class:`ElasticMembership` is a mixin of :class:`launcher.cluster.sync.Coordinator`: it uses the
coordinator's store (``files``), its waits (``_await``, ``_read``) and its endings (``_end_for_lost``,
``_timed_out``), and is tested through it (tests/unit/cluster/test_sync.py).
"""

import logging
from typing import Optional, Tuple

from launcher.cluster.syncdir import MASTER, NEXT, STOPPED, Generation
from launcher.common.records import record
from launcher.supervision.policy import Agreement, Wait

log = logging.getLogger(__name__)


@record(frozen=True)
class Elastic:
    """Elastic membership (``--nnodes MIN:MAX``): after a server is lost, wait ``wait`` seconds for a
    replacement, then go on without it if at least ``min_nodes`` servers remain."""

    min_nodes: int
    wait: float


class ElasticMembership:
    """The elastic part of the protocol (see the module's docstring)."""

    def _await_replacement(self, generation: int, state: Generation, wait: Wait) -> Optional[Generation]:
        """Elastic: give a launcher up to ``elastic.wait`` seconds to take a lost server's place."""
        lost = self._lost(state)
        self.emit("sync_lost", generation=generation, servers=lost, wait=self.elastic.wait)
        log.warning("%s lost in generation %d: waiting up to %.0f s for a replacement", self._names(lost), generation,
                    self.elastic.wait)
        state, _ = self._await(generation, wait, "a replacement", lambda s: s.abort is not None or not self._lost(s),
                               self.elastic.wait)
        return state

    def _regroup(self, generation: int, servers: Tuple[int, ...], code: int, wait: Wait) -> Optional[Agreement]:
        """Elastic: agree on the servers of the next generation (the first proposal in etcd wins).

        Returns:
            None to go on (``members`` updated), else how the job ends.
        """
        if len(servers) < self.elastic.min_nodes:
            state = self._read(generation)
            return self._end_for_lost(generation, state, code, f" ({len(servers)} server(s) left, "
                                                               f"--nnodes needs at least {self.elastic.min_nodes})")
        self.files.write(generation, f"{NEXT}.json", {"servers": list(servers)}, exclusive=True)
        state, _ = self._await(generation, wait, "the next generation's servers", lambda s: s.next is not None)
        if state is None:
            return Agreement()
        if state.next is None:
            return self._timed_out(generation, [], NEXT)
        agreed = tuple(int(i) for i in state.next.get("servers", ()))
        if self.files.index not in agreed:
            log.error("the other nodes go on without this one (generation %d: %s)", generation + 1, self._names(agreed))
            return Agreement(exit_code=code, reason="failed")
        previous, self.members = self.members, agreed
        self.emit("sync_membership", generation=generation + 1, servers=list(agreed), previous=list(previous))
        log.warning("generation %d runs on %d server(s) (was %d): %s", generation + 1, len(agreed), len(previous),
                    self._names(agreed))
        return self.move_master(generation, code, wait) if agreed != previous else None

    def move_master(self, generation: int, code: int, wait: Wait) -> Optional[Agreement]:
        """Elastic: when the master of generation ``generation + 1`` moves with rank 0, wait for its
        new host's ``gen_<generation>/master.json`` (:mod:`launcher.cluster.syncmaster`, up to
        ``--sync-timeout``; generation -1: before a generation 0 that starts without the master's
        server); ``endpoint`` holds it while the membership stays. Returns None to go on, else how
        the job ends (``code``: the exit code then)."""
        self.endpoint = None
        host = self.master.publish(self.files, generation, self.members) if self.master is not None else None
        if host is None:
            return None
        state, _ = self._await(generation, wait, "the new master's endpoint", lambda s: s.master is not None
                               or s.abort is not None or host in s.lost)
        if state is None:
            return Agreement()
        if state.master is None:  # that server's launcher ended the job, was lost, or never wrote
            if state.abort is not None:
                return Agreement(exit_code=code, reason="failed")
            return self._end_for_lost(generation, state, code) if host in state.lost \
                else self._timed_out(generation, [host], MASTER)
        self.endpoint = self.master.agreed(state.master, generation, self.files.name(host), self.emit)
        return None

    def join_running(self, generation: int, wait: Wait) -> Agreement:
        """A launcher that joined a running elastic job (it announced itself in ``generation``):
        learn the generation's servers, then pass its barrier like the others."""
        # The newest regroup's servers, else generation 0's when it started with fewer than all
        proposals = [self._read(number).next for number in range(generation - 1, -1, -1)] + [self._read(0).start]
        proposal = next((p for p in proposals if p is not None), None)
        if proposal is not None:
            self.members = tuple(int(i) for i in proposal.get("servers", ()))
        self._written.add((generation, STOPPED))  # announced with the join
        return self.settle(generation, None, None, [], wait)
