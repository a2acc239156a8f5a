"""How the etcd client proves itself and checks etcd (TLS, user/password), and what etcd's refusals mean.

:class:`Security` holds what the coordinator options say (``etcds://``, ``--coordinator-cacert``,
``--coordinator-cert``, ``--coordinator-key``, ``--coordinator-user`` and the password); its
``password`` is never in its ``repr``. :func:`rejection` turns a failed call into the one line a user
can act on, and tells an outage (:class:`EtcdError`: retried, the job goes on) from a refusal that no
retry can change (:class:`EtcdRejected`: a certificate either side does not accept, a wrong password,
a missing permission).
"""

import dataclasses
import ssl
from typing import Optional, Union

from launcher.common.records import record


class EtcdError(Exception):
    """No endpoint answered, or one answered with an error."""


class EtcdRejected(EtcdError):
    """etcd and this client cannot work together as configured: retrying does not help."""


@record(frozen=True)
class Security:
    """TLS and authentication for one etcd cluster.

    Attributes:
        tls: HTTPS (``etcds://`` or ``https://``); the other files only make sense with it.
        cacert: PEM bundle of the CAs that sign etcd's certificate (None: the system's CAs).
        cert: PEM client certificate (may hold the key too).
        key: PEM key of ``cert``.
        user: etcd user name for ``/v3/auth/authenticate`` (None: no authentication).
        password: That user's password (never shown).
    """

    tls: bool = False
    cacert: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    user: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The TLS context (None without TLS): etcd's certificate is verified, host name included.

        Raises:
            EtcdRejected: a file is missing, unreadable or not what it should be (one line, naming it).
        """
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.cacert)
        except (OSError, ssl.SSLError) as exc:
            raise EtcdRejected(f"CA bundle {self.cacert}: {_reason(exc)}") from None
        if self.cert:
            try:
                context.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise EtcdRejected(f"client certificate {self.cert}"
                                   f"{f' with key {self.key}' if self.key else ''}: {_reason(exc)}") from None
        return context


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return {"KEY_VALUES_MISMATCH": "the key does not belong to the certificate",
                "NO_CERTIFICATE_OR_CRL_FOUND": "no PEM certificate in it",
                "PEM_LIB": "not a PEM certificate and key"}.get(str(exc.reason), str(exc.reason or exc))
    return getattr(exc, "strerror", None) or str(exc)


#: TLS alerts and errors: (text in the SSL error's reason, what to tell the user).
_TLS_REFUSALS = (
    ("WRONG_VERSION_NUMBER", "etcd does not speak TLS here: use etcd:// (plain HTTP), or check the port"),
    ("CERTIFICATE_REQUIRED", "etcd wants a client certificate: give --coordinator-cert and --coordinator-key"),
    ("UNKNOWN_CA", "etcd does not trust this client's certificate (signed by a CA it does not know)"),
    ("BAD_CERTIFICATE", "etcd refused this client's certificate (or its absence): check --coordinator-cert"),
    ("CERTIFICATE_UNKNOWN", "etcd refused this client's certificate: check --coordinator-cert"),
    ("CERTIFICATE_EXPIRED", "etcd says this client's certificate expired"),
)

#: etcd's answers that no retry changes: (text in its message, what to tell the user, or None: build it).
_ETCD_REFUSALS = (
    ("Client sent an HTTP request to an HTTPS server", "etcd speaks HTTPS here: use etcds://HOST:PORT and "
                                                       "--coordinator-cacert"),
    ("CommonName of client", "etcd has authentication on, and its JSON gateway refuses client certificates "
                             "with a Common Name (CVE-2018-16886): use a client certificate without CN, and "
                             "--coordinator-user"),
    ("authentication failed", None),
    ("permission denied", None),
    ("user name is empty", "etcd has authentication on: give --coordinator-user and the password"),
    ("invalid auth token", "etcd does not accept this client's token"),
)


def rejection(where: str, status: Optional[int], problem: Union[str, Exception],
              security: Security) -> EtcdError:
    """The error for a failed call to ``where`` (``host:port[path]``): HTTP ``status`` with etcd's
    message ``problem``, or (``status`` None) the exception the connection raised.

    Returns:
        :class:`EtcdRejected` for what the configuration must change, else :class:`EtcdError`.
    """
    if isinstance(problem, ssl.SSLCertVerificationError):
        return EtcdRejected(f"{where}: etcd's certificate is not trusted ({problem.verify_message}): "
                            "check --coordinator-cacert (and that the certificate names this host or address)")
    if isinstance(problem, ssl.SSLError):
        reason = str(problem.reason or problem)
        hint = next((text for key, text in _TLS_REFUSALS if key in reason), f"TLS failed ({reason})")
        return EtcdRejected(f"{where}: {hint}")
    if isinstance(problem, Exception):
        hint = "" if security.tls or not isinstance(problem, ConnectionResetError) else \
            " (if etcd speaks HTTPS: etcds://HOST:PORT)"
        return EtcdError(f"{where}: {getattr(problem, 'strerror', None) or problem}{hint}")
    for key, hint in _ETCD_REFUSALS:
        if key in problem:
            return EtcdRejected(f"{where}: {hint or _denied(key, security)}")
    return EtcdError(f"{where}: HTTP {status} {problem}".rstrip())


def _denied(key: str, security: Security) -> str:
    if key == "authentication failed":
        return f"etcd refused user {security.user!r}: wrong user name or password"
    if security.user:
        return (f"etcd denied user {security.user!r} (permission denied): grant it a role with readwrite "
                "on the prefix /launcher/")
    return "etcd denied access (permission denied): authentication is on, give --coordinator-user and the password"
