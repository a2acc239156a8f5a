"""Rank table data model: the parsed, format-independent view of an ``hccl.json``.

Every supported format (1.0, 1.2, 2.0, the old ``group_list``) and the tables the launcher builds
itself from ``--nproc-per-node`` end up as one :class:`RankTable`.
"""

from dataclasses import field
from functools import cached_property
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.common.records import record


@record(frozen=True)
class Device:
    """One device (NPU) on a server.

    Attributes:
        rank_id: Global rank of the process driving this device.
        device_id: Physical device index on its server (``DEVICE_ID``).
        device_ip: The device's RoCE address, when the table has one.
        super_device_id: Atlas A3 (format 1.2) SuperPoD-wide device id, when present.
        local_id: Format 2.0 ``local_id``, when present.
    """

    rank_id: int
    device_id: int
    device_ip: Optional[str] = None
    super_device_id: Optional[str] = None
    local_id: Optional[int] = None


@record(frozen=True)
class ServerEntry:
    """One server (node, or pod on a node) and its devices, in global-rank order.

    Attributes:
        server_id: The node address (``server_id`` in 1.x tables; the node-level
            ``net_instance_id`` in 2.0 tables).
        devices: Devices in ascending ``rank_id`` order.
        host_ip: Node address, when the table has one.
        container_ip: Pod address, when the table has one.
        super_pod_id: Format 1.2 SuperPoD this server belongs to, when present.
    """

    server_id: str
    devices: Tuple[Device, ...]
    host_ip: Optional[str] = None
    container_ip: Optional[str] = None
    super_pod_id: Optional[str] = None

    @property
    def addresses(self) -> Tuple[str, ...]:
        """Every address this server is known by, without duplicates, in table order."""
        seen: List[str] = []
        for addr in (self.server_id, self.host_ip, self.container_ip):
            if addr and addr not in seen:
                seen.append(addr)
        return tuple(seen)

    @property
    def ranks(self) -> Tuple[int, ...]:
        """Global ranks hosted on this server."""
        return tuple(d.rank_id for d in self.devices)


@record(frozen=True)
class RankTable:
    """A complete rank table.

    Attributes:
        servers: Servers ordered by their first device's global rank.
        format_version: The table's own ``version`` field ("1.0", "1.2", "2.0", or "generated").
        status: ``completed`` or ``initializing``.
        source: Path the table was read from, or None for a generated table.
        revision: Content of the sibling ``version`` file (operator timestamp), if any; it
            increases each time the cluster rewrites the table.
        master_host: Rendezvous master address from ``--master-addr`` (with a built table or a
            file); otherwise the master is the server hosting global rank 0.
        master_port: Port for the rendezvous master when the launcher built the table itself.
    """

    servers: Tuple[ServerEntry, ...]
    format_version: str = "1.0"
    status: str = "completed"
    source: Optional[str] = None
    revision: Optional[str] = None
    master_host: Optional[str] = None
    master_port: Optional[int] = None
    extra: Dict[str, str] = field(default_factory=dict, compare=False)

    # cached_property writes the instance __dict__ directly, so it works on a frozen dataclass; the
    # table is immutable, and a 512-server table otherwise rescans every server per rank.
    @cached_property
    def world_size(self) -> int:
        """Total number of ranks."""
        return sum(len(s.devices) for s in self.servers)

    @property
    def server_count(self) -> int:
        """Number of servers."""
        return len(self.servers)

    @property
    def master_addr(self) -> str:
        """Address of the server hosting global rank 0 (what the legacy scripts used)."""
        if self.master_host:
            return self.master_host
        for server in self.servers:
            if 0 in server.ranks:
                return server.container_ip or server.server_id
        return self.servers[0].container_ip or self.servers[0].server_id

    @cached_property
    def _positions(self) -> Dict[int, int]:
        return {id(server): i for i, server in enumerate(self.servers)}

    def server_index(self, server: ServerEntry) -> int:
        """Position of ``server`` in the table (the legacy ``SERVER_ID``)."""
        position = self._positions.get(id(server))
        return position if position is not None else self.servers.index(server)

    def find_servers(self, addresses: Sequence[str]) -> List[ServerEntry]:
        """Servers whose ``server_id``, ``host_ip`` or ``container_ip`` equals one of ``addresses``.

        Matching is exact string equality: ``10.0.0.1`` never matches ``10.0.0.11`` (legacy defect 1).
        """
        wanted = set(addresses)
        return [s for s in self.servers if wanted.intersection(s.addresses)]
