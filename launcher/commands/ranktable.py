"""``launcher ranktable``: show, validate and generate rank tables (``hccl.json``).

The commands parse their options and delegate to :mod:`launcher.jobspec.ranktable`; problems are raised as
``UsageError`` / ``LauncherError`` for ``launcher.commands.cli.main`` to print and turn into exit codes.
"""

import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from launcher.common.errors import UsageError
from launcher.jobspec.ranktable import (RankTable, RankTableError, generate_rank_table, load_rank_table,
                                        load_rank_table_document, parse_rank_table, validate_rank_table)

_FILE = click.Path(dir_okay=False)


@click.group()
def ranktable() -> None:
    """Show, validate and generate rank tables (hccl.json)."""


@ranktable.command()
@click.argument("file", type=_FILE)
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON object.")
def show(file: str, as_json: bool) -> None:
    """Print the servers and ranks of the rank table FILE."""
    table = load_rank_table(file)
    if as_json:
        click.echo(json.dumps(table_summary(table), indent=2))
        return
    revision = f", revision {table.revision}" if table.revision else ""
    click.echo(f"Rank table {table.source} (format {table.format_version}{revision})")
    rows = [("#", "server_id", "host_ip", "container_ip", "devices", "ranks")]
    rows += [(str(i), s.server_id, s.host_ip or "-", s.container_ip or "-", str(len(s.devices)),
              format_ranks(s.ranks)) for i, s in enumerate(table.servers)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    click.echo(f"World size: {table.world_size} ({table.server_count} servers, master {table.master_addr})")


@ranktable.command()
@click.argument("file", type=_FILE)
def validate(file: str) -> None:
    """Check the rank table FILE; list every problem."""
    data, revision = load_rank_table_document(file)
    problems = validate_rank_table(data)
    if problems:
        raise RankTableError(f"invalid rank table {file}", problems)
    table = parse_rank_table(data, source=file, revision=revision)
    click.echo(f"OK: {table.server_count} servers, {table.world_size} ranks (format {table.format_version})")


@ranktable.command()
@click.option("--server", "server_specs", multiple=True, metavar="ADDR[:NDEV]",
              help="A server and its device count (repeatable; IPv6 as [ADDR]:NDEV).")
@click.option("--servers", type=int, help="Number of servers, named node0, node1, ...")
@click.option("--devices", type=int, help="Devices per server (for --servers, or --server without :NDEV).")
@click.option("--output", "-o", type=_FILE, help="Write the table to this file instead of stdout.")
def generate(server_specs: Sequence[str], servers: Optional[int], devices: Optional[int],
             output: Optional[str]) -> None:
    """Write a version 1.0 rank table for the given servers."""
    table = generate_rank_table(_server_shape(server_specs, servers, devices))
    text = json.dumps(table, indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    _write_atomically(output, text)
    click.echo(f"wrote {output}: {len(table['server_list'])} servers", err=True)


def _server_shape(specs: Sequence[str], servers: Optional[int],
                  devices: Optional[int]) -> List[Tuple[str, int]]:
    if specs and servers is not None:
        raise UsageError("give either --server (repeatable) or --servers N, not both")
    if not specs and servers is None:
        raise UsageError("nothing to generate: give --server ADDR[:NDEV] ... or --servers N --devices M")
    if devices is not None and devices < 1:
        raise UsageError(f"--devices must be a positive integer, got {devices}")
    if servers is not None:
        if devices is None:
            raise UsageError("--servers needs --devices M")
        if servers < 1:
            raise UsageError(f"--servers must be a positive integer, got {servers}")
        return [(f"node{i}", devices) for i in range(servers)]
    return [_parse_server(spec, devices) for spec in specs]


def _parse_server(spec: str, default_devices: Optional[int]) -> Tuple[str, int]:
    """``ADDR[:NDEV]``; IPv6 addresses take a count only in brackets: ``[fe80::1]:8``."""
    address, count = spec, None
    if spec.startswith("[") and "]" in spec:
        address, _, rest = spec[1:].partition("]")
        count = rest[1:] if rest.startswith(":") else (rest or None)
    elif spec.count(":") == 1:
        address, _, count = spec.partition(":")
    if count is None:
        if default_devices is None:
            raise UsageError(f"--server {spec}: no device count; write ADDR:NDEV or pass --devices M")
        return address, default_devices
    if not (count.isdigit() and count.isascii()) or int(count) < 1:
        raise UsageError(f"--server {spec}: device count {count!r} must be a positive integer")
    return address, int(count)


def _write_atomically(path: str, text: str) -> None:
    # A reader (the launcher waiting on this file) must never see it half-written.
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ranktable-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def format_ranks(ranks: Sequence[int]) -> str:
    """Ranks as compact runs: ``0-7`` or ``0-3,8-11``."""
    runs: List[List[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def table_summary(table: RankTable) -> Dict[str, Any]:
    """The table as a JSON-ready dict (what ``show --json`` prints)."""
    return {
        "source": table.source,
        "format_version": table.format_version,
        "revision": table.revision,
        "status": table.status,
        "world_size": table.world_size,
        "server_count": table.server_count,
        "master_addr": table.master_addr,
        "servers": [{
            "index": i,
            "server_id": s.server_id,
            "host_ip": s.host_ip,
            "container_ip": s.container_ip,
            "super_pod_id": s.super_pod_id,
            "device_count": len(s.devices),
            "ranks": format_ranks(s.ranks),
            "devices": [{"rank_id": d.rank_id, "device_id": d.device_id, "device_ip": d.device_ip,
                         "super_device_id": d.super_device_id, "local_id": d.local_id} for d in s.devices],
        } for i, s in enumerate(table.servers)],
    }
