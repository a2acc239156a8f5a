"""The events the supervisor's loop handles: plain data, importable without the process machinery
(``launcher prestop``'s client side and the control socket use them without loading procgroup)."""

from typing import Any, Callable, Dict, Tuple, Union

from launcher.common.records import record
from launcher.supervision.states import ExitInfo


@record(frozen=True)
class RankExited:
    """A rank's main process ended."""

    rank: int
    info: ExitInfo


@record(frozen=True)
class SignalReceived:
    """The launcher received a stop signal (SIGTERM, SIGINT, SIGHUP)."""

    signum: int


@record(frozen=True)
class ControlRequest:
    """A request from ``launcher prestop`` / ``launcher exit`` over the control socket.

    Attributes:
        command: What is asked (``gasp``, ``exit``, ``status``).
        args: The request's parameters.
        reply: Send a JSON-serialisable answer; ``final=True`` closes the connection.
    """

    command: str
    args: Dict[str, Any]
    reply: Callable[..., None]


@record(frozen=True)
class ClusterUpdate:
    """The cluster asked something of this node (a ``launcher.cluster.resetfollow.ResetChange``)."""

    change: Any


@record(frozen=True)
class RankHung:
    """The hang detector (``launcher.run.hangwatch``) judged a rank hung: fail it like a crash.

    Attributes:
        rank: The hung rank.
        reason: Why (which timeout, for how long).
        diagnosis: Where every local rank was, one line per group of ranks (may be empty).
    """

    rank: int
    reason: str
    diagnosis: Tuple[str, ...] = ()


Event = Union[RankExited, SignalReceived, ControlRequest, ClusterUpdate, RankHung]
