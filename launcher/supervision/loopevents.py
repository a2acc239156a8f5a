"""The events the supervisor's loop handles: plain data, importable without the process machinery
(``launcher prestop``'s client side and the control socket use them without loading procgroup)."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple, Union

from launcher.supervision.states import ExitInfo


@dataclass(frozen=True)
class RankExited:
    """A rank's main process ended."""

    rank: int
    info: ExitInfo


@dataclass(frozen=True)
class SignalReceived:
    """The launcher received a stop signal (SIGTERM, SIGINT, SIGHUP)."""

    signum: int


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ClusterUpdate:
    """The cluster asked something of this node (a ``launcher.cluster.resetfollow.ResetChange``)."""

    change: Any


@dataclass(frozen=True)
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
