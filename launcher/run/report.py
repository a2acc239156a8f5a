"""What a run leaves for its user: its log directories and, when it fails, the root-cause summary.

Each launcher invocation logs under ``<log-dir>/<session>/attempt_<n>/``; ``prune_attempt_logs``
bounds how many attempt directories a crash loop keeps. ``format_root_cause`` turns the supervisor's
``RunResult`` into the lines printed at the end of a failed run.
"""

import logging
import os
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from launcher.supervision import debugging
from launcher.supervision.output import tail_lines

if TYPE_CHECKING:
    from launcher.restore.plan import RestorePlan
    from launcher.supervision.policy import RunResult

log = logging.getLogger(__name__)


#: ``attempt_<n>`` log directories kept per session besides the first one: a crash loop with a large
#: ``--max-restarts`` must not fill the disk, and the first and the latest attempts are the telling ones.
KEEP_ATTEMPT_LOGS = 20


def prune_attempt_logs(log_session: str, current: int, keep: int = KEEP_ATTEMPT_LOGS,
                       in_use: Sequence[str] = ()) -> List[int]:
    """Delete this session's ``attempt_<n>`` log dirs but the first, the newest ``keep``, ``current``
    and those holding a log in use.

    Args:
        log_session: The session's log directory.
        current: The attempt about to start (never deleted).
        keep: Newest attempts kept (``current`` among them).
        in_use: Log files of running ranks (with recover-in-place, ranks of an older attempt).

    Returns:
        The attempt numbers whose directories were deleted.
    """
    try:
        names = os.listdir(log_session)
    except OSError:
        return []
    numbers = sorted(int(n[8:]) for n in names if n.startswith("attempt_") and n[8:].isdigit())
    busy = {os.path.basename(os.path.dirname(path)) for path in in_use}
    kept = set(numbers[:1]) | set(sorted(set(numbers) | {current})[-keep:]) | {current}
    removed = [n for n in numbers if n not in kept and f"attempt_{n}" not in busy]
    import shutil  # here, not at the top: shutil's imports (bz2, lzma) would delay the first ranks

    for number in removed:
        shutil.rmtree(os.path.join(log_session, f"attempt_{number}"), ignore_errors=True)
    return removed


def session_name() -> str:
    """Directory name of one launcher invocation's logs: time, then pid (sortable, unique)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"  # time, not datetime: one import less at start


def format_root_cause(result, log_lines: int = 10,
                      error_file: Callable[[object], Optional[str]] = lambda failure: None) -> List[str]:
    """The root-cause summary: which rank failed first, how, when, and why.

    Why, as torchrun shows it: the exception and traceback from the rank's ``TORCHELASTIC_ERROR_FILE``
    (written by torch's ``@record``), else the last traceback in the rank's log, else the log's last
    ``log_lines`` lines.

    Args:
        result: The supervisor's ``RunResult``.
        log_lines: Lines of the log shown when the rank left no traceback.
        error_file: ``failure -> path`` of that rank's error file (None when it has none).
    """
    cause = result.root_cause
    if cause is None:
        return []
    from datetime import datetime  # after a failure only

    when = datetime.fromtimestamp(cause.info.wall_time).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    lines = [f"job failed after {result.attempts} attempt(s): first failure of the last attempt was "
             f"{cause.label} ({cause.info.describe()}) at {when}"]
    if cause.hang:
        lines.append(f"{cause.label} was killed as hung: {cause.hang[0]}; where the local ranks were:")
        lines.extend(f"    {line}" for line in cause.hang[1:])
    earlier = result.failures[:-1]
    if earlier:
        lines.append("earlier failures: " + "; ".join(f"attempt {f.attempt} {f.label} {f.info.describe()}"
                                                       for f in earlier))
    from launcher.monitoring.errorfile import explain_failure  # after a failure only

    found = explain_failure(error_file(cause), cause.log_path)
    evidence: List[str] = []
    if found is not None:
        evidence = [found.message]
        lines.append(f"exception: {found.message}")
        if found.traceback:
            lines.append(f"traceback (from {found.source}):")
            lines.extend(f"    {line}" for line in found.traceback)
        if cause.log_path and found.source != cause.log_path:
            lines.append(f"log: {cause.log_path}")
    elif cause.log_path:
        tail = evidence = tail_lines(cause.log_path, log_lines)
        lines.append(f"last {len(tail)} line(s) of {cause.log_path}:")
        lines.extend(f"    {line}" for line in tail)
        lines.extend(debugging.root_cause_hint(cause.rank, tail))
    lines.extend(framework_hint(evidence))
    return lines


#: What MindSpore's init() raises when its cluster variables (MS_ROLE, MS_SCHED_HOST, ...) are missing.
MINDSPORE_WITHOUT_CLUSTER = "without using 'mpirun'"


def framework_hint(text: Sequence[str]) -> List[str]:
    """A line saying what to add when the failure is a MindSpore script started as another framework's."""
    if any(MINDSPORE_WITHOUT_CLUSTER in line for line in text):
        return ["the rank called MindSpore's init() without a MindSpore cluster's variables: add "
                "--framework mindspore (msrun's options, e.g. --worker_num, imply it)"]
    return []


def resume_summary(plan: "RestorePlan") -> str:
    """What the ranks resume from, in a few words: ``resuming from the step-70 breakpoint of rank 0``."""
    from launcher.restore.plan import KIND_BREAKPOINT, KIND_PERIODIC

    if plan.kind == KIND_BREAKPOINT:
        ranks = plan.restore_ranks
        return (f"resuming from the step-{plan.step} breakpoint of rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(str(r) for r in ranks)}")
    reshard = f", resharding {plan.conversion.summary()}" if plan.conversion is not None else ""
    if plan.dcp_dir is not None:
        return f"resuming from the step-{plan.step} DCP checkpoint {plan.dcp_dir}{reshard}"
    if plan.kind == KIND_PERIODIC:
        return f"resuming from the step-{plan.step} periodic checkpoints{reshard}"
    return f"starting from scratch ({plan.reason})"


def log_result(result: "RunResult", error_file: Callable, events_path: Optional[str]) -> None:
    """How the run ended, in the launcher's log: success, the root cause of a failure (``error_file``:
    a failure -> its rank's error file), or the stop; then the goodput summary of ``events_path``."""
    if result.reason == "succeeded":
        log.info("all ranks finished successfully (%d attempt(s))", result.attempts)
    elif result.reason in ("failed", "no-progress", "deterministic"):
        for line in format_root_cause(result, error_file=error_file):
            log.error("%s", line)
    else:
        log.info("stopped (%s); exit %d", result.reason, result.exit_code)
    if events_path is None:
        return
    from launcher.monitoring import goodput  # at the end: not on the path to the first rank
    from launcher.monitoring.events import read_events

    try:
        log.info("%s", goodput.compute(read_events(events_path)).summary())
    except (OSError, ValueError) as exc:  # its events file swapped for a FIFO or a symlink meanwhile
        log.warning("no goodput summary: %s", exc)
