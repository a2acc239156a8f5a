"""Elastic membership: the master's endpoint when it follows rank 0 to another server.

When the server that hosted global rank 0 is no longer in the job, rank 0 and the master
(``MASTER_ADDR``/``MASTER_PORT``, ``MS_SCHED_HOST``/``MS_SCHED_PORT``) move to the server that now
hosts it (``launcher.jobspec.topology.regroup``). ``--master-port`` was chosen for the old host; on
the new one something else may listen there. So, at the barrier of a membership change, that
server's launcher checks the port on its own host (``check``: a bind test, another free port if
it is taken) and publishes the endpoint as ``gen_<g>/master.json``; every node waits for the record
and uses it (:meth:`launcher.cluster.sync.Coordinator.move_master`). torchrun does the same: its
rank-0 agent picks a free port and publishes ``MASTER_ADDR``/``MASTER_PORT`` through the rendezvous
store (``RendezvousStoreInfo.build`` in torch 2.13).
"""

import logging
from typing import Any, Callable, Optional, Sequence, Tuple

from launcher.cluster.syncdir import MASTER
from launcher.common.records import record

log = logging.getLogger(__name__)


@record(frozen=True)
class MasterMove:
    """Where the master goes when it moves, and how its new host picks the port.

    Attributes:
        where: ``where(servers)``: the server hosting rank 0 of a generation that ``servers`` run and
            its address, when that is not the job's master server; else None.
        port: The port asked for (``--master-port``).
        check: ``check(address, port) -> (port, reason)``, run by the launcher of that server.
    """

    where: Callable[[Sequence[int]], Optional[Tuple[int, str]]]
    port: int
    check: Callable[[str, int], Tuple[int, str]]

    def publish(self, files: Any, generation: int, servers: Sequence[int]) -> Optional[int]:
        """The server the master moves to when ``servers`` run the next generation (None: it stays);
        on that server, check the port and write ``gen_<generation>/master.json``."""
        moved = self.where(servers)
        if moved is None:
            return None
        host, address = moved
        if host == files.index:
            port, reason = self.check(address, self.port)
            files.write(generation, f"{MASTER}.json", {"addr": address, "port": port, "reason": reason})
        return host

    def agreed(self, record: dict, generation: int, host: str, emit: Callable[..., object]) -> Tuple[str, int]:
        """The endpoint of a ``master.json`` record, said once (event ``master_moved``, one line)."""
        endpoint = str(record.get("addr")), int(record.get("port", self.port))
        reason = record.get("reason", "")
        emit("master_moved", generation=generation + 1, server=record.get("server"), addr=endpoint[0],
             port=endpoint[1], requested_port=self.port, reason=reason)
        log.warning("generation %d: the master moves with rank 0 to %s, %s:%d (%s)", generation + 1, host,
                    *endpoint, reason)
        return endpoint
