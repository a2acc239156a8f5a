"""``python bench/scaleprobe.py OUT run ...``: the launcher's CLI, recording the CPU time of its main
thread (``time.thread_time``) in ``OUT`` (JSON lines) at each ``restart`` and ``restore_plan`` event,
for :mod:`bench.scalelive`: wall time on this shared machine is mostly other processes' (the events'
own ``ts`` still gives it). Only a record is added; the run is the launcher's own. Standard library
and ``launcher`` only (whichever ``launcher`` is first on ``PYTHONPATH``: the A/B runs older trees).
"""

import json
import sys
import time


def main(out: str, argv: list) -> int:
    """Run ``launcher`` with ``argv``, recording the two events' CPU times in ``out``."""
    from launcher.common import signals

    signals.install()  # first, as launcher.__main__ does for run
    from launcher.commands.cli import main as cli_main
    from launcher.run.session import Session

    emit = Session.emit

    def recorded(self, event: str, **fields: object) -> None:
        if event in ("restart", "restore_plan"):
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"event": event, "attempt": fields.get("attempt"), "cpu": time.thread_time()})
                         + "\n")
        emit(self, event, **fields)

    Session.emit = recorded
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
