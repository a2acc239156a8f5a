"""Where the ranks come from and which server is this one.

Order (first that applies): ``--rank-table`` / ``$RANK_TABLE_FILE`` / the MindCluster default path;
``--nproc-per-node`` (the launcher builds the table); the operator's environment (``WORLD_SIZE`` /
``LOCAL_WORLD_SIZE`` / ``RANK`` for PyTorch, ``MS_WORKER_NUM`` / ``MS_LOCAL_WORKER`` /
``MS_NODE_RANK`` for MindSpore), which is turned into an equivalent ``--nproc-per-node`` table.
"""

import dataclasses
import errno
import logging
import os
import socket
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.records import record
from launcher.jobspec.options import DEFAULT_MASTER_PORT, DEFAULT_RANK_TABLE
from launcher.jobspec.ranktable.model import RankTable, ServerEntry
from launcher.jobspec.runspec import ClusterSpec

log = logging.getLogger(__name__)


@record(frozen=True)
class Topology:
    """The job's rank table and this server's place in it.

    Attributes:
        table: The rank table (read from a file or built by the launcher).
        server: This server's entry.
        source: Human description of where the table came from.
        table_file: Path of the rank table file, or None when the launcher built it.
        dynamic_cluster: MindSpore without a rank table: the msrun model (scheduler + workers).
        master_port: Rendezvous (PyTorch) or scheduler (MindSpore) port.
    """

    table: RankTable
    server: ServerEntry
    source: str
    table_file: Optional[str]
    dynamic_cluster: bool
    master_port: int

    @property
    def server_index(self) -> int:
        """Index of this server in the table (legacy ``SERVER_ID``)."""
        return self.table.server_index(self.server)

    @property
    def hosts_rank0(self) -> bool:
        """True on the server hosting global rank 0 (where the master / scheduler runs)."""
        return 0 in self.server.ranks


def rank_table_path(cluster: ClusterSpec, environ: Mapping[str, str]) -> Optional[str]:
    """The rank table file to use, or None when ranks come from options or the environment."""
    if cluster.rank_table:
        return cluster.rank_table
    if cluster.nproc_per_node is None and environ.get(envnames.RANK_TABLE_FILE):
        return environ[envnames.RANK_TABLE_FILE]
    if cluster.nproc_per_node is None and os.path.exists(DEFAULT_RANK_TABLE):
        return DEFAULT_RANK_TABLE
    return None


def resolve(cluster: ClusterSpec, framework: str, environ: Mapping[str, str],
            table: Optional[RankTable] = None) -> Topology:
    """Resolve the topology for ``cluster``.

    Args:
        cluster: The cluster group of the run's options.
        framework: Resolved framework name.
        environ: The launcher's environment.
        table: An already loaded rank table for ``rank_table_path(cluster, environ)``, if any.

    Raises:
        UsageError: no source of ranks, inconsistent options, or this server not found.
    """
    default_port = DEFAULT_MASTER_PORT[framework]
    if table is not None:
        server = locate_server(table, cluster.server_id, environ)
        port = cluster.master_port or _env_int(environ, envnames.MASTER_PORT) or default_port
        if cluster.master_addr:  # the rank-0 server's table address may not be reachable from here
            table = dataclasses.replace(table, master_host=cluster.master_addr)
        return Topology(table, server, f"rank table {table.source}", table.source, False, port)
    nproc, nnodes, node_rank, source = _local_shape(cluster, framework, environ)
    master = cluster.master_addr or _env_master(framework, environ) or "127.0.0.1"
    port = cluster.master_port or _env_port(framework, environ)
    if port is None and nnodes == 1:  # one node: no other launcher needs to know the port in advance
        port = free_port(master)
    port = port or default_port
    from launcher.jobspec.ranktable.generate import build_local_table

    built = build_local_table(nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master, master_port=port)
    return Topology(built, built.servers[node_rank], source, None, framework == "mindspore", port)


def free_port(host: str) -> Optional[int]:
    """A TCP port free on ``host`` now (bind port 0, read it, close), or None when ``host`` is not local.

    What torchrun does for a local job whose store is not shared with its agent
    (``torch.distributed.elastic.utils.distributed.get_free_port``), with the same race: the port is
    not reserved, and another process may bind it before rank 0 (or the MindSpore scheduler) does;
    the kernel hands out port-0 ports round-robin through the ephemeral range, which makes an
    immediate reuse unlikely. An explicit ``--master-port`` avoids the race altogether.

    Raises:
        UsageError: ``host`` is not a host name (an empty or too long label).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(_idna_ascii(host), 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.bind(address)
            return sock.getsockname()[1]
    except OSError as exc:  # not an address of this host: the framework default
        log.debug("no free port on %s: %s", host, exc)
        return None
    except UnicodeError as exc:  # the idna codec refused it: an empty or too long label
        raise UsageError(f"master address {host!r} (--master-addr or the environment's) is not a host name: "
                         f"{exc.__cause__ or exc}") from None


def _idna_ascii(host: str) -> Union[str, bytes]:
    """``host`` as ``getaddrinfo`` has the idna codec encode it, done here for what the codec passes
    through unchanged (ASCII, every label 1-63 characters but the last, which may be empty): the
    address of almost every run, which then does not import the codec (with ``stringprep`` and
    ``unicodedata``, about 1 ms of the launch). Anything else is left to the codec, errors included."""
    labels = host.split(".")
    if host.isascii() and all(0 < len(label) < 64 for label in labels[:-1]) and len(labels[-1]) < 64:
        return host.encode("ascii")
    return host


def _local_shape(cluster: ClusterSpec, framework: str, environ: Mapping[str, str]):
    if cluster.nproc_per_node is not None:
        if cluster.node_rank >= cluster.nnodes:
            raise UsageError(f"--node-rank {cluster.node_rank} must be below --nnodes {cluster.nnodes}")
        return cluster.nproc_per_node, cluster.nnodes, cluster.node_rank, "--nproc-per-node"
    if framework == "mindspore":
        names = (envnames.MS_WORKER_NUM, envnames.MS_LOCAL_WORKER, envnames.MS_NODE_RANK)
    else:
        names = (envnames.WORLD_SIZE, envnames.LOCAL_WORLD_SIZE, envnames.RANK)
    if not all(environ.get(n) for n in names):
        raise UsageError(
            "no ranks to start: give --rank-table FILE, set RANK_TABLE_FILE, or use --nproc-per-node N",
            [f"(or set {', '.join(names)} as the Ascend Operator does)"])
    world, local, node_rank = (_env_int(environ, n, required=True) for n in names)
    if world < 1:
        raise UsageError(f"{names[0]}={world} must be positive")
    if local < 1 or world % local:
        raise UsageError(f"{names[0]}={world} is not a multiple of {names[1]}={local}")
    if not 0 <= node_rank < world // local:
        raise UsageError(f"{names[2]}={node_rank} is out of range for {world // local} nodes")
    return local, world // local, node_rank, f"environment ({', '.join(names)})"


def _env_master(framework: str, environ: Mapping[str, str]) -> Optional[str]:
    name = envnames.MS_SCHED_HOST if framework == "mindspore" else envnames.MASTER_ADDR
    return environ.get(name) or None


def _env_port(framework: str, environ: Mapping[str, str]) -> Optional[int]:
    name = envnames.MS_SCHED_PORT if framework == "mindspore" else envnames.MASTER_PORT
    return _env_int(environ, name)


def _env_int(environ: Mapping[str, str], name: str, required: bool = False) -> Optional[int]:
    raw = environ.get(name)
    if raw in (None, ""):
        if required:
            raise UsageError(f"{name} is not set")
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer") from None


def locate_server(table: RankTable, server_id: Optional[str], environ: Mapping[str, str]) -> ServerEntry:
    """Find this server in ``table``: ``--server-id``, else ``XDL_IP``, else ``POD_IP``, else own addresses.

    Raises:
        UsageError: zero or several servers match; the message names the candidates.
    """
    if server_id:
        return _exactly_one(table, [server_id], "--server-id")
    node_ip, pod_ip = environ.get(envnames.XDL_IP), environ.get(envnames.POD_IP)
    if node_ip and pod_ip and len(table.find_servers([node_ip])) > 1:
        # Several pods of the job on one node share its address: the pod address tells them apart.
        matches = [s for s in table.find_servers([node_ip]) if pod_ip in s.addresses]
        if len(matches) == 1:
            return matches[0]
    for label, value in ((envnames.XDL_IP, node_ip), (envnames.POD_IP, pod_ip)):
        if value:
            return _exactly_one(table, [value], label)
    return _exactly_one(table, host_addresses(), "this host's addresses")


def _exactly_one(table: RankTable, addresses: Sequence[str], label: str) -> ServerEntry:
    matches = table.find_servers(addresses)
    if len(matches) == 1:
        return matches[0]
    known = ", ".join("/".join(s.addresses) for s in table.servers)
    shown = ", ".join(addresses)
    if not matches:
        raise UsageError(f"this server ({label}: {shown}) is not in the rank table",
                         [f"servers in the table: {known}", "pass --server-id ADDR to choose one"])
    names = "; ".join("/".join(s.addresses) for s in matches)
    raise UsageError(f"{label} ({shown}) matches several servers in the rank table: {names}",
                     ["pass --server-id ADDR with one exact address"])


def host_addresses() -> List[str]:
    """Every IPv4/IPv6 address of this host (interfaces first, then the hostname's)."""
    addresses: List[str] = []
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            addresses.extend(e.address.split("%")[0] for e in entries if e.family in (socket.AF_INET, socket.AF_INET6))
    except (ImportError, OSError) as exc:  # psutil missing or /proc unreadable: fall back to DNS
        log.debug("interface addresses unavailable: %s", exc)
    try:
        addresses.extend(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return list(dict.fromkeys(addresses))


def advertised_address(topo: Topology, environ: Mapping[str, str]) -> str:
    """The address this server gives the other nodes when it joins an elastic job: where its ranks
    host the master if it comes to host global rank 0 (see :func:`regroup`).

    A rank table's server: its own table address (container IP, else server id), as the master of a
    full table is found. A table built from ``--nnodes``, whose servers are only ``node<i>``:
    ``POD_IP``, else ``XDL_IP``, else this host's fully qualified name (torchrun's default
    ``--local-addr``).
    """
    if topo.table_file is not None:
        return topo.server.container_ip or topo.server.server_id
    return environ.get(envnames.POD_IP) or environ.get(envnames.XDL_IP) or socket.getfqdn()


def moved_master(topo: Topology, servers: Sequence[int],
                 addresses: Optional[Mapping[int, str]] = None) -> Optional[Tuple[int, str]]:
    """Where the master goes in a generation that only ``servers`` run, when it moves: the index of
    the server that then hosts global rank 0 (the first kept one) and its address (``addresses``, the
    one it registered when it joined, else its table address). None while rank 0 stays where the job
    put it (its server is kept: it comes first)."""
    first = min(servers)
    entry = topo.table.servers[first]
    if 0 in entry.ranks:
        return None
    return first, (addresses or {}).get(first) or entry.container_ip or entry.server_id


def regroup(topo: Topology, servers: Sequence[int], addresses: Optional[Mapping[int, str]] = None,
            endpoint: Optional[Tuple[str, int]] = None) -> Topology:
    """The topology of a generation that only ``servers`` (indices into ``topo.table``) run: elastic
    membership (``--nnodes MIN:MAX``) after a node was lost or joined.

    The kept servers stay in table order with their devices; global ranks are renumbered
    contiguously (server by server), so the world size is the kept servers' devices. A file table no
    longer describes the job, so ``RANK_TABLE_FILE`` is not passed on (``table_file`` None).

    The master (``MASTER_ADDR``/``MASTER_PORT``, ``MS_SCHED_HOST``/``MS_SCHED_PORT``) stays the job's
    while the server hosting global rank 0 is kept. Without it, the master moves to the server that
    now hosts rank 0 (:func:`moved_master`), at ``endpoint`` when given (the address and port its
    launcher checked on its host and published: :func:`master_port_on`), else at its address with
    ``topo.master_port``. Every node computes the same master from the same members, registrations
    and published endpoint.

    Raises:
        ValueError: this server is not among ``servers``, or an index is out of range.
    """
    table, own = topo.table, topo.server_index
    if own not in servers or any(not 0 <= i < table.server_count for i in servers):
        raise ValueError(f"server {own} not among {sorted(servers)} of {table.server_count}")
    kept, next_rank, server = [], 0, topo.server
    for index in sorted(set(servers)):
        entry = table.servers[index]
        devices = tuple(dataclasses.replace(d, rank_id=next_rank + i) for i, d in enumerate(entry.devices))
        next_rank += len(devices)
        kept.append(dataclasses.replace(entry, devices=devices))
        if index == own:
            server = kept[-1]
    source = f"{topo.source}, {len(kept)} of {table.server_count} servers (elastic)"
    regrouped = dataclasses.replace(table, servers=tuple(kept))
    port, moved = topo.master_port, moved_master(topo, servers, addresses)
    if moved is not None:
        address, port = endpoint or (moved[1], port)
        regrouped = dataclasses.replace(regrouped, master_host=address)
    return dataclasses.replace(topo, table=regrouped, server=server, source=source, table_file=None,
                               master_port=port)


def master_port_on(address: str, port: int) -> Tuple[int, str]:
    """The port the master takes on this host, where it moved with rank 0 (:func:`regroup`): ``port``
    if nothing listens there, else a free one; with the reason.

    The test binds the port, as rank 0's store (or MindSpore's scheduler) will: on the wildcard
    address (a PyTorch TCPStore listens on every address) and on ``address`` when it is one of this
    host's. ``SO_REUSEADDR`` as the store sets it, so that connections of an earlier store still in
    TIME_WAIT do not count. What torchrun's rank-0 agent does (``RendezvousStoreInfo.build`` picks a
    free port and publishes it through the store), with the same race: the port is not reserved
    until rank 0 binds it.
    """
    busy = port_in_use(address, port)
    if busy is None:
        return port, f"port {port} is free on {address}"
    other = free_port(_wildcard(address))
    if other is None:
        return port, f"port {port} is in use on {address} ({busy}) and no free port was found: kept"
    return other, f"port {port} is in use on {address} ({busy}): took free port {other}"


def port_in_use(address: str, port: int) -> Optional[str]:
    """Why ``port`` cannot be bound on this host for ``address`` (None: it can)."""
    family, places = socket.AF_INET, [(_wildcard(address), port)]
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        places.append(sockaddr)
    except OSError as exc:  # a name that does not resolve here: the wildcard alone says
        log.debug("cannot resolve %s: %s", address, exc)
    for where in places:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(where)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:  # not an address of this host: the wildcard says
                    return exc.strerror or str(exc)
    return None


def _wildcard(address: str) -> str:
    """The wildcard address of ``address``'s family (IPv4 when it does not resolve)."""
    try:
        family = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        family = socket.AF_INET
    return "::" if family == socket.AF_INET6 else "0.0.0.0"
