"""Mechanism: warm standby ranks (``--preload``), below the ProcessGroup interface.

Per rank of this server, a standby is an interpreter started the way the rank is (same interpreter
and options, own session, parent-death signal, the orphan guard, the job's token and a cgroup of its
own) running ``launcher/rankhooks/launcher_standby.py``: it imports the preload modules and waits on
a socket (a job's process the /proc sweeps spare: the loop watches its pid). When
:class:`launcher.supervision.procgroup.LocalProcessGroup` starts a rank, it first asks
:meth:`StandbyPool.activate`: a ready standby whose start-time variables match the rank's gets the
rank's environment, argv, working directory and stdio, and becomes the rank (same pid: the rank's
process group is the standby's). Otherwise, or on any error, the rank starts cold as before. After an
attempt started, new standbys are prepared off the path to the ranks (``call_later``).

Everything here runs in the launcher's event loop and never blocks: the standby's answers arrive as
readable sockets, its death through the loop's reaper (``watch_pid``).
"""

import json
import logging
import os
import signal
import socket
import subprocess
import time
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from launcher.common.inputfiles import loads_json
from launcher.common.records import record
from launcher.jobspec.binding import format_cpulist, pin
from launcher.jobspec.preload import PythonEntry, python_entry, start_env_diff
from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision import guard as guard_mod
from launcher.supervision.jobtree import Leaf
from launcher.supervision.output import open_log
from launcher.supervision.standbyauto import BOOTSTRAP, LEARN_POLL, REPLACE_DELAY, AutoLearning
from launcher.supervision.standbylearn import ImportsLog

log = logging.getLogger(__name__)

#: Seconds after the first attempt started before the standbys start importing (the ranks go first).
PREPARE_DELAY = 0.5
_MAX_ANSWER = 1 << 16


@record
class Standby:
    """One standby process and what the launcher knows of it."""

    rank: int
    proc: subprocess.Popen
    sock: socket.socket
    leaf: Leaf
    env: Dict[str, str]
    interpreter: Tuple[str, ...]
    started: float
    ready: bool = False
    rss: int = 0
    loading: int = 1  # import requests not yet answered
    env_read: Tuple[str, ...] = ()
    threads: int = 1  # its threads when ready: more than one is an OpenBLAS pool, sized for its CPUs then


def _out_of_idle(pid: int) -> None:
    """A standby waiting as SCHED_IDLE runs only when no other task wants a CPU: before it is woken to
    become a rank, make it SCHED_BATCH (it goes on to SCHED_OTHER itself), so that a busy machine cannot
    hold the hand-over back and the launcher still hands every rank over before a standby preempts it.
    The standby waits as SCHED_IDLE only where it may leave it, and the launcher has its privileges."""
    try:
        if os.sched_getscheduler(pid) == os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
    except OSError:  # gone, or not allowed: the standby leaves SCHED_IDLE itself once it runs
        pass


class StandbyPool(AutoLearning):
    """The standbys of one job on this server.

    Args:
        modules: The modules each standby imports (``--preload``).
        max_rss: Largest resident size in bytes a ready standby may have (0: no cap).
        log_dir: Where each standby's own output goes (``rank_<r>.log``) until it becomes a rank.
        emit: ``emit(event, **fields)`` for events.jsonl.
        learn: ``--preload auto``: what the ranks imported; the standbys import the installed
            packages among it as it grows (``modules`` is then empty at first), within
            :func:`memory_room`.
    """

    def __init__(self, modules: Sequence[str], max_rss: int, log_dir: str, emit: Callable[..., None],
                 learn: Optional[ImportsLog] = None):
        self.modules = tuple(modules)
        self.max_rss = max_rss
        self.learn = learn
        self._pending: List[str] = []
        self._excluded: List[str] = []
        self._specs: Dict[int, WorkerSpec] = {}
        self._polling = self._short_of_memory = False
        self._quiet = 0  # reads in a row that found no new name
        self._began: Optional[float] = None  # monotonic start of the first attempt
        self._last_new = 0.0  # when a read last found the ranks importing
        self._idle: Optional[bool] = None  # standbys import as SCHED_IDLE (see _idle_class)
        self.startup: Optional[float] = None  # seconds until the ranks' latest import (auto, before standbys)
        self.log_dir = log_dir
        self.emit = emit
        self.refused: Optional[str] = None  # a standby was refused for a reason every other would share
        self._standbys: Dict[int, Standby] = {}
        self._seq = 0
        self._loop = self._tree = self._guard = None
        self._used: List[int] = []
        self._cold: Dict[int, str] = {}

    def attach(self, loop, tree, guard: Optional[guard_mod.OrphanGuard]) -> None:
        """Called by the process group: its event loop (readers, timers, reaper), job tree and guard."""
        self._loop, self._tree, self._guard = loop, tree, guard

    # -- activation ---------------------------------------------------------------------------------
    def ready_ranks(self) -> set:
        """Ranks whose standby is ready now: the process group hands these over before it starts the
        others cold (all standbys at once, without moving itself into the attempt's cgroup)."""
        return {rank for rank, standby in self._standbys.items() if standby.ready}

    def activate(self, spec: WorkerSpec, env: Dict[str, str], stdio: Dict[str, int],
                 cpus: Optional[FrozenSet[int]] = None) -> Optional[Tuple[subprocess.Popen, Leaf]]:
        """Make ``spec``'s standby the rank; None (reason noted) when it must start cold.

        Args:
            spec: The rank to start.
            env: Its environment without the job token (the standby's leaf token is added).
            stdio: Popen's stdio for the rank (``stdout`` an fd; empty: the rank has the terminal).
            cpus: The rank's CPUs (``--bind-cores``), set before the hand-over; None: unbound.
        """
        standby = self._standbys.get(spec.rank)
        reason = self._unusable(standby, spec, env, stdio)
        if reason is None and cpus is not None and standby.threads > 1:  # a cold rank's pool fits its set
            reason = f"its BLAS thread pool was sized before --bind-cores gave it CPUs {format_cpulist(cpus)}"
        elif reason is None and cpus is not None:  # before it runs the rank: its threads inherit the set
            try:
                pin(standby.proc.pid, cpus)
            except OSError as exc:
                reason = f"cannot bind it to CPUs {format_cpulist(cpus)} ({exc.strerror or exc})"
        if reason is None:
            reason = self._hand_over(standby, {**env, **standby.leaf.env}, spec.argv, stdio["stdout"])
        if reason is not None:
            self._cold[spec.rank] = reason
            return None
        self._standbys.pop(spec.rank)
        self._used.append(spec.rank)
        return standby.proc, standby.leaf

    def _unusable(self, standby: Optional[Standby], spec: WorkerSpec, env: Dict[str, str],
                  stdio: Dict[str, int]) -> Optional[str]:
        if standby is None:
            return self.refused or "no standby"
        if not stdio:
            return "it has the terminal (--debug-rank)"
        if not standby.ready:
            return f"its standby is still importing (started {time.monotonic() - standby.started:.1f} s ago)"
        entry = python_entry(spec.argv)
        if entry is None or entry.interpreter != standby.interpreter:
            self._discard(standby)
            return "its command changed"
        changed = start_env_diff(standby.env, env, standby.env_read)
        if changed:
            self._discard(standby)  # stale: the next one starts with the new values
            return f"start-time variable(s) changed: {', '.join(changed)}"
        return None

    def _hand_over(self, standby: Standby, env: Dict[str, str], argv: Sequence[str], out_fd: int) -> Optional[str]:
        entry = python_entry(argv)
        _out_of_idle(standby.proc.pid)
        message = {"env": env, "argv": list(argv), "script": list(argv[len(entry.interpreter):]), "cwd": os.getcwd()}
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            socket.send_fds(standby.sock, [json.dumps(message).encode("utf-8", "surrogateescape")],
                            [devnull, out_fd, out_fd])
        except OSError as exc:  # dead or dying: cold start
            self._discard(standby)
            return f"its standby is gone ({exc.strerror or exc})"
        finally:
            os.close(devnull)
        self._loop.remove_reader(standby.sock.fileno())
        self._loop.unwatch_pid(standby.proc.pid)
        standby.sock.close()
        return None

    def after_start(self, specs: Sequence[WorkerSpec], attempt: int, every: bool = True) -> None:
        """Once ranks are started: say which came from standbys, prepare the next ones.

        Args:
            specs: The ranks just started.
            attempt: Their attempt.
            every: ``specs`` are all of this server's ranks (not one respawned rank): standbys of
                other ranks are no longer needed (the rank table changed).
        """
        if every:
            self._keep_only({spec.rank for spec in specs})
        self._report(attempt)
        if every:
            self._specs = {}
        self._specs.update((spec.rank, spec) for spec in specs)
        if self.learn is None:
            self._loop.call_later(REPLACE_DELAY if attempt else PREPARE_DELAY, lambda: self.prepare(specs))
            return
        if not self._polling:
            self._polling, self._began = True, time.monotonic()
            self._loop.call_later(LEARN_POLL, self._poll)
        if attempt:
            self._loop.call_later(REPLACE_DELAY, self._prepare_within_memory)

    def _keep_only(self, ranks: set) -> None:
        """Discard the standbys of ranks no longer on this server (the rank table changed)."""
        for rank in [rank for rank in self._standbys if rank not in ranks]:
            self._discard(self._standbys[rank])

    def _report(self, attempt: int) -> None:
        """Say which ranks of the start came from standbys and why the others started cold."""
        cold = self._cold and attempt  # attempt 0 has no standby yet: nothing to say
        if self._used or cold:
            self.emit("standby_start", attempt=attempt, ranks=sorted(self._used),
                      cold={str(rank): why for rank, why in sorted(self._cold.items())})
        if self._used:
            log.info("rank(s) %s started from warm standbys", ", ".join(map(str, sorted(self._used))))
        if cold:
            log.info("cold start of %s", "; ".join(f"rank {r}: {why}" for r, why in sorted(self._cold.items())))
        self._used, self._cold = [], {}

    # -- preparing ----------------------------------------------------------------------------------
    def prepare(self, specs: Sequence[WorkerSpec]) -> None:
        """Start a standby for each of ``specs`` lacking one, with the environment it was started with."""
        if self.refused is not None:
            return
        base = dict(os.environ)
        for spec in specs:
            entry = python_entry(spec.argv)
            if spec.rank not in self._standbys and entry is not None:
                try:
                    self._standbys[spec.rank] = self._spawn(spec, entry, {**base, **spec.env})
                except OSError as exc:
                    self._refuse(spec.rank, f"cannot start: {exc.strerror or exc}")
                    return

    def _spawn(self, spec: WorkerSpec, entry: PythonEntry, env: Dict[str, str]) -> Standby:
        self._seq += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log_fd = open_log(os.path.join(self.log_dir, f"rank_{spec.rank}.log"))
        try:
            with self._tree.inside(f"sb{self._seq}") as cgroup:
                leaf = self._tree.leaf(f"sb{self._seq}", cgroup)
                proc = subprocess.Popen(
                    [*entry.interpreter, BOOTSTRAP, str(theirs.fileno())], env={**env, **leaf.env},
                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=guard_mod.child_setup, close_fds=True, pass_fds=(theirs.fileno(),))
        except OSError:
            ours.close()
            raise
        finally:
            os.close(log_fd)
            theirs.close()
        standby = Standby(spec.rank, proc, ours, leaf, env, entry.interpreter, time.monotonic())
        if self._guard is not None:
            self._guard.watch(proc.pid)
        script = list(spec.argv[len(entry.interpreter):])
        ours.send(json.dumps({"modules": list(self.modules), "script": script, "cwd": os.getcwd(),
                              "auto": self.learn is not None}).encode())
        ours.setblocking(False)
        self._loop.add_reader(ours.fileno(), lambda: self._on_answer(standby))
        self._loop.watch_pid(proc.pid, lambda info: self._on_death(standby, info.returncode))
        return standby

    def _on_answer(self, standby: Standby) -> None:
        if self._standbys.get(standby.rank) is not standby:  # discarded by an answer read just before
            return
        try:
            answer = loads_json(standby.sock.recv(_MAX_ANSWER) or b"null", f"rank {standby.rank}", "standby answer of")
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, ValueError):
            answer = None
        if not isinstance(answer, dict):  # end-of-file: it died; _on_death says how
            self._loop.remove_reader(standby.sock.fileno())
            return
        seconds = round(time.monotonic() - standby.started, 3)
        standby.loading -= 1
        if not answer.get("ready") and self.learn is not None and answer.get("module"):
            self._exclude(standby, str(answer["module"]), str(answer.get("error")))
        elif not answer.get("ready"):
            self._refuse(standby.rank, str(answer.get("error")))
        elif self.max_rss and answer.get("rss", 0) > self.max_rss:
            self._refuse(standby.rank, f"its resident size {answer['rss'] >> 20} MiB is above --preload-max-rss "
                                       f"{self.max_rss >> 20} MiB")
        elif standby.loading == 0:
            standby.ready, standby.rss = True, int(answer.get("rss", 0))
            standby.env_read = tuple(answer.get("env_read", ()))
            threads = answer.get("threads")
            standby.threads = threads if isinstance(threads, int) else 1
            self.emit("standby_ready", rank=standby.rank, pid=standby.proc.pid, rss_bytes=standby.rss,
                      seconds=seconds, modules=list(self.modules))

    def _on_death(self, standby: Standby, code: int) -> None:
        if self._standbys.get(standby.rank) is not standby:
            return
        del self._standbys[standby.rank]
        standby.proc.returncode = code
        self._forget(standby)
        log.warning("the warm standby of rank %d died (exit %d) before it was needed; see %s", standby.rank, code,
                    os.path.join(self.log_dir, f"rank_{standby.rank}.log"))
        self.emit("standby_died", rank=standby.rank, pid=standby.proc.pid, exit_code=code)

    def _refuse(self, rank: int, reason: str) -> None:
        """A standby that can never serve (modules start threads, fail to import, too big): no more."""
        self.refused = f"standbys refused: {reason}"
        log.warning("warm standby refused (%s): the ranks start cold; see docs/warm-standby.md", reason)
        self.emit("standby_refused", rank=rank, reason=reason)
        for standby in list(self._standbys.values()):
            self._discard(standby)

    # -- ending -------------------------------------------------------------------------------------
    def _discard(self, standby: Standby) -> None:
        """Kill a standby not activated, and reap it."""
        if self._standbys.get(standby.rank) is standby:
            del self._standbys[standby.rank]
        self._loop.unwatch_pid(standby.proc.pid)
        if standby.proc.returncode is None:
            try:
                os.killpg(standby.proc.pid, signal.SIGKILL)  # its own group: pgid == pid, not yet reaped
            except ProcessLookupError:
                pass
            try:
                os.waitpid(standby.proc.pid, 0)
            except ChildProcessError:
                pass
            standby.proc.returncode = -signal.SIGKILL
        self._forget(standby)

    def _forget(self, standby: Standby) -> None:
        if standby.sock.fileno() >= 0:
            self._loop.remove_reader(standby.sock.fileno())
            standby.sock.close()
        if self._guard is not None:
            self._guard.forget(standby.proc.pid)
        if standby.leaf.cgroup is not None:
            standby.leaf.cgroup.remove()

    def close(self) -> None:
        """Kill every standby (the job is over)."""
        self.refused = self.refused or "the job is over"  # and no more polling
        for standby in list(self._standbys.values()):
            self._discard(standby)
