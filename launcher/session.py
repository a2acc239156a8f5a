"""One supervised run: run dir, events, logs, orphan guard, process group and supervisor, wired up.

Everything set up here is torn down in ``__exit__``, whatever happened in between.
"""

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from launcher import console as console_mod
from launcher import envnames
from launcher import gasp as gasp_mod
from launcher import guard as guard_mod
from launcher import rundir as rundir_mod
from launcher.control import ControlServer
from launcher.errors import LauncherError, UsageError
from launcher.events import EventLog
from launcher.jobtree import JobTree, report_escaped
from launcher.options import DEFAULT_RESET_JSON, RunOptions
from launcher.procgroup import ClusterUpdate, LocalProcessGroup
from launcher.recovery import resolve_strategy
from launcher.attempt import PLAN_FILE, attempt_specs, checkpoint_index, error_file_path, taskd_rank_env
from launcher.rankenv import ROLE_SCHEDULER, EnvContext, WorkerSpec
from launcher.runner import (KEEP_ATTEMPT_LOGS, format_root_cause, parse_rank_filter, prune_attempt_logs,
                             session_name)
from launcher.policy import NoSync, RestartPolicy, RunResult
from launcher.supervisor import Supervisor

if TYPE_CHECKING:  # imported when a plan is made, not on the way to the first rank
    from launcher.restore.plan import RestorePlan

log = logging.getLogger(__name__)


class Session:
    """Context manager owning the resources of one ``launcher run``.

    Args:
        opts: Run options.
        ctx: The resolved job context (topology, run id, ...).
    """

    def __init__(self, opts: RunOptions, ctx: EnvContext):
        self.opts = opts
        self.ctx = ctx
        self.console_ranks = parse_rank_filter(opts.console_ranks)
        self.run_dir = rundir_mod.RunDir(ctx.run_dir)
        self.log_root = os.path.abspath(opts.log_dir or os.path.join(ctx.run_dir, "logs"))
        self.log_session = os.path.join(self.log_root, session_name())
        self.events: Optional[EventLog] = None
        self.guard: Optional[guard_mod.OrphanGuard] = None
        self.group: Optional[LocalProcessGroup] = None
        self.debug = None  # launcher.debugging.DebugConsole with --debug-rank / --pdb
        self.control: Optional[ControlServer] = None
        self.follower = None  # reset.json follower, when the cluster provides the file
        self.ckpt_index = None  # --checkpoint-dir's index, for the plans before restarts
        self.taskd_env: Dict[str, str] = {}
        self.sidecar: Optional[subprocess.Popen] = None
        self.gasp_gate = gasp_mod.GaspGate(self.run_dir.file(gasp_mod.GASP_STATE), opts.gasp_min_interval)
        self.graceful_exit_file = self.run_dir.file(gasp_mod.GRACEFUL_EXIT_FILE)
        self.plans: Dict[int, "RestorePlan"] = {}  # attempt -> its restore plan

    def __enter__(self) -> "Session":
        self.run_dir.lock()
        self._make_log_dir()
        self.events = EventLog(self.run_dir.file(rundir_mod.EVENTS), self.ctx.run_id)
        previous = self.run_dir.read_json(rundir_mod.LAUNCHER)
        if previous and not previous.get("ended"):
            # The launcher before us on this run dir never reached its end (SIGKILL, OOM, node loss).
            self._emit("unclean_previous_run", previous_pid=previous.get("pid"), started=previous.get("started"),
                       run_id=previous.get("run_id"))
            log.warning("the previous launcher on this run dir (pid %s) did not exit cleanly", previous.get("pid"))
        self.launcher_record = {"pid": os.getpid(), "started": time.time(), "run_id": self.ctx.run_id,
                                "log_dir": self.log_session, "gasp_timeout": self.opts.resolved_gasp_timeout(),
                                "gasp_signal": self.opts.gasp_signal}
        self.run_dir.write_json(rundir_mod.LAUNCHER, self.launcher_record)
        guard_mod.become_subreaper()
        tree = JobTree.create(adopt_orphans=True)  # our children we did not start are the job's orphans
        self.guard = guard_mod.OrphanGuard(tree)
        if self.opts.debug_rank is not None or self.opts.pdb:
            from launcher.debugging import DebugConsole

            self.debug = DebugConsole(self.opts.debug_rank, self.opts.pdb, self._emit)
        self.group = LocalProcessGroup(self._log_path, self._on_console, self.guard, tree,
                                       lambda spec: self.debug is not None and self.debug.has_terminal(spec.rank))
        self.control = ControlServer(self.run_dir.socket_address(), self.group.add_reader,
                                     self.group.remove_reader, self.group.post)
        gasp_mod.write_graceful_exit(self.graceful_exit_file, 0)  # a stale request never stops this run
        self._follow_reset_json()
        self.ckpt_index = checkpoint_index(self.opts, self.group.add_reader, self.group.call_later)
        self.taskd_env = taskd_rank_env(self.opts, self.ctx)
        self._make_group_info_dirs(self.ctx.topology.server.ranks)
        return self

    def _make_log_dir(self) -> None:
        try:
            os.makedirs(self.log_session, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write logs under {self.log_root}: {exc.strerror}",
                             ["pass --log-dir with a writable directory"]) from None
        latest = os.path.join(self.log_root, "latest")
        if os.path.isdir(latest) and not os.path.islink(latest):
            log.warning("%s is a directory, not the launcher's link: not pointing it at this run's logs", latest)
            return
        tmp = f"{latest}.{os.getpid()}"
        try:
            os.symlink(os.path.basename(self.log_session), tmp)
            os.replace(tmp, latest)
        except OSError as exc:  # a convenience link: never worth stopping the job for
            if os.path.lexists(tmp):
                os.unlink(tmp)
            log.warning("cannot point %s at this run's logs (%s)", latest, exc.strerror or exc)

    def run(self) -> int:
        """Supervise the job to its end; returns the exit status."""
        topo = self.ctx.topology
        self._emit("start", argv=list(self.opts.command), framework=self.ctx.framework, source=topo.source,
                   world_size=topo.table.world_size, server=topo.server.server_id,
                   local_ranks=list(topo.server.ranks), max_restarts=self.opts.max_restarts,
                   log_dir=self.log_session)
        log.info("%d local rank(s) of %d (%s); logs in %s", len(topo.server.devices), topo.table.world_size,
                 topo.source, self.log_session)
        strategy = resolve_strategy(self.opts.recover_strategy, self.ctx.base_env)
        log.info("recovery strategy: %s", strategy.describe())
        policy = RestartPolicy(self.opts.max_restarts, self.opts.restart_backoff, self.opts.stop_timeout,
                               self.opts.resolved_gasp_timeout(), self.opts.resolved_gasp_signal(),
                               self.gasp_gate.try_save, strategy, self._in_place_supported(),
                               backoff_max=self.opts.restart_backoff_max)
        sync = self._coordinator()
        self._start_taskd_manager()
        supervisor = Supervisor(self.group, self._specs_for, policy, self._emit, self._on_spawned,
                                lambda rank: self.group.log_paths.get(rank),
                                lambda: gasp_mod.write_graceful_exit(self.graceful_exit_file, 1), self._hold, sync,
                                resume_note=self._resume_note, debug=self.debug)
        try:
            result = supervisor.run()
        except BaseException:
            if sync is not None:  # the other nodes stop now instead of at their --sync-timeout
                sync.leave(supervisor.attempt_no, RunResult(1, "launcher-error", 0), quiet=True)
            raise
        self._report(result)
        return result.exit_code

    def _coordinator(self) -> Optional[NoSync]:
        """``--sync-dir``: restart generations shared with the other launchers (launcher.sync), or None."""
        topo = self.ctx.topology
        if not self.opts.sync_dir:
            if topo.table.server_count > 1 and self.follower is None:
                self._emit("sync_disabled", server_count=topo.table.server_count)
                log.warning("%d servers and no --sync-dir: restarts are not coordinated across the nodes "
                            "(see docs/multinode.md)", topo.table.server_count)
            return None
        from launcher.sync import Coordinator, SyncDir

        names = [server.server_id for server in topo.table.servers]
        try:
            files = SyncDir.join(self.opts.sync_dir, self.ctx.run_id, topo.server_index, names)
        except (OSError, LauncherError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            raise UsageError(f"cannot use --sync-dir {self.opts.sync_dir}: {reason}",
                             ["it must be a directory every node of the job can write"]) from None
        self._emit("sync_join", dir=files.path, server=topo.server_index, server_count=len(names),
                   timeout=self.opts.sync_timeout)
        log.info("restarts coordinated through %s (%s of %d)", files.path, files.name(topo.server_index), len(names))
        return Coordinator(files, self.opts.sync_timeout, self._emit, self.group.call_later, self.group.cancel,
                           self.group.post)

    def _start_taskd_manager(self) -> None:
        """The TaskD manager sidecar, before the ranks, on the server hosting global rank 0 only."""
        if not self.taskd_env or not self.ctx.topology.hosts_rank0:
            return
        from launcher import taskd

        taskd.check_port_free(self.opts.taskd_port)
        topo = self.ctx.topology
        config = taskd.manager_config(self.ctx.base_env.get(envnames.MINDX_TASK_ID) or self.ctx.run_id,
                                      topo.table.server_count, len(topo.server.devices))
        argv = taskd.sidecar_argv(config, self.run_dir.file(rundir_mod.EVENTS), self.ctx.run_id,
                                  pod_ip=self.ctx.base_env.get(envnames.POD_IP) or topo.table.master_addr)
        log_path = os.path.join(self.log_session, "taskd_manager.log")
        with open(log_path, "ab") as out:
            self.sidecar = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, close_fds=True)
        self.guard.watch(self.sidecar.pid)
        self.group.watch_pid(self.sidecar.pid, self._sidecar_exited)
        self._emit("taskd_sidecar_started", pid=self.sidecar.pid, config=config, log=log_path)
        log.info("TaskD manager started (pid %d, log %s)", self.sidecar.pid, log_path)

    def _sidecar_exited(self, info) -> None:
        self.sidecar.returncode = info.returncode
        self._emit("taskd_sidecar_exited", returncode=info.returncode)
        if info.returncode != 0:
            # Reported, never fatal: training goes on without process-level recovery.
            log.warning("the TaskD manager sidecar exited (%s); training continues without it", info.describe())

    def _stop_taskd_manager(self) -> None:
        """After the ranks: SIGTERM the sidecar's group, SIGKILL it after 5 s."""
        if self.sidecar is None or self.sidecar.returncode is not None:
            return
        os.killpg(self.sidecar.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while self.sidecar.returncode is None and time.monotonic() < deadline:
            self.group.wait_event(0.05)
        if self.sidecar.returncode is None:
            os.killpg(self.sidecar.pid, signal.SIGKILL)
            self.group.wait_event(1.0)
        self.guard.forget(self.sidecar.pid)

    def _follow_reset_json(self) -> None:
        """Watch MindCluster's reset.json when this container has it (or asked for it explicitly)."""
        path = self.opts.reset_json
        if not path or (path == DEFAULT_RESET_JSON and not os.path.isdir(os.path.dirname(path))):
            return
        from launcher.filewatch import PathWatcher
        from launcher.resetjson import ResetFollower, changes

        group = self.group

        def watcher(watched: str, on_change):
            return PathWatcher(watched, on_change, group.add_reader, group.remove_reader, group.call_later,
                               group.cancel)

        def on_update(new, old) -> None:
            group.post(ClusterUpdate(changes(old, new, self.ctx.topology.server.ranks)))

        self.follower = ResetFollower(path, watcher, on_update)
        log.info("following %s", path)

    def _hold(self) -> Optional[str]:
        """Why reset.json forbids (re)starting the ranks now, or None."""
        state = self.follower.current if self.follower is not None else None
        if state is None:
            return None
        if state.fault_flushing:
            return "reset.json: FaultFlushing"
        faulty = sorted(r for r in self.ctx.topology.server.ranks if state.status_of(r) == "fault")
        return f"reset.json: local rank(s) {faulty} in fault" if faulty else None

    def _refresh_rank_table(self) -> None:
        """Before a restart: re-read the rank table if the cluster rewrote it (its version changed)."""
        topo = self.ctx.topology
        if not topo.table_file:
            return
        from launcher.inputfiles import InputFileError
        from launcher.ranktable.files import read_version

        try:
            revision = read_version(topo.table_file)
        except InputFileError as exc:  # a bad file during the run: say so, keep the table we have
            log.warning("%s; keeping the rank table of version %s", exc, topo.table.revision)
            return
        if revision is None or revision == (topo.table.revision or ""):
            return
        from launcher import topology
        from launcher.ranktable import RankTableError
        from launcher.ranktable.wait import wait_for_rank_table

        try:
            table = wait_for_rank_table(topo.table_file, timeout=self.opts.rank_table_timeout)
        except RankTableError as exc:
            log.warning("%s; keeping the rank table of version %s", exc.message, topo.table.revision)
            return
        new = topology.resolve(self.opts, self.ctx.framework, self.ctx.base_env, table)
        self._emit("rank_table_changed", old_revision=topo.table.revision, new_revision=table.revision,
                   old_ranks=list(topo.server.ranks), new_ranks=list(new.server.ranks),
                   world_size=table.world_size)
        log.warning("rank table rewritten (version %s -> %s): local ranks %s -> %s", topo.table.revision,
                    table.revision, list(topo.server.ranks), list(new.server.ranks))
        self.ctx = dataclasses.replace(self.ctx, topology=new)
        self._make_group_info_dirs(new.server.ranks)

    def _make_group_info_dirs(self, ranks) -> None:
        """``--group-info-root`` only: the ranks write ``device<r>/group_info.pb`` there, kept across restarts."""
        for rank in ranks if self.ctx.group_info_root else ():
            os.makedirs(os.path.join(self.ctx.group_info_root, f"device{rank}"), exist_ok=True)

    def _in_place_supported(self) -> bool:
        """Whether a restarted rank can re-join the running job: MindSpore with its fault-tolerance
        switches on (MS_ENABLE_TFT), where the framework rebuilds the communicator. Not with
        --sync-dir: an in-place respawn would move this node's attempt number off the job's generation."""
        supported = self.ctx.framework == "mindspore" and bool(self.ctx.base_env.get(envnames.MS_ENABLE_TFT))
        if supported and self.opts.sync_dir:
            log.info("--sync-dir: a failed rank restarts the whole job, not only itself (recover-in-place)")
        return supported and not self.opts.sync_dir

    def _specs_for(self, attempt: int, failed_before: Sequence[int]) -> Sequence[WorkerSpec]:
        if attempt:
            self._refresh_rank_table()
            removed = prune_attempt_logs(self.log_session, attempt, in_use=list(self.group.log_paths.values()))
            if removed:
                self._emit("attempt_logs_pruned", attempt=attempt, removed=removed, kept_newest=KEEP_ATTEMPT_LOGS)
        specs, plan = attempt_specs(self.opts, self.ctx, attempt, failed_before, log_session=self.log_session,
                                    gasp_allowed=self.gasp_gate.allowed(), taskd_env=self.taskd_env,
                                    ckpt_index=self.ckpt_index)
        if plan is not None:
            self._record_plan(attempt, plan)
        return specs

    def _on_spawned(self, attempt: int, pids: Dict[int, int]) -> None:
        import psutil  # after the ranks are running: not on the path to the first rank

        ranks = []
        for rank, pid in sorted(pids.items()):
            try:
                created = psutil.Process(pid).create_time()
            except psutil.Error:
                created = None  # already gone; its exit event follows
            ranks.append({"rank": rank, "pid": pid, "pgid": pid, "create_time": created})
        self.run_dir.write_json(rundir_mod.STATE, {"launcher_pid": os.getpid(), "attempt": attempt,
                                                   "ranks": ranks, "updated": time.time()})

    def _record_plan(self, attempt: int, plan) -> None:
        """The restore plan of this (re)start, in the run dir and events.jsonl."""
        self.run_dir.write_json(PLAN_FILE, plan.to_json())
        self._emit("restore_plan", attempt=attempt, kind=plan.kind, step=plan.step, reason=plan.reason,
                   restore_ranks=list(plan.restore_ranks), fault_ranks=list(plan.fault_ranks),
                   warnings=list(plan.warnings), plan_file=self.run_dir.file(PLAN_FILE))
        self.plans[attempt] = plan
        if not attempt:  # a restart says it in its own line (Supervisor)
            log.info("restore plan: %s", resume_summary(plan))
        for warning in plan.warnings:
            log.warning("restore plan: %s", warning)

    def _resume_note(self, attempt: int) -> str:
        plan = self.plans.get(attempt)
        return resume_summary(plan) if plan is not None else "no restore plan (no --checkpoint-dir)"

    def _log_path(self, spec: WorkerSpec, attempt: int) -> str:
        name = "scheduler.log" if spec.role == ROLE_SCHEDULER else f"rank_{spec.rank}.log"
        return os.path.join(self.log_session, f"attempt_{attempt}", name)

    def _on_console(self, spec: WorkerSpec) -> bool:
        return self.console_ranks is None or spec.rank in self.console_ranks

    def _emit(self, event: str, **fields: object) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)

    def _report(self, result: RunResult) -> None:
        self._emit("stop", reason=result.reason, exit_code=result.exit_code, attempts=result.attempts)
        if result.reason == "succeeded":
            log.info("all ranks finished successfully (%d attempt(s))", result.attempts)
        elif result.reason == "failed":
            error_file = lambda failure: error_file_path(self.log_session, failure.attempt, failure.rank)
            for line in format_root_cause(result, error_file=error_file):
                log.error("%s", line)
        else:
            log.info("stopped (%s); exit %d", result.reason, result.exit_code)
        sys.stdout.flush()

    def _report_console(self) -> None:
        """After a bounded wait for a slow console: how much output it did not take (the files have it)."""
        stdout = console_mod.console_stream()
        stdout.finish(console_mod.CONSOLE_EXIT_WAIT)
        if stdout.dropped_bytes:
            self._emit("console_dropped", stream=stdout.name, bytes=stdout.dropped_bytes, lines=stdout.dropped_lines)
            log.warning("the console did not take %d bytes (%d lines) of rank output: dropped from the console, "
                        "the rank log files are complete", stdout.dropped_bytes, stdout.dropped_lines)

    def __exit__(self, *exc_info: object) -> None:
        if self.group is not None and self.guard is not None:
            self._stop_taskd_manager()
        if self.follower is not None:
            self.follower.close()
        if self.control is not None:
            self.control.close()
        if self.ckpt_index is not None:
            if self.ckpt_index.fileno() is not None:
                self.group.remove_reader(self.ckpt_index.fileno())
            self.ckpt_index.close()
        if self.group is not None:
            self.group.ensure_gone(5.0, final=True)
            report_escaped(self._emit, self.group.take_escaped(), attempt=None)
            self.group.close()
            self._report_console()
        if self.guard is not None:
            self.guard.close()
        if self.debug is not None:
            self.debug.restore_terminal()
        if self.events is not None:
            self.events.close()
            self.run_dir.write_json(rundir_mod.LAUNCHER, {**self.launcher_record, "ended": time.time()})
        self.run_dir.close()


def resume_summary(plan: "RestorePlan") -> str:
    """What the ranks resume from, in a few words: ``resuming from the step-70 breakpoint of rank 0``."""
    from launcher.restore.plan import KIND_BREAKPOINT, KIND_PERIODIC

    if plan.kind == KIND_BREAKPOINT:
        ranks = plan.restore_ranks
        return (f"resuming from the step-{plan.step} breakpoint of rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(str(r) for r in ranks)}")
    if plan.kind == KIND_PERIODIC:
        return f"resuming from the step-{plan.step} periodic checkpoints"
    return f"starting from scratch ({plan.reason})"
