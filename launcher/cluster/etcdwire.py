"""The etcd v3 JSON gateway's wire format: request bodies (keys and values base64-encoded, a range
end covering a prefix) and what comes back (answers and watch-stream messages).

Everything etcd sends goes through the launcher's bounded JSON reader (``loads_json``) with a size
cap, and anything that is not the shape etcd gives is a reason to ask again, never an exception:
a proxy, a rebuilt cluster or a stranger on the port may answer instead.
"""

import base64
import http.client
import socket
import ssl
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from launcher.common.inputfiles import loads_json

#: The largest answer or watch message read from etcd: a range of every record of a 10,000-node job fits.
LIMIT_ANSWER = 64 * 1024 * 1024


class Changes(NamedTuple):
    """One message of a watch stream: its revision and its events, ``(key, value)`` with value None
    for a deleted key (an expired lease's key too)."""

    revision: int
    events: List[Tuple[str, Optional[bytes]]]


def b64(text: str) -> str:
    """``text`` as the gateway wants a key: UTF-8, base64-encoded."""
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def watch_changes(response: http.client.HTTPResponse) -> Iterator[Changes]:
    """Each message of a watch stream, until it closes, stalls or breaks."""
    while True:
        try:
            line = response.readline(LIMIT_ANSWER + 1)
        except (OSError, socket.timeout, ssl.SSLError, http.client.HTTPException):
            return
        if not line or len(line) > LIMIT_ANSWER:
            return
        try:
            message = loads_json(line, "etcd", "watch stream of")
            result = message.get("result", {}) if isinstance(message, dict) else {}
        except ValueError:
            return
        if not isinstance(result, dict):
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


def holds(reply: dict, value: bytes, lease: int) -> bool:
    """Whether a failed create's transaction found its key holding ``value`` on ``lease``."""
    try:
        kvs = reply["responses"][0]["response_range"].get("kvs") or [{}]
        return base64.b64decode(kvs[0].get("value", "")) == value and int(kvs[0].get("lease", 0)) == lease
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return False


def answer(raw: bytes, where: str) -> dict:
    """An answer's body as a dict, through the bounded reader like any input; ``{"message": text}``
    when it is not JSON (too long, too deep, numbers out of range), ``{}`` when not an object."""
    try:
        if len(raw) > LIMIT_ANSWER:
            raise ValueError("too long")
        data = loads_json(raw or b"{}", where, "etcd answer from")
    except ValueError:  # InputFileError too
        data = {"message": raw[:200].decode("utf-8", "replace").strip()}
    return data if isinstance(data, dict) else {}


def put_body(key: str, value: bytes, lease: int = 0) -> dict:
    """The body of a put (``/v3/kv/put``, or a transaction's ``request_put``), on ``lease`` if given."""
    body: Dict[str, object] = {"key": b64(key), "value": base64.b64encode(value).decode()}
    if lease:
        body["lease"] = str(lease)
    return body

