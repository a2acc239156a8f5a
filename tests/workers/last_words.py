"""A rank that prints one line (no flush) and is then SIGKILLed: the line survives only if the
launcher made its stdout unbuffered. The line carries the job id, to compare with ``--dry-run``."""

import os
import signal

print(f"last words of rank {os.environ['RANK_ID']} job {os.environ['JOB_ID']}")
os.kill(os.getpid(), signal.SIGKILL)
