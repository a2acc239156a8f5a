"""Build rank tables: 1.0 ``hccl.json`` documents for ``launcher ranktable generate``, and the
in-memory table the launcher uses when started torchrun-style (``--nproc-per-node``) without one.
"""

from typing import Any, Dict, List, Sequence, Tuple

from launcher.common.errors import UsageError
from launcher.jobspec.ranktable.model import Device, RankTable, ServerEntry


def generate_rank_table(servers: Sequence[Tuple[str, int]], status: str = "completed") -> Dict[str, Any]:
    """A version 1.0 rank table document, every value a string as the Ascend Operator writes them.

    Ranks are numbered server by server in the order given; ``device_id`` is the device's index on
    its server. ``device_ip`` is omitted: the schema makes it optional, and an invented address would
    mislead HCCL more than a missing one.

    Args:
        servers: ``(address, device count)`` per server; the address becomes ``server_id``.
        status: The table's ``status`` (``initializing`` makes a table the launcher waits on).

    Returns:
        The table as a JSON-ready dict.

    Raises:
        UsageError: no servers, an empty or repeated address, or a device count below 1.
    """
    problems = _server_problems(servers)
    if problems:
        raise UsageError("cannot generate a rank table", problems)
    server_list: List[Dict[str, Any]] = []
    next_rank = 0
    for address, count in servers:
        devices = [{"device_id": str(i), "rank_id": str(next_rank + i)} for i in range(count)]
        server_list.append({"server_id": address, "device": devices})
        next_rank += count
    return {"status": status, "version": "1.0", "server_count": str(len(server_list)),
            "server_list": server_list}


def _server_problems(servers: Sequence[Tuple[str, int]]) -> List[str]:
    if not servers:
        return ["no servers given"]
    problems = []
    seen = set()
    for address, count in servers:
        if not isinstance(address, str) or not address:
            problems.append(f"server address {address!r} must be a non-empty string")
        elif address in seen:
            problems.append(f"server {address} is listed twice")
        seen.add(address)
        if type(count) is not int or count < 1:
            problems.append(f"server {address}: device count {count!r} must be a positive integer")
    return problems


def build_local_table(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0,
                      master_addr: str = "127.0.0.1", master_port: int = 29500) -> RankTable:
    """The table for torchrun-style options: ``nnodes`` servers of ``nproc_per_node`` ranks each.

    Server ``i`` is ``node<i>`` and hosts ranks ``i*nproc_per_node .. (i+1)*nproc_per_node - 1``
    on devices ``0 .. nproc_per_node - 1``.

    Args:
        nproc_per_node: Ranks per server.
        nnodes: Number of servers.
        node_rank: This server's index; only checked against ``nnodes`` (the table is the same on
            every server).
        master_addr: Rendezvous master address (``RankTable.master_addr``).
        master_port: Rendezvous master port.

    Raises:
        UsageError: a count is not a positive integer, ``node_rank`` is out of range, the address is
            empty or the port is not in 1..65535.
    """
    problems = [f"{name} must be a positive integer, got {value!r}"
                for name, value in (("nproc_per_node", nproc_per_node), ("nnodes", nnodes))
                if type(value) is not int or value < 1]
    if type(node_rank) is not int or node_rank < 0 or (not problems and node_rank >= nnodes):
        problems.append(f"node_rank must be in 0..nnodes-1, got {node_rank!r} for nnodes {nnodes!r}")
    if not isinstance(master_addr, str) or not master_addr:
        problems.append(f"master_addr must be a non-empty address, got {master_addr!r}")
    if type(master_port) is not int or not 0 < master_port < 65536:
        problems.append(f"master_port must be in 1..65535, got {master_port!r}")
    if problems:
        raise UsageError("invalid local topology", problems)
    servers = tuple(
        ServerEntry(f"node{node}", tuple(Device(node * nproc_per_node + i, i) for i in range(nproc_per_node)))
        for node in range(nnodes))
    return RankTable(servers=servers, format_version="generated", master_host=master_addr,
                     master_port=master_port)
