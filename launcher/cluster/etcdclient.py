"""A small etcd v3 client: the JSON gateway (``/v3/...``) over ``http.client``, nothing else.

Only what the coordinator needs (docs/multinode.md, "Coordinator on etcd"): range over a prefix,
put, create-if-absent (a transaction comparing ``create_revision`` with 0), delete, leases (grant,
keep alive, revoke) and a watch stream. Keys and values travel base64-encoded, as the gateway
wants. The standard library client was chosen over the registry's packages for its footprint:
docs/multinode.md has the import time and memory of both.

Every call tries each endpoint in turn with one timeout and raises :class:`EtcdError` when none
answers; retrying is the caller's business (it knows whether it may wait). Each answer's header
tells the cluster's id (``cluster_id``), which a rebuilt cluster may change.
"""

import base64
import http.client
import json
import socket
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple


class EtcdError(Exception):
    """No endpoint answered, or one answered with an error."""


class Changes(NamedTuple):
    """One message of a watch stream: its revision and its events, ``(key, value)`` with value None
    for a deleted key (an expired lease's key too)."""

    revision: int
    events: List[Tuple[str, Optional[bytes]]]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


class EtcdClient:
    """Calls to one etcd cluster.

    Args:
        endpoints: ``(host, port)`` of each member; the first that answers is used, and kept first.
        timeout: Seconds for one call to one endpoint.

    Attributes:
        cluster_id: The cluster id of the last answer (None before the first).
    """

    def __init__(self, endpoints: Sequence[Tuple[str, int]], timeout: float = 2.0):
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.cluster_id: Optional[str] = None

    def _call(self, path: str, body: dict) -> dict:
        errors = []
        for index, (host, port) in enumerate(list(self.endpoints)):
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            try:
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = json.loads(response.read() or b"{}")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                errors.append(f"{host}:{port}: {getattr(exc, 'strerror', None) or exc}")
                continue
            finally:
                conn.close()
            if response.status != 200:
                raise EtcdError(f"{host}:{port}{path}: HTTP {response.status} {data.get('message', '')}".rstrip())
            if index:  # a member that answers goes first next time
                self.endpoints.insert(0, self.endpoints.pop(index))
            header = data.get("header") or data.get("result", {}).get("header") or {}
            self.cluster_id = header.get("cluster_id", self.cluster_id)
            return data
        raise EtcdError("; ".join(errors))

    def range(self, prefix: str, range_end: Optional[str] = None) -> Tuple[int, Dict[str, bytes]]:
        """Every key under ``prefix`` (from ``prefix`` up to ``range_end`` when given):
        ``(revision, {key: value})``."""
        end = _b64(range_end) if range_end is not None else _prefix_end(prefix)
        data = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": end})
        kvs = {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
               for kv in data.get("kvs", ())}
        return int(data.get("header", {}).get("revision", 0)), kvs

    def get(self, key: str) -> Optional[bytes]:
        """The value of ``key``, or None when it does not exist."""
        return self.range(key, key + "\0")[1].get(key)

    def count(self, prefix: str) -> int:
        """How many keys there are under ``prefix`` (etcd counts them: no key travels)."""
        data = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix), "count_only": True})
        return int(data.get("count", 0))

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        """Set ``key`` (attached to ``lease`` when not 0: it goes when the lease does)."""
        self._call("/v3/kv/put", _put(key, value, lease))

    def create(self, key: str, value: bytes, lease: int = 0, also: Sequence[Tuple[str, bytes, int]] = ()) -> bool:
        """Put ``key`` only if it does not exist, in one transaction with the puts in ``also``.

        Returns:
            False when ``key`` existed (nothing written).
        """
        compare = [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
        success = [{"request_put": _put(key, value, lease)}] + [{"request_put": _put(*put)} for put in also]
        return bool(self._call("/v3/kv/txn", {"compare": compare, "success": success}).get("succeeded"))

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id."""
        return int(self._call("/v3/lease/grant", {"TTL": ttl})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; returns its new TTL, 0 when the lease is gone."""
        return int(self._call("/v3/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys are deleted."""
        self._call("/v3/lease/revoke", {"ID": lease})

    def watch(self, prefix: str, start_revision: int, idle: float,
              range_end: Optional[str] = None) -> Iterator[Changes]:
        """Follow changes under ``prefix`` (up to ``range_end`` when given) from ``start_revision``;
        yields each message's :class:`Changes`.

        Ends (returns) when the stream closes or stays silent for ``idle`` seconds, which the
        caller treats like any other reason to read the prefix again.

        Raises:
            EtcdError: no endpoint accepted the watch.
        """
        host, port = self.endpoints[0]
        conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            end = _b64(range_end) if range_end is not None else _prefix_end(prefix)
            body = {"create_request": {"key": _b64(prefix), "range_end": end,
                                       "start_revision": str(start_revision)}}
            try:
                conn.request("POST", "/v3/watch", json.dumps(body), {"Content-Type": "application/json"})
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self.endpoints.append(self.endpoints.pop(0))  # try the next member next time
                raise EtcdError(f"{host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
            if conn.sock is not None:
                conn.sock.settimeout(idle)
            yield from _watch_changes(response)
        finally:
            conn.close()


def _watch_changes(response: http.client.HTTPResponse) -> Iterator[Changes]:
    """Each message of a watch stream, until it closes, stalls or breaks."""
    while True:
        try:
            line = response.readline()
        except (OSError, socket.timeout, http.client.HTTPException):
            return
        if not line:
            return
        try:
            result = json.loads(line).get("result", {})
        except ValueError:
            return
        if result.get("canceled") or result.get("compact_revision"):
            return
        try:
            events = [(base64.b64decode(kv.get("key", "")).decode(errors="replace"),
                       None if event.get("type") == "DELETE" else base64.b64decode(kv.get("value", "")))
                      for event in result.get("events", ()) for kv in [event.get("kv", {})]]
            revision = int(result.get("header", {}).get("revision", 0))
        except (ValueError, TypeError, AttributeError):
            return  # not etcd's answer: the caller reads the range again
        yield Changes(revision, events)


def _put(key: str, value: bytes, lease: int = 0) -> dict:
    body: Dict[str, object] = {"key": _b64(key), "value": base64.b64encode(value).decode()}
    if lease:
        body["lease"] = str(lease)
    return body

