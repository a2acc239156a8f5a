"""The etcd client that the ``--coordinator*`` options describe: endpoints, TLS files, user and password.

The password never comes from the command line (``ps`` shows it to every user of the machine): it is
read from ``--coordinator-password-file`` (a Kubernetes Secret mounted as a file) or from
``$LAUNCHER_COORDINATOR_PASSWORD`` (a Secret as an environment variable), which
:func:`forget_password` then removes so that the ranks do not inherit it. Everything is checked
before the job starts, ``--dry-run`` included: a missing or bad file is exit 2.
"""

from typing import MutableMapping, Mapping, Optional

from launcher.cluster.etcdclient import EtcdClient
from launcher.cluster.etcdsecurity import EtcdRejected, Security
from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.inputfiles import InputFileError, read_bytes
from launcher.jobspec.runspec import CoordinatorSpec

#: A password file larger than this is not a password file.
MAX_PASSWORD_FILE = 4096


def coordinator_security(spec: CoordinatorSpec, environ: Mapping[str, str]) -> Security:
    """What ``spec`` (``--coordinator`` and its options) and ``environ`` say about TLS and authentication.

    Raises:
        UsageError: TLS files without TLS, a key without a certificate, a user without a password (or
            the reverse), an unreadable password file.
    """
    files = [(name, getattr(spec, name)) for name in ("cacert", "cert", "key")]
    given = [f"--coordinator-{name}" for name, path in files if path]
    if given and not spec.tls:
        raise UsageError(f"{', '.join(given)} with a plain --coordinator URL: use etcds://HOST:PORT for TLS")
    if spec.key and not spec.cert:
        raise UsageError("--coordinator-key without --coordinator-cert: give the certificate it belongs to")
    password = _password(spec.password_file, environ)
    if spec.user and password is None:
        raise UsageError(f"--coordinator-user {spec.user}: no password",
                         [f"give it in --coordinator-password-file or ${envnames.LAUNCHER_COORDINATOR_PASSWORD}"])
    if password is not None and not spec.user:
        raise UsageError("an etcd password without --coordinator-user: give the user it belongs to")
    return Security(spec.tls, spec.cacert, spec.cert, spec.key, spec.user or None, password)


def coordinator_client(spec: CoordinatorSpec, environ: Mapping[str, str]) -> EtcdClient:
    """The client for ``--coordinator`` (its TLS context built: a bad certificate file is exit 2).

    Raises:
        UsageError: see :func:`coordinator_security`, and files that do not make a TLS context.
    """
    try:
        return EtcdClient(list(spec.endpoints), security=coordinator_security(spec, environ))
    except EtcdRejected as exc:
        raise UsageError(f"--coordinator {spec.url}: {exc}") from None


def forget_password(environ: MutableMapping[str, str]) -> None:
    """Drop ``$LAUNCHER_COORDINATOR_PASSWORD`` once read: the ranks and helpers get ``environ``."""
    environ.pop(envnames.LAUNCHER_COORDINATOR_PASSWORD, None)


def _password(path: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
    """The password: the first line of the file at ``path``, else the variable, else None."""
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
