"""Mechanism: spawning, signalling, reaping and output of one attempt's processes.

The supervisor (policy) sees only the :class:`ProcessGroup` interface: ``start``, ``wait_event``,
``signal_main``, ``kill_groups``, ``ensure_gone``, ``pids``. :class:`LocalProcessGroup` implements it
with one session (process group) per rank, on the single-threaded
:class:`~launcher.supervision.eventloop.EventLoop`, which also reads the ranks' output pipes: a
rank's exit is seen within milliseconds, and nothing polls.
"""

import functools
import logging
import os
import selectors
import signal
import subprocess
import time
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from launcher.supervision import console as console_mod
from launcher.supervision import guard as guard_mod
from launcher.common.errors import LauncherError
from launcher.supervision.cgroup import Cgroup
from launcher.supervision.eventloop import EventLoop
from launcher.supervision.group import ProcessGroup, Started, start_attempt
from launcher.supervision.jobtree import JobTree, Leaf, Stray
from launcher.supervision.listening import listening, wait_listening
from launcher.supervision.loopevents import ClusterUpdate, ControlRequest, Event, RankExited, SignalReceived
from launcher.supervision.output import RankOutput, open_log, rank_pipe
from launcher.supervision.spawn import Spawner
from launcher.supervision.standby import StandbyPool
from launcher.jobspec.binding import format_cpulist
from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.states import ExitInfo
from launcher.common.warnonce import WarnOnce

__all__ = ["ClusterUpdate", "ControlRequest", "Event", "LocalProcessGroup", "ProcessGroup", "RankExited",
           "SignalReceived", "Started", "start_attempt"]

log = logging.getLogger(__name__)

#: Seconds after a start before the spent attempts' cgroups are removed (an rmdir slows spawning).
_TIDY_DELAY = 1.0
#: Longest wait, at a hand-over from standbys, for the rank hosting the rendezvous to listen (seconds).
_SERVE_WAIT = 0.1


class LocalProcessGroup(EventLoop, ProcessGroup):
    """Processes on this machine.

    Args:
        log_path: ``(spec, attempt) -> path`` of the rank's log file.
        on_console: ``spec -> bool``: whether the rank's output is also shown on the console.
        orphan_guard: Kills the ranks' process groups if the launcher dies; optional.
        tree: The job's processes beyond the ranks' groups (cgroup, token, orphans); default: a new
            job that does not adopt this process's other children.
        on_terminal: ``spec -> bool``: whether the rank gets the launcher's own stdin, stdout and
            stderr (``--debug-rank``) instead of /dev/null and its log; optional.
        standby: Warm standbys that become ranks where they can (``--preload``); optional.
        cpus: ``spec -> CPU set or None``: the CPUs the rank may run on (``--bind-cores``); optional.
        spawner: Starts the ranks' processes; default: a new :class:`~launcher.supervision.spawn.Spawner`.
    """

    def __init__(self, log_path: Callable[[WorkerSpec, int], str], on_console: Callable[[WorkerSpec], bool],
                 orphan_guard: Optional[guard_mod.OrphanGuard] = None, tree: Optional[JobTree] = None,
                 on_terminal: Callable[[WorkerSpec], bool] = lambda spec: False,
                 standby: Optional[StandbyPool] = None,
                 cpus: Callable[[WorkerSpec], Optional[FrozenSet[int]]] = lambda spec: None,
                 spawner: Optional[Spawner] = None):
        super().__init__()
        self._cpus = cpus
        self._log_path = log_path
        self._on_console = on_console
        self._on_terminal = on_terminal
        self._guard = orphan_guard
        self._tree = tree or JobTree.create()
        self._leaves: Dict[int, Leaf] = {}
        self._retired: List[Leaf] = []  # leaves of respawned ranks: their cgroup ends with the attempt
        self._escaped: List[Stray] = []
        self._procs: Dict[int, subprocess.Popen] = {}
        self._pid_rank: Dict[int, int] = {}
        self._outputs: Dict[int, RankOutput] = {}
        self._pgids: Dict[int, int] = {}
        self.log_paths: Dict[int, str] = {}
        self._log_failed = WarnOnce(log)  # one report per rank whose log file cannot be written
        self._console = console_mod.console_stream()
        for console in console_mod.consoles():  # a console backlog is flushed by this loop
            console.attach(self.add_writer, self.remove_reader)
        guard_mod.prepare()
        self._spawner = spawner or Spawner()  # checks setpriv in the background, before the first start
        self._probe_pid = self._spawner.probe_pid
        if self._probe_pid is not None:  # reaped by this loop meanwhile: the spawner gets its status
            self.watch_pid(self._probe_pid, self._spawner.probed)
        self._standby = standby
        self._serving: Optional[int] = None  # the attempt's rendezvous port, until its first exit
        self._host_listened = False  # the rendezvous host listened when its attempt's first rank exited
        if standby is not None:
            standby.attach(self, self._tree, orphan_guard)

    # -- spawning -------------------------------------------------------------------------------
    def start(self, specs: Sequence[WorkerSpec], attempt: int) -> None:
        self._procs.clear()
        self._pgids.clear()
        self._leaves.clear()
        self.log_paths.clear()
        base = dict(os.environ)
        spec = specs[0] if specs else None
        try:
            if self._standby is not None:  # only a hand-over from standbys waits for the host
                self._serving = next((spec.serves for spec in specs if spec.serves is not None), None)
            warm = self._standby.ready_ranks() if self._standby is not None else set()
            unused = self._hand_over([spec for spec in specs if spec.rank in warm], attempt, base)
            cold = [spec for spec in specs if spec.rank not in warm or spec.rank in unused]
            if cold:  # only cold starts need it: moving this process into a cgroup costs 5-20 ms
                with self._tree.inside(f"a{attempt}") as cgroup:  # the ranks are born in the attempt's cgroup
                    for spec in cold:
                        self._spawn(spec, attempt, base, cgroup, False if spec.rank in warm else None)
            else:
                self._tree.unprepare()
            self.call_later(_TIDY_DELAY, self._tree.tidy)  # spent cgroups: off the path to the ranks
            if self._probe_pid is not None:  # reaped by now: its pid may be a rank's one day
                self.unwatch_pid(self._probe_pid)
                self._probe_pid = None
            if self._standby is not None:
                self._standby.after_start(specs, attempt)
        except OSError as exc:  # out of the cgroup again before killing what it holds
            self.kill_groups()
            self.ensure_gone(5.0)
            raise LauncherError(f"cannot start {spec.label}: {spec.argv[0]}: {exc.strerror or exc}") from None

    def _hand_over(self, specs: Sequence[WorkerSpec], attempt: int, base: Dict[str, str]) -> set:
        """Start ``specs`` from their ready standbys; returns the ranks that must start cold instead.

        The rank that hosts the job's rendezvous goes first and the others once it listens (at most
        ``_SERVE_WAIT``), where the host of the attempt before listened when its first rank exited (a
        torch job's rank 0 with its TCPStore, MindSpore's scheduler): a peer that connects before the
        host listens is refused, and tries again only later (torch's TCPStore client 0.6-0.7 s here,
        MindSpore's workers 0.5 s; docs/warm-standby.md).
        Cold starts spend seconds importing: no order.
        """
        unused = set()
        for spec in sorted(specs, key=lambda spec: spec.serves is None):
            if not self._spawn(spec, attempt, base, None, True):
                unused.add(spec.rank)
            elif spec.serves is not None and len(specs) > 1 and self._host_listened:
                self._host_listened = wait_listening(spec.serves, _SERVE_WAIT)
                if not self._host_listened:
                    log.info("%s did not listen on port %d within %g s of its hand-over: the other ranks start "
                             "without waiting longer", spec.label, spec.serves, _SERVE_WAIT)
        return unused

    def prepare(self, attempt: int) -> None:
        """Begin now, in the background, the move into ``attempt``'s cgroup that its cold starts wait for
        (``JobTree.prepare``): the ranks start sooner. Only where no process the launcher starts before
        them outlives the wait (integrations started, preflight checks only)."""
        self._tree.prepare(f"a{attempt}")

    def unprepare(self) -> None:
        """Back out of a move :meth:`prepare` (or whoever created the tree) began."""
        self._tree.unprepare()

    def _spawn(self, spec: WorkerSpec, attempt: int, base: Dict[str, str], cgroup: Optional[Cgroup],
               warm_only: Optional[bool] = None) -> bool:
        """Start ``spec``: from its standby, else cold. ``warm_only`` True: only from its standby (False
        when it cannot); False: cold only (its standby was already asked)."""
        path = self._log_path(spec, attempt)
        log_fd = self._open_log(spec, path)
        self.log_paths[spec.rank] = path
        stdio, read_fd, target = self._stdio(spec, log_fd)
        cpus = self._cpus(spec)
        warm = None
        if self._standby is not None and warm_only is not False:
            warm = self._standby.activate(spec, {**base, **spec.env}, stdio, cpus)
        if warm is None and warm_only:
            _close(log_fd, read_fd, target)
            return False
        try:
            if warm is not None:  # the standby is the rank now: same session, its own cgroup and token
                proc, self._leaves[spec.rank] = warm
            else:
                leaf = self._leaves[spec.rank] = self._tree.leaf(f"a{attempt}-r{spec.rank}", cgroup)
                proc = self._spawner.popen(spec.argv, {**base, **spec.env, **leaf.env}, stdio, cpus)
        except (OSError, subprocess.SubprocessError) as exc:
            _close(log_fd, read_fd, target)
            if isinstance(exc, OSError):
                raise
            # The only preexec_fn step that can fail: the CPU set is no longer allowed (cpuset changed).
            raise OSError(f"cannot bind it to CPUs {format_cpulist(cpus or frozenset())}") from None
        self._attach_output(spec, path, log_fd, read_fd, target)
        self._started(spec.rank, proc)
        return True

    def _attach_output(self, spec: WorkerSpec, path: str, log_fd: int, read_fd: int, target: int) -> None:
        """The parent's side of a started rank's output: its pipe read on the loop into its log file."""
        if target < 0:
            os.close(log_fd)  # --debug-rank: the rank has the terminal
            return
        os.close(target)
        os.set_blocking(read_fd, False)
        console = self._console if self._on_console(spec) else None
        out = RankOutput(read_fd, log_fd, spec.label, console, self._log_failed, path)
        self._outputs[read_fd] = out
        self._selector.register(read_fd, selectors.EVENT_READ, functools.partial(self._pump, out, read_fd))

    def _started(self, rank: int, proc: subprocess.Popen) -> None:
        self._procs[rank] = proc
        self._pid_rank[proc.pid] = rank
        self._pgids[rank] = proc.pid  # start_new_session: pgid == pid
        if self._guard is not None:
            self._guard.watch(proc.pid)

    def _stdio(self, spec: WorkerSpec, log_fd: int) -> Tuple[Dict[str, int], int, int]:
        """Popen's stdio for ``spec``, and its output pipe's ends (-1 for the rank on the terminal)."""
        if self._on_terminal(spec):  # still its own session: the terminal's Ctrl-C reaches the launcher
            try:
                os.write(log_fd, f"[launcher] {spec.label} has the launcher's terminal (--debug-rank): "
                                 f"its output is there, not in this file\n".encode())
            except OSError:  # a full disk: the note is a courtesy, the rank starts anyway
                pass
            return {}, -1, -1
        # A pipe, never the file: a full log disk fails the launcher's write (reported once), not the rank.
        read_fd, target = rank_pipe()
        return dict(stdin=subprocess.DEVNULL, stdout=target, stderr=subprocess.STDOUT), read_fd, target

    def _open_log(self, spec: WorkerSpec, path: str) -> int:
        """The rank's log file; on a full or failing disk (reported once) /dev/null, so the rank
        still starts and, when shown on the console, is seen there."""
        try:
            return open_log(path)
        except OSError as exc:
            self._log_failed(spec.label, "%s: cannot create its log file %s (%s): its output is not kept in a "
                             "file", spec.label, path, exc.strerror or exc)
            return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)

    # -- events (the loop itself is EventLoop's) ---------------------------------------------
    def _pump(self, out: RankOutput, fd: int) -> None:
        if not out.pump():
            self._unregister_output(out, fd)

    def _unregister_output(self, out: RankOutput, fd: int) -> None:
        self._selector.unregister(fd)
        self._outputs.pop(fd, None)

    def _child_exited(self, pid: int, info: ExitInfo) -> None:
        rank = self._pid_rank.pop(pid, None)
        if rank is None:
            return
        proc = self._procs.get(rank)
        if proc is not None and proc.pid == pid:
            proc.returncode = info.returncode  # reaped here; keep Popen from waiting on it again
        if self._serving is not None:  # the attempt's first exit: is its rendezvous host listening?
            self._host_listened, self._serving = listening(self._serving), None
        self._queue.append(RankExited(rank, info))

    # -- signalling -----------------------------------------------------------------------------
    def signal_main(self, ranks: Iterable[int], signum: int) -> None:
        for rank in ranks:
            proc = self._procs.get(rank)
            if proc is not None and proc.returncode is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def kill_groups(self, ranks: Optional[Iterable[int]] = None) -> None:
        for rank in list(self._pgids) if ranks is None else ranks:
            pgid = self._pgids.get(rank)
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def ensure_gone(self, timeout: float, final: bool = False) -> List[int]:
        """Also kills the processes that left their rank's group (see ``take_escaped``).

        ``final``: the job is over: scan /proc for the job's processes even where the cgroup holds them.
        """
        deadline = time.monotonic() + timeout
        if final and self._standby is not None:
            self._standby.close()
        self.kill_groups()
        leaves = [*self._leaves.values(), *self._retired]
        self._leaves.clear()
        self._retired.clear()
        self._escaped.extend(self._tree.kill_leaves(leaves, self._pgids.values()))
        alive = list(self._pgids.items())
        while alive:
            self._reap()
            alive = [(rank, pgid) for rank, pgid in alive if _group_exists(pgid)]
            if not alive or time.monotonic() >= deadline:
                break
            self.kill_groups(rank for rank, _ in alive)  # members forked after the first kill
            time.sleep(0.002)
        self._end_leaves(leaves, deadline, [pgid for _, pgid in alive], final)
        gone = set(self._pgids.values()) - {pgid for _, pgid in alive}
        if self._guard is not None:
            for pgid in gone:
                self._guard.forget(pgid)
        for fd, out in list(self._outputs.items()):
            out.drain()
            self._unregister_output(out, fd)
        return [pgid for _, pgid in alive]

    def _end_leaves(self, leaves: List[Leaf], deadline: float, skip_pgids: Sequence[int], scan: bool,
                    leaf: Optional[Leaf] = None) -> None:
        """After the groups are gone: the /proc sweep where needed, then remove the leaf cgroups."""
        if scan or not self._tree.contained:
            exempt = {*self._watched, *self.pids().values(), *([self._guard.pid] if self._guard else [])}
            self._escaped.extend(self._tree.sweep(deadline, self._reap, exempt, skip_pgids, leaf))
        self._tree.settle_leaves(leaves, deadline, self._reap)

    def take_escaped(self) -> List[Stray]:
        first: Dict[int, Stray] = {}
        for stray in self._escaped:
            first.setdefault(stray.pid, stray)
        self._escaped.clear()
        return list(first.values())

    def pids(self) -> Dict[int, int]:
        return {rank: p.pid for rank, p in self._procs.items() if p.returncode is None}

    def respawn(self, spec: WorkerSpec, attempt: int) -> None:
        old = self._pgids.get(spec.rank)
        leaf = self._leaves.pop(spec.rank, None)
        if old is not None:
            self.kill_groups([spec.rank])
            deadline = time.monotonic() + 5.0
            while _group_exists(old) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.002)
            if self._guard is not None and not _group_exists(old):
                self._guard.forget(old)
            if leaf is not None:  # its token, not its cgroup: the attempt's other ranks share that
                self._end_leaves([], deadline, [], True, leaf)
                self._retired.append(leaf)
        try:
            with self._tree.inside(f"a{attempt}") as cgroup:
                self._spawn(spec, attempt, dict(os.environ), cgroup)
            self.call_later(_TIDY_DELAY, self._tree.tidy)
            if self._standby is not None:
                self._standby.after_start([spec], attempt, every=False)
        except OSError as exc:
            raise LauncherError(f"cannot restart {spec.label}: {spec.argv[0]}: {exc.strerror or exc}") from None

    def pgid(self, rank: int) -> Optional[int]:
        """Process-group id of ``rank`` in the current attempt."""
        return self._pgids.get(rank)

    def close(self) -> None:
        """Release the selector, the consoles and the job's cgroup (call after ``ensure_gone``)."""
        for console in console_mod.consoles():
            console.detach()
        self._selector.close()
        self._tree.close(time.monotonic() + 0.5)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
