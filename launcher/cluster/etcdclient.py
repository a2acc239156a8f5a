"""A small etcd v3 client: the JSON gateway (``/v3/...``) over ``http.client``, nothing else.

Only what the coordinator needs (docs/multinode.md, "Coordinator on etcd"): range over a prefix,
put, create-if-absent (a transaction comparing ``create_revision`` with 0), delete, leases (grant,
keep alive, revoke) and a watch stream. Keys and values travel base64-encoded, as the gateway
wants. The standard library client was chosen over the registry's packages for its footprint:
docs/multinode.md has the import time and memory of both.

Every call tries each endpoint in turn with one timeout and raises :class:`EtcdError` when none
answers; retrying is the caller's business (it knows whether it may wait). Each answer's header
tells the cluster's id (``cluster_id``), which a rebuilt cluster may change.

A secured etcd (:class:`Security`): HTTPS with a CA bundle and a client certificate, and etcd's
user/password authentication: ``/v3/auth/authenticate`` gives a token that goes in the
``Authorization`` header of every call; etcd forgets tokens (their TTL, a restart), so a call
answered "invalid auth token" authenticates again and is sent once more. What etcd will never
accept (a certificate either side rejects, a wrong password, a missing permission) raises
:class:`EtcdRejected`, which callers do not retry. The password appears in no message.
"""

import base64
import http.client
import json
import select
import threading
import weakref
from typing import Dict, Iterator, Optional, Sequence, Tuple

from launcher.cluster.etcdsecurity import EtcdError, EtcdRejected, Security, rejection
from launcher.cluster.etcdwire import LIMIT_ANSWER, Changes, answer, b64, holds, prefix_end, put_body, watch_changes

__all__ = ["EtcdClient", "EtcdError", "EtcdRejected", "Security", "Unanswered"]


class Unanswered(EtcdError, OSError):
    """A request went out whole and no answer came: etcd may have applied it."""


class EtcdClient:
    """Calls to one etcd cluster.

    Args:
        endpoints: ``(host, port)`` of each member; the first that answers is used, and kept first.
        timeout: Seconds for one call to one endpoint.
        security: TLS and authentication (default: plain HTTP, no user).

    Attributes:
        cluster_id: The cluster id of the last answer (None before the first).

    Raises:
        EtcdRejected: ``security`` names files that do not make a TLS context (built here, once).
    """

    def __init__(self, endpoints: Sequence[Tuple[str, int]], timeout: float = 2.0,
                 security: Optional[Security] = None):
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.security = security or Security()
        self.cluster_id: Optional[str] = None
        self._context = self.security.ssl_context()
        self._token: Optional[str] = None
        self._token_lock = threading.Lock()  # three threads share one token
        self._local = threading.local()  # each thread's idle connections, by endpoint
        self._kept: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()  # idle ones, for close()
        self._kept_lock = threading.Lock()

    def _connect(self, host: str, port: int) -> http.client.HTTPConnection:
        if self._context is not None:
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _idle(self) -> Dict[Tuple[str, int], http.client.HTTPConnection]:
        idle = getattr(self._local, "idle", None)
        if idle is None:
            idle = self._local.idle = {}
        return idle

    def _post(self, host: str, port: int, path: str, body: dict, token: Optional[str],
              replay: bool = True) -> Tuple[int, dict, http.client.HTTPConnection]:
        """One request; returns the status, the answer (``{"message": text}`` when not JSON) and the
        connection (the caller closes it: a watch reads on; any other call's connection is kept for
        the thread's next call to the same endpoint, closing it then is a no-op).

        A connection kept from an earlier call saves etcd a TCP (and TLS) handshake per call. One that
        etcd closed while it was idle is seen before use (its end is readable: urllib3's check) and
        replaced. Once used, a request goes again on a new connection only when etcd cannot have
        applied it (it did not get out whole), or when it may have but ``replay`` says that applying
        it twice is harmless (the kept connection closed without a byte of answer: etcd closed it as
        the request went, or after applying it).

        Raises:
            Unanswered: the request went out and no answer came (etcd may have applied it).
        """
        idle = self._idle()
        kept = self._take(idle, (host, port)) if path != "/v3/watch" else None
        response, conn = self._exchange(host, port, path, body, token, replay, kept)
        if path == "/v3/watch" and response.status == 200:
            return response.status, {"response": response}, conn
        try:
            raw = response.read(LIMIT_ANSWER + 1)
        except BaseException:
            conn.close()
            raise
        if path != "/v3/watch" and not response.will_close and response.isclosed():  # read to its end
            self._keep(idle, (host, port), conn)
            conn = _Kept()
        return response.status, answer(raw, f"{host}:{port}{path}"), conn

    def _exchange(self, host: str, port: int, path: str, body: dict, token: Optional[str], replay: bool,
                  kept: Optional[http.client.HTTPConnection]) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        """Send on ``kept`` (unless etcd closed it) or a new connection, and again on a new one where
        :meth:`_post` says it may; the answer's head and its connection."""
        if kept is not None and _dropped(kept):
            kept.close()
            kept = None
        try:
            return self._send(kept or self._connect(host, port), path, body, token)
        except Unanswered as exc:
            if kept is None or not replay or not isinstance(exc.__cause__, ConnectionError):
                raise
        except (OSError, http.client.HTTPException):
            if kept is None:
                raise  # a new connection that failed: nothing to fall back on
        return self._send(self._connect(host, port), path, body, token)  # etcd closed the kept one

    @staticmethod
    def _send(conn: http.client.HTTPConnection, path: str, body: dict,
              token: Optional[str]) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        """Send the request, then read the answer's head (Unanswered when that fails: the request
        went out whole, ``sendall`` returned)."""
        headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
        try:
            conn.request("POST", path, json.dumps(body), headers)
        except BaseException:
            conn.close()
            raise
        try:
            return conn.getresponse(), conn
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Unanswered(str(exc)) from exc
        except BaseException:
            conn.close()
            raise

    def _take(self, idle: Dict[Tuple[str, int], http.client.HTTPConnection],
              endpoint: Tuple[str, int]) -> Optional[http.client.HTTPConnection]:
        """This thread's kept connection to ``endpoint``, if any: close() leaves it alone from now on."""
        with self._kept_lock:
            kept = idle.pop(endpoint, None)
            if kept is not None:
                self._kept.discard(kept)
            return kept

    def _keep(self, idle: Dict[Tuple[str, int], http.client.HTTPConnection], endpoint: Tuple[str, int],
              conn: http.client.HTTPConnection) -> None:
        idle[endpoint] = conn
        with self._kept_lock:
            self._kept.add(conn)

    def close(self) -> None:
        """Close the connections kept for reuse, none that a call is using (a later call connects again)."""
        with self._kept_lock:
            for conn in list(self._kept):
                conn.close()
            self._kept = weakref.WeakSet()

    def _authorized(self, host: str, port: int, path: str, body: dict,
                    replay: bool = True) -> Tuple[int, dict, http.client.HTTPConnection]:
        """:meth:`_post` with this client's token, authenticating first and again when etcd forgot it
        (etcd refused the call: it applied nothing)."""
        if not self.security.user:
            return self._post(host, port, path, body, None, replay)
        token = self._token if self._token is not None else self._authenticate(host, port, None)
        status, data, conn = self._post(host, port, path, body, token, replay)
        if status == 401 and "invalid auth token" in str(data.get("message", "")):
            conn.close()
            status, data, conn = self._post(host, port, path, body, self._authenticate(host, port, token), replay)
        return status, data, conn

    def _authenticate(self, host: str, port: int, stale: Optional[str]) -> str:
        """A token for the user (a new one unless another thread replaced ``stale`` meanwhile)."""
        with self._token_lock:
            if self._token is not None and self._token != stale:
                return self._token
            body = {"name": self.security.user, "password": self.security.password}
            status, data, conn = self._post(host, port, "/v3/auth/authenticate", body, None)
            conn.close()
            if "authentication is not enabled" in str(data.get("message", "")):
                data["token"] = ""  # as etcdctl: a user for an etcd without authentication is no error
            elif status != 200 or not isinstance(data.get("token"), str):
                raise rejection(f"{host}:{port}", status, str(data.get("message", "")), self.security)
            self._token = data["token"]
            return self._token

    def _call(self, path: str, body: dict, replay: bool = True) -> dict:
        """The answer of the first endpoint that gives one. ``replay``: whether applying the call twice
        is harmless; if not, a call that went out unanswered is not sent again (here or to another
        member) and raises :class:`Unanswered`: the caller finds out what etcd holds."""
        errors, rejected = [], []
        for index, (host, port) in enumerate(list(self.endpoints)):
            try:
                status, data, conn = self._authorized(host, port, path, body, replay)
                conn.close()
            except EtcdRejected as exc:
                rejected.append(str(exc))
                continue
            except (OSError, http.client.HTTPException) as exc:
                problem = rejection(f"{host}:{port}", None, _cause(exc), self.security)
                if isinstance(exc, Unanswered) and not replay and not isinstance(problem, EtcdRejected):
                    raise Unanswered(f"{problem}: no answer, etcd may have applied {path}") from None
                (rejected if isinstance(problem, EtcdRejected) else errors).append(str(problem))
                continue
            if status != 200:
                raise rejection(f"{host}:{port}{path}", status, str(data.get("message", "")), self.security)
            if index:  # a member that answers goes first next time
                self.endpoints.insert(0, self.endpoints.pop(index))
            header = data.get("header") or data.get("result", {}).get("header") or {}
            self.cluster_id = header.get("cluster_id", self.cluster_id)
            return data
        if rejected:
            raise EtcdRejected("; ".join(rejected + errors))
        raise EtcdError("; ".join(errors))

    def range(self, prefix: str, range_end: Optional[str] = None) -> Tuple[int, Dict[str, bytes]]:
        """Every key under ``prefix`` (from ``prefix`` up to ``range_end`` when given):
        ``(revision, {key: value})``."""
        end = b64(range_end) if range_end is not None else prefix_end(prefix)
        data = self._call("/v3/kv/range", {"key": b64(prefix), "range_end": end})
        kvs = {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
               for kv in data.get("kvs", ())}
        return int(data.get("header", {}).get("revision", 0)), kvs

    def get(self, key: str) -> Optional[bytes]:
        """The value of ``key``, or None when it does not exist."""
        return self.range(key, key + "\0")[1].get(key)

    def count(self, prefix: str) -> int:
        """How many keys there are under ``prefix`` (etcd counts them: no key travels)."""
        data = self._call("/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix), "count_only": True})
        return int(data.get("count", 0))

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        """Set ``key`` (attached to ``lease`` when not 0: it goes when the lease does)."""
        self._call("/v3/kv/put", put_body(key, value, lease))

    def create(self, key: str, value: bytes, lease: int = 0, also: Sequence[Tuple[str, bytes, int]] = ()) -> bool:
        """Put ``key`` only if it does not exist, in one transaction with the puts in ``also``.

        Safe to send again after no answer (a kept connection closed, a timeout, another member): a
        key that exists with this very value and lease is this call's, applied by an earlier sending
        (the transaction reads it when the comparison fails); without that, an exclusive create
        applied twice answered False and the caller believed another node had created the key.

        Returns:
            False when ``key`` existed, written by another call (nothing written).
        """
        compare = [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
        success = [{"request_put": put_body(key, value, lease)}] + [{"request_put": put_body(*put)} for put in also]
        failure = [{"request_range": {"key": b64(key)}}]  # who holds it: this call, applied once already?
        data = self._call("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure})
        return bool(data.get("succeeded")) or holds(data, value, lease)

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id.

        Not sent again after it went out unanswered (Unanswered): each sending is a lease. The
        caller's retry grants another; the one etcd may have granted carries no key and expires after
        ``ttl`` seconds (it cannot be revoked: its id was in the lost answer).
        """
        return int(self._call("/v3/lease/grant", {"TTL": ttl}, replay=False)["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; returns its new TTL, 0 when the lease is gone."""
        return int(self._call("/v3/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys are deleted (a lease etcd does not know is ended already: a
        revocation sent again after etcd applied it unanswered is told so)."""
        try:
            self._call("/v3/lease/revoke", {"ID": lease})
        except EtcdRejected:
            raise
        except EtcdError as exc:
            if "requested lease not found" not in str(exc):
                raise

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
        end = b64(range_end) if range_end is not None else prefix_end(prefix)
        body = {"create_request": {"key": b64(prefix), "range_end": end, "start_revision": str(start_revision)}}
        try:
            status, data, conn = self._authorized(host, port, "/v3/watch", body)
        except (OSError, http.client.HTTPException) as exc:
            self.endpoints.append(self.endpoints.pop(0))  # try the next member next time
            raise rejection(f"{host}:{port}", None, _cause(exc), self.security) from None
        try:
            if status != 200:
                raise rejection(f"{host}:{port}/v3/watch", status, str(data.get("message", "")), self.security)
            if conn.sock is not None:
                conn.sock.settimeout(idle)
            yield from watch_changes(data["response"])
        finally:
            conn.close()


def _cause(exc: BaseException) -> BaseException:
    """What the connection raised (Unanswered wraps it)."""
    return exc.__cause__ if isinstance(exc, Unanswered) and exc.__cause__ is not None else exc


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether etcd closed an idle kept connection: its socket is readable (the end of the stream;
    an idle HTTP/1.1 connection has nothing else to read), as urllib3's ``is_connection_dropped``."""
    if conn.sock is None:
        return True
    try:  # poll, not select: a launcher with many ranks' pipes has descriptors past select's 1024
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class _Kept:
    """A connection kept for the thread's next call: the caller's ``close()`` leaves it open."""

    def close(self) -> None:
        pass
