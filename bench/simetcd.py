"""What one etcd server did, from its ``/metrics`` endpoint and ``/proc``: requests by method, bytes,
watch events, CPU time. Used by the coordination simulator (``bench.simnodes``)."""

import os
import re
import urllib.request
from dataclasses import dataclass
from typing import Dict

_SAMPLE = re.compile(r'^([a-z_]+)(?:\{([^}]*)\})? ([0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
#: Unary calls are counted when handled; the gateway opens a stream per watch and per keep-alive.
UNARY = ("Range", "Put", "Txn", "LeaseGrant", "LeaseRevoke", "DeleteRange")


@dataclass
class Sample:
    """Counters at one moment (all cumulative since etcd started)."""

    requests: Dict[str, float]
    watch_responses: float
    watch_events: float
    bytes_received: float
    bytes_sent: float
    cpu_s: float

    def minus(self, before: "Sample") -> dict:
        """What happened between ``before`` and this sample, as a flat dict for the tables."""
        methods = {m: self.requests.get(m, 0) - before.requests.get(m, 0) for m in self.requests}
        return {"requests": int(sum(methods.values())), **{f"req_{m}": int(v) for m, v in methods.items() if v},
                "watch_responses": int(self.watch_responses - before.watch_responses),
                "watch_events": int(self.watch_events - before.watch_events),
                "bytes_received": int(self.bytes_received - before.bytes_received),
                "bytes_sent": int(self.bytes_sent - before.bytes_sent),
                "cpu_s": round(self.cpu_s - before.cpu_s, 3)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sample(port: int, pid: int) -> Sample:
    """Scrape ``http://127.0.0.1:<port>/metrics`` and the process's CPU time."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        text = response.read().decode()
    requests: Dict[str, float] = {}
    found = {"watch_responses": 0.0, "watch_events": 0.0, "bytes_received": 0.0, "bytes_sent": 0.0}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), dict(_LABEL.findall(match.group(2) or "")), float(match.group(3))
        method = labels.get("grpc_method", "")
        if name == "grpc_server_handled_total" and method in UNARY:
            requests[method] = requests.get(method, 0) + value
        elif name == "grpc_server_msg_received_total" and method in ("Watch", "LeaseKeepAlive"):
            requests[method] = requests.get(method, 0) + value
        elif name == "grpc_server_msg_sent_total" and method == "Watch":
            found["watch_responses"] += value
        elif name == "etcd_debugging_mvcc_events_total":
            found["watch_events"] = value
        elif name == "etcd_network_client_grpc_received_bytes_total":
            found["bytes_received"] = value
        elif name == "etcd_network_client_grpc_sent_bytes_total":
            found["bytes_sent"] = value
    return Sample(requests, found["watch_responses"], found["watch_events"], found["bytes_received"],
                  found["bytes_sent"], cpu_seconds(pid))
