"""The secured coordinator's options (``launcher.cluster.etcdconf``, ``etcdsecurity``): what is bad input
(exit 2 before anything starts, ``--dry-run`` included), where the password comes from and that no
message repeats it, torchrun's ``--rdzv-conf`` of its etcd backends, and how etcd's refusals read.
The real etcd with TLS and authentication is in tests/integration/test_etcd_secure.py."""

import os
import ssl
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from launcher.cluster.etcdconf import coordinator_client, coordinator_security, forget_password
from launcher.cluster.etcdsecurity import EtcdError, EtcdRejected, Security, rejection
from launcher.common.errors import UsageError
from launcher.jobspec.options import RunOptions, coordinator_tls, parse_coordinator
from launcher.jobspec.runspec import CoordinatorSpec, cluster_spec
from tests.helpers.cli import run_cli

SECRET = "hunter2-do-not-show"


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger, monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    """A self-signed certificate and its key, and the key of another certificate (openssl command)."""
    tmp = tmp_path_factory.mktemp("pem")
    for name in ("a", "b"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(tmp / f"{name}.key"), "-out", str(tmp / f"{name}.pem"),
                        "-days", "1", "-subj", f"/CN={name}"], check=True, capture_output=True)
    return tmp


def opts(**fields) -> CoordinatorSpec:
    return cluster_spec(RunOptions(command=("true",), **{"coordinator": "etcds://127.0.0.1:2379", **fields})).coordinator


@pytest.mark.parametrize("url, tls, endpoints", [
    ("etcd://h", False, [("h", 2379)]),
    ("http://h:1,g:2/", False, [("h", 1), ("g", 2)]),
    ("etcds://h:2", True, [("h", 2)]),
    ("HTTPS://10.0.0.1:2379", True, [("10.0.0.1", 2379)]),
])
def test_coordinator_schemes(url, tls, endpoints):
    assert parse_coordinator(url) == endpoints and coordinator_tls(url) is tls


def test_a_password_in_the_url_is_refused_without_being_repeated():
    with pytest.raises(UsageError) as caught:
        parse_coordinator(f"etcds://root:{SECRET}@h:2379")
    assert SECRET not in "\n".join(caught.value.lines()) and "etcds://***@h:2379" in caught.value.message


@pytest.mark.parametrize("fields, message", [
    ({"coordinator": "etcd://h:1", "coordinator_cacert": "/x"}, "--coordinator-cacert with a plain --coordinator URL"),
    ({"coordinator_key": "/k"}, "--coordinator-key without --coordinator-cert"),
    ({"coordinator_user": "u"}, "--coordinator-user u: no password"),
    ({"coordinator_cacert": "/nonexistent.pem"}, "CA bundle /nonexistent.pem: No such file or directory"),
    ({"coordinator_cacert": "/etc/hostname"}, "no PEM certificate in it"),
    ({"coordinator_user": "u", "coordinator_password_file": "/nonexistent"},
     "--coordinator-password-file /nonexistent: No such file or directory"),
    ({"coordinator_user": "u", "coordinator_password_file": "/dev/null"}, "not a regular file"),
])
def test_bad_input_is_a_usage_error(fields, message):
    with pytest.raises(UsageError) as caught:
        coordinator_client(opts(**fields), {})
    assert message in caught.value.message


def test_a_key_that_is_not_the_certificates_is_named(pem):
    with pytest.raises(UsageError, match="the key does not belong to the certificate"):
        coordinator_client(opts(coordinator_cert=str(pem / "a.pem"), coordinator_key=str(pem / "b.key")), {})
    client = coordinator_client(opts(coordinator_cacert=str(pem / "a.pem"), coordinator_cert=str(pem / "a.pem"),
                                     coordinator_key=str(pem / "a.key")), {})
    assert client.security.tls and isinstance(client._context, ssl.SSLContext)


def test_password_from_a_file_first_line_else_the_environment(tmp_path):
    secret = tmp_path / "password"
    secret.write_text(f"{SECRET}\n")
    env = {"LAUNCHER_COORDINATOR_PASSWORD": "from-env"}
    assert coordinator_security(opts(coordinator_user="u", coordinator_password_file=str(secret)), env).password == SECRET
    assert coordinator_security(opts(coordinator_user="u"), env).password == "from-env"
    with pytest.raises(UsageError, match="without --coordinator-user"):
        coordinator_security(opts(), env)
    secret.write_text("\n")
    with pytest.raises(UsageError, match="empty"):
        coordinator_security(opts(coordinator_user="u", coordinator_password_file=str(secret)), {})
    forget_password(env)
    assert env == {}


def test_a_fifo_as_password_file_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        coordinator_security(opts(coordinator_user="u", coordinator_password_file=str(fifo)), {})


def test_the_password_is_in_no_repr_nor_refusal():
    security = Security(True, user="u", password=SECRET)
    assert SECRET not in repr(security)
    for status, message in ((400, "etcdserver: authentication failed, invalid user ID or password"),
                            (403, "etcdserver: permission denied"), (401, "etcdserver: invalid auth token")):
        error = rejection("h:1", status, message, security)
        assert isinstance(error, EtcdRejected) and SECRET not in str(error)
    assert "etcd refused user 'u': wrong user name or password" in str(
        rejection("h:1", 400, "etcdserver: authentication failed, invalid user ID or password", security))


def test_outages_are_not_refusals():
    assert type(rejection("h:1", 503, "etcdserver: leader changed", Security())) is EtcdError
    assert type(rejection("h:1", None, ConnectionRefusedError(111, "Connection refused"), Security())) is EtcdError
    reset = rejection("h:1", None, ConnectionResetError(104, "Connection reset by peer"), Security())
    assert type(reset) is EtcdError and "etcds://" in str(reset)  # plain HTTP to a TLS port: a hint


def test_dry_run_refuses_bad_coordinator_files_exit_2(capsys):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--coordinator",
                             "etcds://127.0.0.1:2379", "--coordinator-cacert", "/nonexistent.pem", "--", "true")
    assert code == 2 and out == ""
    assert err.splitlines() == ["launcher: --coordinator etcds://127.0.0.1:2379: CA bundle /nonexistent.pem: "
                                "No such file or directory"]


def test_torchrun_etcd_rendezvous_conf_sets_the_coordinator(capsys, tmp_path, pem, monkeypatch):
    """torchrun's ``--rdzv-backend etcd --rdzv-endpoint H:P --rdzv-conf protocol=https,cacert=,cert=,key=``
    (and etcd-v2's spellings) is ``--coordinator etcds://H:P`` with the TLS files; its timeouts too."""
    # The mapping itself, key by key: tests/unit/commands/test_dropin_cli.py; here, through the CLI.
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                             "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-id", "j",
                             "--rdzv-conf", f"protocol=https,cacert={pem / 'a.pem'}", "--", "true")
    assert code == 0, err


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60), st.text(alphabet=st.characters(blacklist_characters="@"), min_size=1, max_size=20))
def test_any_coordinator_text_is_endpoints_or_one_usage_error_without_what_follows_a_user(url, secret):
    """Whatever the text: endpoints, or a UsageError; a ``user:SECRET@`` part never reaches the message."""
    for text in (url, f"etcds://u:{secret}zz@{url}"):
        try:
            endpoints = parse_coordinator(text)
        except UsageError as exc:
            if "@" in text:
                assert f"{secret}zz" not in "\n".join(exc.lines())
        else:
            assert all(isinstance(host, str) and 0 < port < 65536 for host, port in endpoints)
