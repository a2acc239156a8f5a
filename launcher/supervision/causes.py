"""Why a rank failed at start-up, by what it wrote: the one table of known causes.

A rank that fails before its first step leaves its reason in its error file (torch's ``@record``)
or in the last lines of its log. Two kinds of cause change what the restart policy
(``launcher.supervision.restarts``) does:

- **transient**: the node, not the job, is not ready yet (a port still held by the job before, a
  device the last training process still holds). The attempt is retried after the cause's wait,
  without spending ``--max-restarts``.
- **deterministic**: the job cannot start as written (a syntax error, a missing module or file, a
  bad argument). The same error again on the next attempt ends the job: no restart can fix it.

The message texts are the tools' own, as users report them: MindSpore's TCP server
(``Failed to call bind, url: 127.0.0.1:2229 Address already in use``, then ``Failed to init the
tcp server``), torch's TCPStore (``The server socket has failed to bind to [::]:29500 (errno: 98 -
Address already in use)``), HCCL's ``EJ0001 ... Failed to initialize the HCCP process. Reason:
Maybe the last training process is running.`` (its own advice: wait 10 s and try again), and
Python's exception lines.

May import: nothing from ``launcher`` but ``launcher.common.records`` (pure: text in, cause out).
"""

import re
from typing import Optional, Tuple

from launcher.common.records import record

TRANSIENT = "transient"
DETERMINISTIC = "deterministic"

#: Transient retries in a row before a transient cause counts as an ordinary failure.
MAX_TRANSIENT_RETRIES = 3


@record(frozen=True)
class Cause:
    """One known cause of a start-up failure.

    Attributes:
        name: Its name in events (``port-in-use``, ``syntax-error``, ...).
        kind: ``transient`` or ``deterministic``.
        what: What it means, for the launcher's line.
        pattern: A regular expression, searched in each line of what the rank wrote (the last match
            wins). Text, not compiled here: only a failed rank needs it, and ``re`` compiles it once,
            on that first search (compiling the table at import cost every launch about 0.5 ms).
        wait: Seconds to wait before retrying (transient causes).
    """

    name: str
    kind: str
    what: str
    pattern: str
    wait: float = 0.0


#: Every known cause; transient ones first (a transient message may come with a Python exception).
CAUSES: Tuple[Cause, ...] = (
    Cause("mindspore-port-in-use", TRANSIENT, "the MindSpore scheduler's port is still in use",
          r"Failed to call bind, url: \S+ Address already in use", wait=5.0),
    Cause("tcpstore-port-in-use", TRANSIENT, "the rendezvous (TCPStore) port is still in use",
          r"server socket has failed to bind to \S+ \(errno: 98 - Address already in use\)", wait=5.0),
    Cause("hccp-busy", TRANSIENT, "HCCL EJ0001: the last training process may still hold the device",
          r"EJ0001\b.*|Failed to initialize the HCCP process", wait=10.0),
    Cause("syntax-error", DETERMINISTIC, "a syntax error", r"^\s*(SyntaxError|IndentationError|TabError): .*"),
    Cause("missing-module", DETERMINISTIC, "a module that cannot be imported",
          r"^\s*(ModuleNotFoundError|ImportError): .*"),
    Cause("missing-file", DETERMINISTIC, "a missing file",
          r"^\s*FileNotFoundError: .*|^.*can't open file .*No such file or directory.*"),
    Cause("bad-argument", DETERMINISTIC, "a bad command-line argument",
          r"^\S+: error: (unrecognized arguments|the following arguments are required|argument ).*"),
)


@record(frozen=True)
class Diagnosis:
    """A failure's known cause, and the line that showed it (the same line = the same failure)."""

    cause: Cause
    line: str


def classify(text: str) -> Optional[Diagnosis]:
    """The known cause of a failure from what the rank wrote (``text``: its last lines), or None.

    A transient cause anywhere in the text wins over a deterministic one (HCCL's error comes with a
    Python exception); among lines of one kind the last one is the failure's own.
    """
    lines = text.splitlines()
    for kind in (TRANSIENT, DETERMINISTIC):
        for line in reversed(lines):
            for cause in CAUSES:
                if cause.kind != kind:
                    continue
                match = re.search(cause.pattern, line)
                if match:
                    return Diagnosis(cause, match.group(0).strip()[:300])
    return None
