"""Writes the launcher can live without (logs, events, run-dir records): report a failure once.

A full or failing disk must not stop a healthy job: the launcher says once what it can no longer
write, and why, then carries on supervising.
"""

import logging
from typing import Hashable, Set


class WarnOnce:
    """Logs a warning the first time a key is seen, and stays quiet for it afterwards.

    Args:
        logger: The caller's logger, so the line names the module that failed.
    """

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        self._seen: Set[Hashable] = set()

    def __call__(self, key: Hashable, message: str, *args: object) -> bool:
        """Warn ``message % args`` unless ``key`` was warned about before; returns whether it warned."""
        if key in self._seen:
            return False
        self._seen.add(key)
        self._logger.warning(message, *args)
        return True
