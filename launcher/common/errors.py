"""Exceptions that the CLI turns into exit codes and one-line messages (never a traceback).

``UsageError`` (exit 2): the user's input is wrong (options, config, rank table, missing command).
``LauncherError`` (exit 1): a runtime failure (timeout, a rank failed, an unwritable directory).
Both carry a list of problems; the CLI prints one line per problem.
"""

from typing import Iterable, List, Optional


class LauncherError(Exception):
    """A runtime failure: exit code 1 unless ``exit_code`` says otherwise."""

    exit_code = 1

    def __init__(self, message: str, problems: Optional[Iterable[str]] = None,
                 exit_code: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.problems: List[str] = list(problems or [])
        if exit_code is not None:
            self.exit_code = exit_code

    def lines(self) -> List[str]:
        """``launcher: <message>`` followed by one indented line per problem (what users see)."""
        return [f"launcher: {self.message}"] + [f"  {p}" for p in self.problems]


class UsageError(LauncherError):
    """Bad input from the user: exit code 2."""

    exit_code = 2
