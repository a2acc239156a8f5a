"""Everything one (re)start hands the ranks beyond the job-wide environment.

``attempt_specs`` composes, for one attempt, the restore plan's variables, the graceful-exit file,
whether a gasp save is allowed, the TaskD preload and torch's error file on top of
``rankenv.worker_specs``. ``launcher run`` and ``launcher run --dry-run`` both use it, so the dry
run shows exactly what a start would give each rank.
"""

import logging
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from launcher.supervision import debugging
from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.control.gasp import GRACEFUL_EXIT_FILE
from launcher.jobspec.runspec import PreloadSpec, RestoreSpec, RunSpec
from launcher.monitoring.heartbeats import HEARTBEAT_DIR, slot_path
from launcher.common.rundir import CONTROL_SOCKET
from launcher.jobspec.rankenv import EnvContext, WorkerSpec, worker_specs

PLAN_FILE = "restore_plan.json"
#: Lines of a failed rank's log the restart policy reads for a known start-up cause.
FAILURE_TEXT_LINES = 40

log = logging.getLogger(__name__)


def attempt_specs(spec: RunSpec, ctx: EnvContext, attempt: int, failed_before: Sequence[int], *,
                  log_session: str, gasp_allowed: bool, rank_env: Dict[str, str],
                  ckpt_index: object = None) -> Tuple[List[WorkerSpec], object]:
    """The processes of one attempt and the restore plan behind them (None without --checkpoint-dir).

    Args:
        spec: The run's options, parsed.
        ctx: Job-wide context.
        attempt: Restart count.
        failed_before: Ranks that failed in the previous attempt (fault ranks for the plan).
        log_session: This launcher invocation's log directory.
        gasp_allowed: Whether a dying-gasp save is allowed right now (``--gasp-min-interval``).
        rank_env: What the integrations give every rank (TaskD's variables; empty without any).
        ckpt_index: the session's :class:`launcher.restore.CheckpointIndex` (from
            :func:`checkpoint_index`), so the plan re-reads only what changed.
    """
    plan = None
    if spec.restore.checkpoint_dir:
        from launcher.restore import compute_plan

        plan = compute_plan(restore_inputs(spec.restore, ctx, failed_before), index=ckpt_index)
    common = {**rank_env, envnames.LAUNCHER_GRACEFUL_EXIT_FILE: os.path.join(ctx.run_dir, GRACEFUL_EXIT_FILE),
              envnames.LAUNCHER_GASP_SAVE_ALLOWED: "1" if gasp_allowed else "0"}
    if spec.restart.graceful_exit and ctx.framework == "mindspore" and envnames.MS_ENABLE_GRACEFUL_EXIT not in ctx.base_env:
        # Only on request (--graceful-exit), and an explicit operator value is inherited: on CPU the
        # flag adds an int32 all-reduce to stock TrainOneStepCell that the CPU kernel rejects
        # (examples/mindspore/README.md), so an msrun script must not get it unasked.
        common[envnames.MS_ENABLE_GRACEFUL_EXIT] = "1"
    per_rank = {}
    control_socket = os.path.join(ctx.run_dir, CONTROL_SOCKET)
    for device in ctx.topology.server.devices:
        per_rank[device.rank_id] = {**common,
                                    envnames.TORCHELASTIC_ERROR_FILE: error_file_path(log_session, attempt,
                                                                                      device.rank_id),
                                    **(plan.env_for(device.rank_id) if plan is not None else {}),
                                    **debugging.rank_env(ctx.base_env, device.rank_id, spec.debug.rank,
                                                         spec.debug.pdb, control_socket)}
    if spec.preload.learns:
        for rank, env in per_rank.items():
            env[envnames.LAUNCHER_IMPORTS_FILE] = imports_file(log_session)
            env.setdefault(envnames.PYTHONPATH, debugging.path_with_hooks(ctx.base_env))  # its sitecustomize
    if spec.hangs.enabled:
        for rank, env in per_rank.items():
            env[envnames.LAUNCHER_HEARTBEAT_FILE] = slot_path(os.path.join(ctx.run_dir, HEARTBEAT_DIR), rank)
            env.setdefault(envnames.PYTHONPATH, debugging.path_with_hooks(ctx.base_env))  # launcher_heartbeat
    command = debugging.postmortem_argv(spec.command) if spec.debug.pdb else spec.command
    return worker_specs(ctx, command, attempt, per_rank), plan


def imports_file(log_session: str) -> str:
    """Where ``--preload auto``'s ranks record the modules they import."""
    return os.path.join(log_session, "standby", "imports.txt")


def standby_pool(spec: RunSpec, log_session: str, emit: Callable[..., None]):
    """``--preload``'s warm standbys (:class:`launcher.supervision.standby.StandbyPool`), or None: with
    ``--preload none``, or when the command is not Python running a script or ``-m module`` (after one
    warning when modules were named)."""
    preload: PreloadSpec = spec.preload
    if not preload.wanted:
        return None
    if not preload.python:
        if preload.modules:
            log.warning("--preload %s ignored: the command is not a Python interpreter running a script or -m "
                        "module (%s): the ranks start cold", ",".join(preload.modules), " ".join(spec.command[:3]))
        return None
    from launcher.supervision.standby import StandbyPool
    from launcher.supervision.standbylearn import ImportsLog

    learn = None
    if preload.auto:
        os.makedirs(os.path.dirname(imports_file(log_session)), exist_ok=True)
        learn = ImportsLog(imports_file(log_session))
    return StandbyPool(preload.modules, preload.max_rss, os.path.join(log_session, "standby"), emit, learn)


def error_file_path(log_session: str, attempt: int, rank: int) -> str:
    """Where rank ``rank`` of ``attempt`` finds ``TORCHELASTIC_ERROR_FILE`` (torch's ``@record`` writes it)."""
    return os.path.join(log_session, f"attempt_{attempt}", f"rank_{rank}_error.json")


def failure_text(log_session: str, attempt: int, rank: int, log_path: Optional[str]) -> str:
    """What a failed rank wrote last, for the restart policy's causes: its error file's exception,
    then its log's last ``FAILURE_TEXT_LINES`` lines (both reads bounded)."""
    from launcher.monitoring.errorfile import read_error_file
    from launcher.supervision.output import tail_lines

    found = read_error_file(error_file_path(log_session, attempt, rank))
    lines = [found.message, *found.traceback] if found is not None else []
    return "\n".join(lines + (tail_lines(log_path, FAILURE_TEXT_LINES) if log_path else []))


def checkpoint_index(restore: RestoreSpec, local_ranks: Sequence[int]):
    """The index of ``--checkpoint-dir`` kept for the plans before restarts, kept up to date by its
    own thread (never by the event loop), reading ahead the digests of ``local_ranks``' saves;
    None without ``--checkpoint-dir``."""
    if not restore.checkpoint_dir:
        return None
    from launcher.restore import CheckpointIndex
    from launcher.restore.checkpoints import compile_patterns

    try:
        patterns = compile_patterns(restore.checkpoint_pattern, restore.checkpoint_marker)
    except UsageError:
        return None  # the first plan reports it, as it does without the index
    return CheckpointIndex(restore.checkpoint_dir, patterns, background=True, hash_ranks=frozenset(local_ranks),
                           gc_freeze=True)


def restore_inputs(restore: RestoreSpec, ctx: EnvContext, failed_before: Sequence[int] = ()):
    """The restore planner's inputs for this job and attempt."""
    from launcher.restore import PlanInputs

    # Only with --group-info-root; ranks that never write group_info.pb (PyTorch) must not make the
    # planner warn about it.
    root = ctx.group_info_root
    group_info_root = root if root and _has_group_info(root) else None
    return PlanInputs(world_size=ctx.topology.table.world_size, previous_failed_ranks=tuple(sorted(failed_before)),
                      **{**vars(restore), "group_info_root": group_info_root})


def _has_group_info(root: str) -> bool:
    try:
        with os.scandir(root) as entries:
            return any(os.path.exists(os.path.join(e.path, "group_info.pb")) for e in entries if e.is_dir())
    except OSError:
        return False
