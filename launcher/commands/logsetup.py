"""The launcher's own log lines: to stderr, prefixed ``[launcher]``, apart from the ranks' ``[rank N]``
output (for the click commands and ``launcher run``'s fast parser alike)."""

import logging
import sys

from launcher.supervision.console import ConsoleHandler, console_stderr


class _LauncherFormatter(logging.Formatter):
    """Prefixes the launcher's own lines so they stand apart from ``[rank N]`` output."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = "[launcher]" if record.levelno < logging.WARNING else f"[launcher {record.levelname}]"
        return f"{prefix} {self.formatTime(record, '%H:%M:%S')} {record.getMessage()}"


def setup_logging(verbose: int = 0) -> None:
    """Send the launcher's own log lines to stderr, prefixed ``[launcher]``.

    Through a non-blocking console when stderr is fd 2: a stderr nobody reads (a stopped pipe) must
    not stop the supervisor in the middle of a log line.
    """
    stderr = console_stderr()
    handler = logging.StreamHandler(sys.stderr) if stderr is None else ConsoleHandler(stderr)
    handler.setFormatter(_LauncherFormatter())
    root = logging.getLogger("launcher")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    root.propagate = False
