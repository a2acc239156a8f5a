"""Writes the launcher can live without (logs, events, run-dir records): report a failure once.

A full or failing disk must not stop a healthy job: the launcher says once what it can no longer
write, and why, then carries on supervising.
"""

from typing import TYPE_CHECKING, Hashable, Set, Union

if TYPE_CHECKING:
    import logging


class WarnOnce:
    """Logs a warning the first time a key is seen, and stays quiet for it afterwards.

    Args:
        logger: The caller's logger, so the line names the module that failed; or its name, so a
            module on a path that must start fast (``launcher status``, ``prestop``) imports
            ``logging`` only when it has something to say.
    """

    def __init__(self, logger: "Union[logging.Logger, str]"):  # quoted: building a Union costs ~1 ms at import
        self._logger = logger
        self._seen: Set[Hashable] = set()

    def __call__(self, key: Hashable, message: str, *args: object) -> bool:
        """Warn ``message % args`` unless ``key`` was warned about before; returns whether it warned."""
        if key in self._seen:
            return False
        self._seen.add(key)
        if isinstance(self._logger, str):
            import logging

            self._logger = logging.getLogger(self._logger)
        self._logger.warning(message, *args)
        return True
