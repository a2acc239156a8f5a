"""Prints, as one JSON line on its own stdout, what that stdout is: the file type, its open flags,
whether stderr shares it, and the buffering Python gave it. Standard library only, starts fast."""

import fcntl
import json
import os
import stat
import sys


def describe() -> dict:
    """Facts about fd 1 and ``sys.stdout`` that decide what a rank's ``print`` costs."""
    mode = os.fstat(1).st_mode
    return {
        "type": "file" if stat.S_ISREG(mode) else "pipe" if stat.S_ISFIFO(mode) else "other",
        "o_append": bool(fcntl.fcntl(1, fcntl.F_GETFL) & os.O_APPEND),
        "tty": os.isatty(1),
        "stderr_is_stdout": os.path.sameopenfile(1, 2),
        # Unbuffered (-u / PYTHONUNBUFFERED): a raw FileIO under a write-through text layer, one
        # write(2) per print; otherwise a BufferedWriter flushing every 8 KiB.
        "binary_layer": type(sys.stdout.buffer).__name__,
        "write_through": sys.stdout.write_through,
        "line_buffering": sys.stdout.line_buffering,
    }


print(json.dumps(describe(), sort_keys=True))
