"""The etcd client that the ``--coordinator*`` options describe: endpoints, TLS files, user and password.

The password never comes from the command line (``ps`` shows it to every user of the machine): it is
read from ``--coordinator-password-file`` (a Kubernetes Secret mounted as a file) or from
``$LAUNCHER_COORDINATOR_PASSWORD`` (a Secret as an environment variable), which
:func:`forget_password` then removes so that the ranks do not inherit it. Everything is checked
before the job starts, ``--dry-run`` included: a missing or bad file is exit 2.
"""

from typing import Any, MutableMapping, Mapping, Optional

from launcher.cluster.etcdclient import EtcdClient
from launcher.cluster.etcdsecurity import EtcdRejected, Security
from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.inputfiles import InputFileError, read_bytes
from launcher.jobspec.options import coordinator_tls, parse_coordinator

#: A password file larger than this is not a password file.
MAX_PASSWORD_FILE = 4096


def coordinator_security(opts: Any, environ: Mapping[str, str]) -> Security:
    """What ``opts`` (RunOptions) and ``environ`` say about TLS and authentication.

    Raises:
        UsageError: TLS files without TLS, a key without a certificate, a user without a password (or
            the reverse), an unreadable password file.
    """
    tls = coordinator_tls(opts.coordinator or "")
    files = [(name, getattr(opts, f"coordinator_{name}")) for name in ("cacert", "cert", "key")]
    given = [f"--coordinator-{name}" for name, path in files if path]
    if given and not tls:
        raise UsageError(f"{', '.join(given)} with a plain --coordinator URL: use etcds://HOST:PORT for TLS")
    if opts.coordinator_key and not opts.coordinator_cert:
        raise UsageError("--coordinator-key without --coordinator-cert: give the certificate it belongs to")
    password = _password(opts, environ)
    if opts.coordinator_user and password is None:
        raise UsageError(f"--coordinator-user {opts.coordinator_user}: no password",
                         [f"give it in --coordinator-password-file or ${envnames.LAUNCHER_COORDINATOR_PASSWORD}"])
    if password is not None and not opts.coordinator_user:
        raise UsageError("an etcd password without --coordinator-user: give the user it belongs to")
    return Security(tls, opts.coordinator_cacert, opts.coordinator_cert, opts.coordinator_key,
                    opts.coordinator_user or None, password)


def coordinator_client(opts: Any, environ: Mapping[str, str]) -> EtcdClient:
    """The client for ``--coordinator`` (its TLS context built: a bad certificate file is exit 2).

    Raises:
        UsageError: see :func:`coordinator_security`, and files that do not make a TLS context.
    """
    endpoints = parse_coordinator(opts.coordinator)
    try:
        return EtcdClient(endpoints, security=coordinator_security(opts, environ))
    except EtcdRejected as exc:
        raise UsageError(f"--coordinator {opts.coordinator}: {exc}") from None


def forget_password(environ: MutableMapping[str, str]) -> None:
    """Drop ``$LAUNCHER_COORDINATOR_PASSWORD`` once read: the ranks and helpers get ``environ``."""
    environ.pop(envnames.LAUNCHER_COORDINATOR_PASSWORD, None)


def _password(opts: Any, environ: Mapping[str, str]) -> Optional[str]:
    """The password: the file's first line, else the variable, else None."""
    path = opts.coordinator_password_file
    if not path:
        return environ.get(envnames.LAUNCHER_COORDINATOR_PASSWORD)
    try:  # the one reader: a regular file only (a FIFO in its place does not hang the start), bounded
        raw = read_bytes(path, "coordinator password file", MAX_PASSWORD_FILE)
    except InputFileError as exc:
        raise UsageError(f"--coordinator-password-file: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--coordinator-password-file {path}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "replace").splitlines()
    if not text or not text[0]:
        raise UsageError(f"--coordinator-password-file {path}: empty")
    return text[0]
