"""Stand-in for ``taskd.api`` (MindCluster TaskD Manager API), for the launcher's tests.

TaskD is proprietary and not installable; this stand-in implements the documented API surface and
records calls for tests.

- ``init_taskd_manager(config) -> bool`` checks the documented keys and types (as TaskD's backend
  parses them: ``cluster_infos`` is a *list* of ``{ip, port, name, role}`` string entries there, so
  a dict is rejected like the real ``json.Unmarshal`` rejects it), records the config as JSON in
  ``$TASKD_STUB_DIR/manager-config-<pid>.json`` and returns True (False, with a reason on stderr,
  for a bad config).
- ``start_taskd_manager() -> bool`` listens on ``$POD_IP`` (else 127.0.0.1) port 9601 like TaskD -
  ``$TASKD_STUB_PORT`` overrides the port for tests - writes ``$TASKD_STUB_DIR/manager-started-<pid>``
  (a timestamp), then serves forever. A client line ``crash`` makes it ``os._exit(3)``; ``ping``
  answers ``pong``; ``$TASKD_STUB_CRASH_AFTER`` seconds make it crash on its own. Returns False
  without ``init_taskd_manager`` or when the port cannot be bound.
"""

import json
import os
import selectors
import socket
import sys
import time
from typing import Any, Optional

DEFAULT_PORT = 9601
CRASH_EXIT_CODE = 3

_STR_KEYS = ("job_id", "plugin_dir", "fault_recover", "taskd_enable")
_INT_KEYS = ("node_nums", "proc_per_node")
_CLUSTER_INFO_KEYS = ("ip", "port", "name", "role")

_config: Optional[dict] = None


def _say(message: str) -> None:
    print(f"taskd stub: {message}", file=sys.stderr, flush=True)


def _record(name: str, text: str) -> None:
    """Write ``$TASKD_STUB_DIR/<name>`` atomically (tests poll for it)."""
    stub_dir = os.environ.get("TASKD_STUB_DIR")
    if not stub_dir:
        return
    path = os.path.join(stub_dir, name)
    tmp = os.path.join(stub_dir, f".{name}.tmp")  # hidden: must not match the tests' "manager-started-*" globs
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _config_problem(config: Any) -> Optional[str]:
    if not isinstance(config, dict):
        return f"config must be a dict, not {type(config).__name__}"
    for key in ("job_id", "node_nums", "proc_per_node"):
        if key not in config:
            return f"missing key {key!r}"
    for key in _STR_KEYS:
        if key in config and not isinstance(config[key], str):
            return f"{key} must be a str, not {type(config[key]).__name__}"
    for key in _INT_KEYS:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{key} must be a positive int, not {value!r}"
    if "cluster_infos" in config:
        infos = config["cluster_infos"]
        if not isinstance(infos, list):
            return ("cluster_infos must be a list of {ip, port, name, role} (TaskD's backend parses "
                    f"[]ClusterInfo), not {type(infos).__name__}")
        for info in infos:
            if not isinstance(info, dict) or any(not isinstance(info.get(k, ""), str) for k in _CLUSTER_INFO_KEYS):
                return f"cluster_infos entries must map ip/port/name/role to str, got {info!r}"
    unknown = sorted(set(config) - set(_STR_KEYS) - set(_INT_KEYS) - {"cluster_infos"})
    if unknown:
        _say(f"ignoring unknown config keys {unknown}")  # TaskD's json.Unmarshal ignores them too
    return None


def init_taskd_manager(config: dict) -> bool:
    """Check and record ``config``; True when it is valid."""
    global _config
    problem = _config_problem(config)
    if problem is not None:
        _say(f"init_taskd_manager: {problem}")
        return False
    _config = dict(config)
    _record(f"manager-config-{os.getpid()}.json", json.dumps(config, sort_keys=True))
    _say(f"init_taskd_manager({json.dumps(config, sort_keys=True)})")
    return True


def _port() -> int:
    override = os.environ.get("TASKD_STUB_PORT")
    return int(override) if override else DEFAULT_PORT


def start_taskd_manager() -> bool:
    """Listen and serve forever; False when not initialised or the port cannot be bound."""
    if _config is None:
        _say("start_taskd_manager: init_taskd_manager was not called")
        return False
    host, port = os.environ.get("POD_IP") or "127.0.0.1", _port()
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's net.Listen does
    try:
        server.bind((host, port))
    except OSError as exc:
        _say(f"start_taskd_manager: cannot listen on {host}:{port}: {exc.strerror or exc}")
        server.close()
        return False
    server.listen(16)
    # The log line first: tests wait for the marker file and then read the log, so the marker must
    # only appear once everything it announces is already written.
    _say(f"listening on {host}:{port}")
    _record(f"manager-started-{os.getpid()}", f"{time.time():.6f}\n")
    crash_after = os.environ.get("TASKD_STUB_CRASH_AFTER")
    deadline = time.monotonic() + float(crash_after) if crash_after else None
    _serve(server, deadline)
    return True  # pragma: no cover - _serve never returns


def _serve(server: socket.socket, deadline: Optional[float]) -> None:
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, None)
    buffers = {}
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = sel.select(timeout)
        if deadline is not None and time.monotonic() >= deadline:
            _say("crashing: TASKD_STUB_CRASH_AFTER elapsed")
            os._exit(CRASH_EXIT_CODE)
        for key, _mask in ready:
            if key.data is None:
                conn, _addr = server.accept()
                sel.register(conn, selectors.EVENT_READ, conn)
                buffers[conn] = b""
                continue
            conn = key.data
            data = conn.recv(4096)
            if not data:
                sel.unregister(conn)
                buffers.pop(conn, None)
                conn.close()
                continue
            buffers[conn] += data
            *lines, buffers[conn] = buffers[conn].split(b"\n")
            for line in lines:
                command = line.strip().decode(errors="replace")
                if command == "crash":
                    _say("crashing: a client sent 'crash'")
                    os._exit(CRASH_EXIT_CODE)
                if command == "ping":
                    conn.sendall(b"pong\n")
