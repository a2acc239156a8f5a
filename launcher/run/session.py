"""One supervised run: run dir, events, logs, orphan guard, process group and supervisor, wired up.

Everything set up here is torn down in ``__exit__``, whatever happened in between.
"""

import dataclasses
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from launcher.supervision import console as console_mod
from launcher.common import envnames, gcpause
from launcher.control import gasp as gasp_mod
from launcher.common import rundir as rundir_mod
from launcher.common.errors import UsageError
from launcher.monitoring.events import EventLog
from launcher.supervision.jobtree import create_time, report_escaped
from launcher.jobspec import binding as binding_mod
from launcher.jobspec.runspec import RunSpec
from launcher.supervision.integration import Integrations
from launcher.run.integrations import run_integrations
from launcher.run.jobstart import JobStart
from launcher.run.topochange import regrouped, reread_rank_table
from launcher.supervision.procgroup import LocalProcessGroup, start_attempt
from launcher.run.attempt import (PLAN_FILE, attempt_specs, checkpoint_index, error_file_path, failure_text,
                                  standby_pool)
from launcher.jobspec.rankenv import ROLE_SCHEDULER, EnvContext, WorkerSpec
from launcher.run.report import (KEEP_ATTEMPT_LOGS, log_result, prune_attempt_logs, resume_summary,
                                 session_name)

if TYPE_CHECKING:  # imported when a plan is made or the supervisor built, not on the way to the first rank
    from launcher.restore.plan import RestorePlan
    from launcher.supervision.policy import RestartPolicy, RunResult
    from launcher.supervision.procgroup import Started

log = logging.getLogger(__name__)


class Session:
    """Context manager owning the resources of one ``launcher run``.

    Args:
        spec: The run's options, parsed (``launcher.jobspec.runspec.run_spec``).
        ctx: The resolved job context (topology, run id, ...).
        start: The job's process tree and orphan guard, begun before this module was imported
            (``launcher.run.jobstart``). The session owns them from here on, and releases them even
            when ``__enter__`` fails.
    """

    def __init__(self, spec: RunSpec, ctx: EnvContext, start: JobStart):
        self.spec = spec
        self.ctx = ctx
        self.job_start = start
        self.base_topology = ctx.topology  # every server of the job (elastic membership runs a subset)
        self.console_ranks = spec.output.console_ranks  # None: every rank
        self.run_dir = rundir_mod.RunDir(ctx.run_dir)
        self.log_root = os.path.abspath(spec.output.log_dir or os.path.join(ctx.run_dir, "logs"))
        self.log_session = os.path.join(self.log_root, session_name())
        self.events: Optional[EventLog] = None
        self.guard = start.guard
        self.group: Optional[LocalProcessGroup] = None
        self.debug = None  # launcher.supervision.debugging.DebugConsole with --debug-rank / --pdb
        self.ckpt_index = None  # --checkpoint-dir's index, for the plans before restarts
        self.space_check = None  # --checkpoint-dir's free-space look, beside each attempt
        # What runs beside the ranks (launcher.supervision.integration): started in this order before
        # the first attempt, stopped in reverse when the session ends; listed in launcher.run.integrations.
        members, self.sync = run_integrations(spec)  # the sync: also the elastic membership of each attempt
        self.integrations = Integrations(members)
        self.gasp_gate = gasp_mod.GaspGate(self.run_dir.file(gasp_mod.GASP_STATE), spec.restart.gasp_min_interval)
        self.graceful_exit_file = self.run_dir.file(gasp_mod.GRACEFUL_EXIT_FILE)
        self.plans: Dict[int, "RestorePlan"] = {}  # attempt -> its restore plan

    def __enter__(self) -> "Session":
        try:
            self._enter()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _enter(self) -> None:
        tree = self.job_start.tree
        self.run_dir.lock()
        self._make_log_dir()
        self.events = EventLog(self.run_dir.file(rundir_mod.EVENTS), self.ctx.run_id)
        previous = self.run_dir.read_json(rundir_mod.LAUNCHER)
        if previous and not previous.get("ended"):
            # The launcher before us on this run dir never reached its end (SIGKILL, OOM, node loss).
            self.emit("unclean_previous_run", previous_pid=previous.get("pid"), started=previous.get("started"),
                      run_id=previous.get("run_id"))
            log.warning("the previous launcher on this run dir (pid %s) did not exit cleanly", previous.get("pid"))
        self.launcher_record = {"pid": os.getpid(), "started": time.time(), "run_id": self.ctx.run_id,
                                "log_dir": self.log_session, "gasp_timeout": self.spec.restart.gasp_timeout,
                                "gasp_signal": self.spec.restart.gasp_signal_name}
        self.run_dir.write_json(rundir_mod.LAUNCHER, self.launcher_record)
        if self.spec.debug.enabled:
            from launcher.supervision.debugging import DebugConsole

            self.debug = DebugConsole(self.spec.debug.rank, self.spec.debug.pdb, self.emit)
        binding = self._cpu_binding()
        self.group = LocalProcessGroup(self._log_path, self._on_console, self.guard, tree,
                                       lambda spec: self.debug is not None and self.debug.has_terminal(spec.rank),
                                       standby_pool(self.spec, self.log_session, self.emit),
                                       lambda spec: binding.cpus(spec.local_rank) if binding else None)
        gasp_mod.write_graceful_exit(self.graceful_exit_file, 0)  # a stale request never stops this run
        self.ckpt_index = checkpoint_index(self.spec.restore, self.ctx.topology.server.ranks)
        if self.spec.restore.checkpoint_dir:
            from launcher.run.healthcheck import SpaceCheck

            self.space_check = SpaceCheck(self.spec.restore.checkpoint_dir)
        self._make_group_info_dirs(self.ctx.topology.server.ranks)

    def _cpu_binding(self) -> "Optional[binding_mod.Plan]":
        """``--bind-cores``: each local rank's CPUs, said once in the log and events.jsonl."""
        plan = binding_mod.resolve(self.spec.bind_cores, [d.device_id for d in self.ctx.topology.server.devices])
        if plan is not None:
            self.emit("cpu_binding", how=plan.how, cpus=[binding_mod.format_cpulist(c) for c in plan.sets])
            log.info("CPU binding (%s): %s", plan.how, plan.describe())
        elif self.spec.bind_cores.lower() == binding_mod.AUTO:
            log.warning("--bind-cores auto: fewer CPUs than local ranks, the ranks are not bound")
        return plan

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
        self._announce()
        self._start_integrations()
        started = self._start_first_attempt()
        gcpause.end_startup_pause()  # launcher.__main__ paused it for the start-up's imports
        # Imported once the first ranks run, where they start before the supervisor (above).
        from launcher.supervision.hooks import ClusterHooks, JobHooks
        from launcher.supervision.supervisor import Supervisor

        policy = self._policy()
        job = JobHooks(self._specs_for, self._on_spawned, self.group.log_paths.get, self._failure_text,
                       self._resume_note, self.integrations.progress, self.integrations.status, self._busy_devices,
                       self._health)
        cluster = ClusterHooks(self.integrations.hold, self._request_exit)
        # first_attempt > 0 when it joined a running elastic job
        supervisor = Supervisor(self.group, job, policy, self.emit, cluster=cluster,
                                sync=self.integrations.restart_coordinator(), debug=self.debug,
                                first_attempt=self.sync.first_generation, started=started)
        try:
            result = supervisor.run()
        except Exception:
            self._gasp_on_error(policy)
            raise
        self._report(result)
        return result.exit_code

    def _announce(self) -> None:
        topo = self.ctx.topology
        self.emit("start", argv=list(self.spec.command), framework=self.ctx.framework, source=topo.source,
                  world_size=topo.table.world_size, server=topo.server.server_id,
                  local_ranks=list(topo.server.ranks), max_restarts=self.spec.restart.max_restarts,
                  log_dir=self.log_session)
        log.info("%d local rank(s) of %d (%s); logs in %s", len(topo.server.devices), topo.table.world_size,
                 topo.source, self.log_session)
        log.info("recovery strategy: %s", self.spec.restart.strategy.describe())

    def _start_integrations(self) -> None:
        if self.integrations.start_processes(self):
            self.group.unprepare()  # a sidecar must not be born in the first attempt's cgroup
        self.integrations.start(self)
        # The first ranks' cgroup (entered since launcher.run.jobstart unless a sidecar started or this
        # node joined a running elastic job at a later generation): the ranks do not wait for the move.
        self.group.prepare(self.sync.first_generation)
        self._warn_uncoordinated()

    def _start_first_attempt(self) -> "Optional[Started]":
        """Attempt 0's ranks, started now, before the restart loop is imported and built, where it would
        start them at once: no other node to start with, no hold (reset.json), no debugger, no health
        check, and no device held by another process (the supervisor's own look). None: the supervisor
        starts them, after its checks."""
        if (self.integrations.restart_coordinator() is not None or self.sync.first_generation
                or self.integrations.hold() is not None or self.debug is not None or self._checks_health()
                or (self.spec.restart.device_wait_timeout and self._busy_devices(True))):
            return None
        log.debug("attempt 0's ranks start before the restart loop is built: nothing has to come first")
        return start_attempt(self.group, self._specs_for(0, ()), 0, self.emit)

    def _policy(self) -> "RestartPolicy":
        from launcher.supervision.policy import RestartPolicy

        restart = self.spec.restart
        return RestartPolicy(restart.max_restarts, restart.backoff, restart.stop_timeout, restart.gasp_timeout,
                             restart.gasp_signal, self.gasp_gate.try_save, restart.strategy,
                             self._in_place_supported(), backoff_max=restart.backoff_max,
                             max_no_progress_restarts=restart.max_no_progress_restarts,
                             no_progress_exit_code=restart.no_progress_exit_code,
                             device_wait_timeout=restart.device_wait_timeout,
                             node_fault_exit_code=restart.node_fault_exit_code)

    def _gasp_on_error(self, policy: "RestartPolicy") -> None:
        """The launcher itself failed (a bug): a stop is still a stop with the gasp. The running ranks
        get the save signal and the gasp timeout, as on a SIGTERM to the launcher, before the error
        ends it (the ranks' groups are SIGKILLed on the way out)."""
        running = self.group.pids()
        if not running:
            return
        name = signal.Signals(policy.gasp_signal).name
        log.error("the launcher failed unexpectedly (the traceback follows); %s to %d rank(s), %.0f s to save",
                  name, len(running), policy.grace_period)
        self.emit("gasp", source="launcher-error", save=True, signal=name, timeout=policy.grace_period)
        self.group.signal_main(sorted(running), policy.gasp_signal)
        gasp_mod.wait_exits(sorted(running.values()), policy.grace_period)

    def _warn_uncoordinated(self) -> None:
        """Several servers, no --sync-dir, --coordinator or reset.json: say that restarts stay node-local."""
        topo = self.ctx.topology
        if topo.table.server_count > 1 and not self.integrations.coordinates_restarts():
            self.emit("sync_disabled", server_count=topo.table.server_count)
            log.warning("%d servers and no --sync-dir: restarts are not coordinated across the nodes "
                        "(see docs/multinode.md)", topo.table.server_count)

    def _refresh_rank_table(self) -> None:
        new = reread_rank_table(self.ctx.topology, self.spec.cluster, self.ctx.framework, self.ctx.base_env,
                                self.emit)
        if new is not None:
            self.ctx = dataclasses.replace(self.ctx, topology=new)
            self._make_group_info_dirs(new.server.ranks)

    def _make_group_info_dirs(self, ranks) -> None:
        """``--group-info-root`` only: the ranks write ``device<r>/group_info.pb`` there, kept across restarts."""
        for rank in ranks if self.ctx.group_info_root else ():
            os.makedirs(os.path.join(self.ctx.group_info_root, f"device{rank}"), exist_ok=True)

    def _in_place_supported(self) -> bool:
        """Whether a restarted rank can re-join the running job: MindSpore with its fault-tolerance
        switches on (MS_ENABLE_TFT), where the framework rebuilds the communicator. Not with
        --sync-dir or --coordinator: an in-place respawn would move this node's attempt number off the
        job's generation."""
        supported = self.ctx.framework == "mindspore" and bool(self.ctx.base_env.get(envnames.MS_ENABLE_TFT))
        coordinated = self.spec.cluster.coordinated
        if supported and coordinated:
            log.info("coordinated restarts: a failed rank restarts the whole job, not only itself (recover-in-place)")
        return supported and not coordinated

    def _specs_for(self, attempt: int, failed_before: Sequence[int]) -> Sequence[WorkerSpec]:
        failed_before = self._follow_membership(attempt, failed_before)
        if attempt:
            self._refresh_rank_table()
            removed = prune_attempt_logs(self.log_session, attempt, in_use=list(self.group.log_paths.values()))
            if removed:
                self.emit("attempt_logs_pruned", attempt=attempt, removed=removed, kept_newest=KEEP_ATTEMPT_LOGS)
        specs, plan = attempt_specs(self.spec, self.ctx, attempt, failed_before, log_session=self.log_session,
                                    gasp_allowed=self.gasp_gate.allowed(), rank_env=self.integrations.rank_env(),
                                    ckpt_index=self.ckpt_index)
        if plan is not None:
            self._record_plan(attempt, plan)
            if plan.transform is not None:
                self._convert_checkpoints(attempt, plan)
        return specs

    def _follow_membership(self, attempt: int, failed_before: Sequence[int]) -> Sequence[int]:
        """Elastic membership: failed ranks of the old numbering name nobody in the new one."""
        new = regrouped(self.base_topology, self.ctx.topology, self.sync, attempt, self.emit)
        if new is None:
            return failed_before
        self.ctx = dataclasses.replace(self.ctx, topology=new)
        return ()

    def _convert_checkpoints(self, attempt: int, plan) -> None:
        """A step written by another world, converted for this one before the ranks start (cached)."""
        from launcher.restore.mstransform import convert, job_interpreter

        started = time.monotonic()
        ran = convert(plan.transform, job_interpreter(self.spec.command))
        self.emit("checkpoint_conversion", attempt=attempt, cached=not ran, output=plan.transform.output,
                  seconds=round(time.monotonic() - started, 3), conversion=plan.conversion.to_json())

    def _on_spawned(self, attempt: int, pids: Dict[int, int]) -> None:
        if self.space_check is not None:
            self.space_check.start()  # the next attempt's free-space look, while this one runs
        ranks = [{"rank": rank, "pid": pid, "pgid": pid, "create_time": create_time(pid)}
                 for rank, pid in sorted(pids.items())]
        self.run_dir.write_json(rundir_mod.STATE, {"launcher_pid": os.getpid(), "attempt": attempt,
                                                   "ranks": ranks, "updated": time.time()})

    def _record_plan(self, attempt: int, plan) -> None:
        """The restore plan of this (re)start, in the run dir and events.jsonl."""
        self.run_dir.write_json(PLAN_FILE, plan.to_json())
        self.emit("restore_plan", attempt=attempt, kind=plan.kind, step=plan.step, reason=plan.reason,
                  restore_ranks=list(plan.restore_ranks), fault_ranks=list(plan.fault_ranks),
                  warnings=list(plan.warnings), plan_file=self.run_dir.file(PLAN_FILE),
                  world_size=self.ctx.topology.table.world_size,
                  saved_world_size=plan.saved_world_size,
                  conversion=plan.conversion.to_json() if plan.conversion is not None else None)
        self.plans[attempt] = plan
        if not attempt:  # a restart says it in its own line (Supervisor)
            log.info("restore plan: %s", resume_summary(plan))
        for warning in plan.warnings:
            log.warning("restore plan: %s", warning)

    def _failure_text(self, attempt: int, rank: int) -> str:
        return failure_text(self.log_session, attempt, rank, self.group.log_paths.get(rank))

    def _busy_devices(self, here: bool) -> Dict[int, List[str]]:
        from launcher.run.devicewait import busy_devices

        return busy_devices([d.device_id for d in self.ctx.topology.server.devices], self.ctx.base_env, here)

    def _checks_health(self) -> bool:
        return bool(self.spec.restart.health_check or self.spec.restore.checkpoint_dir)

    def _health(self) -> Optional[str]:
        if not self._checks_health():
            return None  # nothing to check: no import of the checks on the way to the first rank
        from launcher.run.healthcheck import node_health

        return node_health(self.spec.restart.health_check, self.spec.restore.checkpoint_dir,
                           [d.device_id for d in self.ctx.topology.server.devices], self.emit, self.space_check)

    def _request_exit(self) -> None:
        """``launcher exit`` or reset.json: the ranks poll this file and stop at their next step boundary."""
        gasp_mod.write_graceful_exit(self.graceful_exit_file, 1)

    def _resume_note(self, attempt: int) -> str:
        plan = self.plans.get(attempt)
        return resume_summary(plan) if plan is not None else "no restore plan (no --checkpoint-dir)"

    def _log_path(self, spec: WorkerSpec, attempt: int) -> str:
        name = "scheduler.log" if spec.role == ROLE_SCHEDULER else f"rank_{spec.rank}.log"
        return os.path.join(self.log_session, f"attempt_{attempt}", name)

    def _on_console(self, spec: WorkerSpec) -> bool:
        return self.console_ranks is None or spec.rank in self.console_ranks

    def emit(self, event: str, **fields: object) -> None:
        """Record an event in events.jsonl and pass it to the integrations."""
        if self.events is not None:
            self.events.emit(event, **fields)
        self.integrations.dispatch(event, fields)

    def _report(self, result: "RunResult") -> None:
        self.emit("stop", reason=result.reason, exit_code=result.exit_code, attempts=result.attempts)
        log_result(result, lambda failure: error_file_path(self.log_session, failure.attempt, failure.rank),
                   self.events.path if self.events is not None else None)
        sys.stdout.flush()

    def _report_console(self) -> None:
        """After a bounded wait for a slow console: how much output it did not take (the files have it)."""
        stdout = console_mod.console_stream()
        stdout.finish(console_mod.CONSOLE_EXIT_WAIT)
        if stdout.dropped_bytes:
            self.emit("console_dropped", stream=stdout.name, bytes=stdout.dropped_bytes, lines=stdout.dropped_lines)
            log.warning("the console did not take %d bytes (%d lines) of rank output: dropped from the console, "
                        "the rank log files are complete", stdout.dropped_bytes, stdout.dropped_lines)

    def __exit__(self, *exc_info: object) -> None:
        self.integrations.stop()
        if self.ckpt_index is not None:
            self.ckpt_index.close()
        if self.group is not None:
            self.group.ensure_gone(5.0, final=True)
            report_escaped(self.emit, self.group.take_escaped(), attempt=None)
            self.group.close()
            self._report_console()
        else:  # never got as far as the ranks: out of the cgroup, which goes
            self.job_start.tree.close()
        if self.guard is not None:
            self.guard.close()
        if self.debug is not None:
            self.debug.restore_terminal()
        if self.events is not None:
            self.events.close()
            self.run_dir.write_json(rundir_mod.LAUNCHER, {**self.launcher_record, "ended": time.time()})
        self.run_dir.close()
