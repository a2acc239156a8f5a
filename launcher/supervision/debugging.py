"""Local debugging: one rank gets the launcher's terminal (``--debug-rank``, ``--pdb``).

Mechanism for the supervisor's debugging policy:

- ``--debug-rank N``: rank N inherits the launcher's stdin, stdout and stderr (unprefixed, not in
  its log file); the other ranks run as usual. It stays in its own session, so the terminal's Ctrl-C
  reaches the launcher, which passes it on (pdb turns SIGINT into a break).
- ``--pdb``: every rank runs under ``rankhooks/launcher_rankhooks.py``; the first rank of an attempt
  that raises asks for the terminal (``debug-terminal`` over the control socket) and runs pdb
  post-mortem on it before it exits.
- Every other rank gets ``PYTHONBREAKPOINT`` pointing at a one-line hint instead of a pdb that reads
  end-of-file from /dev/null.

While a rank holds the terminal, a stop the launcher starts itself (another rank failed) neither
signals it nor gives it a deadline; Ctrl-C goes to that rank first, and a second Ctrl-C within
``DOUBLE_PRESS_SECONDS`` acts as the launcher's own Ctrl-C. Nothing here blocks the event loop.
"""

import logging
import os
import signal
import sys
import time
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Set, Tuple

from launcher.common import envnames
from launcher.common.errors import UsageError

log = logging.getLogger(__name__)

#: The directory on the ranks' ``PYTHONPATH`` (appended) holding the stdlib-only rank hooks.
HOOKS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rankhooks")
HOOKS_FILE = os.path.join(HOOKS_DIR, "launcher_rankhooks.py")
BREAKPOINT_HINT = "launcher_rankhooks.breakpoint_hint"
#: Control-socket command of a rank that wants the terminal for a post-mortem (``--pdb``).
DEBUG_REQUEST = "debug-terminal"
#: A second Ctrl-C this soon after one passed to the debugged rank stops the job instead.
DOUBLE_PRESS_SECONDS = 2.0
# Python options that take a value as the next word: ``python -X dev script.py``.
_PYTHON_VALUE_FLAGS = ("-W", "-X")


def check_options(debug_rank: Optional[int], pdb: bool, command: Sequence[str], local_ranks: Iterable[int]) -> None:
    """Refuse a ``--debug-rank`` this machine does not run, and ``--pdb`` for a non-Python command.

    Raises:
        UsageError: one line per problem.
    """
    ranks = sorted(local_ranks)
    if debug_rank is not None and debug_rank not in ranks:
        raise UsageError(f"--debug-rank {debug_rank}: not a rank of this machine",
                         [f"local ranks: {', '.join(map(str, ranks))}"])
    if pdb:
        postmortem_argv(command)


def postmortem_argv(command: Sequence[str]) -> Tuple[str, ...]:
    """``python [opts] SCRIPT|-m MOD ARGS`` -> the same under the post-mortem wrapper.

    Raises:
        UsageError: the command is not a Python interpreter running a script or a module.
    """
    command = tuple(command)
    index = 1 if command and _is_python(command[0]) else len(command)
    while index < len(command) and command[index].startswith("-") and command[index] not in ("-m", "-c"):
        index += 2 if command[index] in _PYTHON_VALUE_FLAGS else 1
    target = command[index:index + 2]  # SCRIPT ..., or -m MODULE
    if target and target[0] != "-c" and target != ("-m",):
        return (*command[:index], HOOKS_FILE, *command[index:])
    raise UsageError("--pdb needs a Python command: SCRIPT.py, -m MODULE or python SCRIPT ...",
                     [f"got: {' '.join(command)}"])


def _is_python(program: str) -> bool:
    name = os.path.basename(program)
    return name.startswith("python") or os.path.realpath(program) == os.path.realpath(sys.executable)


def root_cause_hint(rank: int, log_tail: Sequence[str]) -> Sequence[str]:
    """A line for the root-cause summary when the failed rank died in a debugger without a terminal.

    ``pdb.set_trace()`` and ``torch.distributed.breakpoint()`` bypass ``PYTHONBREAKPOINT``: in a rank
    without the terminal pdb reads end-of-file and raises ``bdb.BdbQuit``.
    """
    if any(line.rstrip().endswith("bdb.BdbQuit") for line in log_tail):
        return [f"rank {rank} stopped at a debugger without a terminal (bdb.BdbQuit): run with --debug-rank {rank} "
                f"to debug it here"]
    return []


def rank_env(base_env: Mapping[str, str], rank: int, debug_rank: Optional[int], pdb: bool,
             control_socket: str) -> Dict[str, str]:
    """The debugging variables of one rank (pure: no I/O).

    Args:
        base_env: The launcher's environment: a ``PYTHONBREAKPOINT`` set there is kept, and the hooks
            directory goes after the job's own ``PYTHONPATH``.
        rank: The rank.
        debug_rank: ``--debug-rank``, or None.
        pdb: ``--pdb``.
        control_socket: The launcher's control socket (for ``--pdb``).
    """
    env: Dict[str, str] = {}
    if debug_rank is not None:
        env[envnames.LAUNCHER_DEBUG_RANK] = str(debug_rank)
    if pdb:
        env[envnames.LAUNCHER_CONTROL_SOCKET] = control_socket
    if rank != debug_rank and envnames.PYTHONBREAKPOINT not in base_env:
        env[envnames.PYTHONBREAKPOINT] = BREAKPOINT_HINT
        env[envnames.PYTHONPATH] = path_with_hooks(base_env)
    return env


def path_with_hooks(base_env: Mapping[str, str]) -> str:
    """The ranks' ``PYTHONPATH``: the job's own, then the rank hooks directory (never shadowing)."""
    path = base_env.get(envnames.PYTHONPATH)
    return f"{path}{os.pathsep}{HOOKS_DIR}" if path else HOOKS_DIR


class DebugConsole:
    """Which rank holds the launcher's terminal, and what Ctrl-C and stops do meanwhile.

    Args:
        debug_rank: ``--debug-rank`` (holds the terminal for the whole run), or None.
        postmortem: ``--pdb``: the first failing rank of an attempt may ask for the terminal.
        emit: ``emit(event, **fields)`` for events.jsonl.
        clock: Monotonic clock (tests pass a fake one).
        terminal_fd: The launcher's terminal (its stdin).
    """

    def __init__(self, debug_rank: Optional[int], postmortem: bool, emit: Callable[..., object],
                 clock: Callable[[], float] = time.monotonic, terminal_fd: int = 0):
        self.debug_rank = debug_rank
        self.postmortem = postmortem
        self.emit = emit
        self.clock = clock
        self.holder: Optional[int] = debug_rank
        self._holder_pid: Optional[int] = None
        self._granted: Set[int] = set()  # attempts whose post-mortem terminal is given out
        self._last_press: Optional[float] = None
        self._told = False
        self._fd = terminal_fd
        self._tty = os.ttyname(terminal_fd) if os.isatty(terminal_fd) else None
        self._saved = _termios_get(terminal_fd) if self._tty else None
        if debug_rank is not None and self._tty is None:
            log.warning("--debug-rank %d: the launcher's stdin is not a terminal; rank %d reads it anyway",
                        debug_rank, debug_rank)

    def has_terminal(self, rank: int) -> bool:
        """Whether ``rank`` is started on the launcher's stdin, stdout and stderr (``--debug-rank``)."""
        return rank == self.debug_rank

    def holding(self, pids: Mapping[int, int]) -> Set[int]:
        """The running rank that holds the terminal, as a set (empty if none).

        Args:
            pids: Rank -> pid of the running ranks: a post-mortem holder counts only while the very
                process that asked is running (not the same rank restarted).
        """
        if self.debug_rank is not None:
            return {self.debug_rank} & set(pids)
        if self.holder is not None and pids.get(self.holder) == self._holder_pid:
            return {self.holder}
        return set()

    def interrupt(self, pids: Mapping[int, int], send: Callable[[Sequence[int], int], None]) -> bool:
        """A Ctrl-C reached the launcher: pass it to the rank holding the terminal.

        Returns:
            True when it was passed on; False when no running rank holds the terminal, or when it
            is the second Ctrl-C within ``DOUBLE_PRESS_SECONDS`` (the launcher acts on it itself).
        """
        holder = self.holding(pids)
        if not holder:
            return False
        now = self.clock()
        if self._last_press is not None and now - self._last_press < DOUBLE_PRESS_SECONDS:
            self._last_press = None
            return False
        self._last_press = now
        send(sorted(holder), signal.SIGINT)
        rank = min(holder)
        self.emit("debug_interrupt", rank=rank)
        if not self._told:
            self._told = True
            log.info("Ctrl-C passed to rank %d (it holds the terminal); press Ctrl-C twice within %.0f s to "
                     "stop the job", rank, DOUBLE_PRESS_SECONDS)
        return True

    def request(self, args: Mapping[str, object], attempt: Optional[int], failing: bool) -> Dict[str, object]:
        """A rank asks for the terminal for its post-mortem (``--pdb``): the answer to send back.

        Args:
            args: The request's ``rank`` and ``pid``.
            attempt: The running attempt, None while stopping or between attempts.
            failing: Whether the attempt already has a failure (the group is being stopped).
        """
        rank = _as_int(args.get("rank"))
        if not self.postmortem:
            error = "the launcher was not started with --pdb"
        elif self._tty is None:
            error = "the launcher has no terminal"
        elif rank is None:
            error = "malformed request"
        elif self.debug_rank is not None and rank != self.debug_rank:
            error = f"rank {self.debug_rank} has the terminal (--debug-rank)"
        elif attempt is None or failing:
            error = "the job is already stopping after another rank's failure"
        elif attempt in self._granted:
            error = f"rank {self.holder} already has the terminal"
        else:
            self._granted.add(attempt)
            self.holder, self._holder_pid = rank, _as_int(args.get("pid"))
            self.emit("debugger_attached", attempt=attempt, rank=rank, pid=args.get("pid"))
            log.warning("rank %d raised: post-mortem debugger on this terminal; its failure is handled when "
                        "the debugger quits", rank)
            return {"ok": True, "tty": self._tty}
        self.emit("debugger_refused", rank=rank, reason=error)
        return {"ok": False, "error": error}

    def restore_terminal(self) -> None:
        """Put back the terminal modes saved at start (a killed debugger may leave them raw)."""
        if self._saved is None:
            return
        import termios

        try:
            if termios.tcgetattr(self._fd) == self._saved:
                return
            # Blocked SIGTTOU: a launcher in a background job is not stopped by this write.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
            try:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except (OSError, termios.error):
            pass


def _termios_get(fd: int):
    import termios

    try:
        return termios.tcgetattr(fd)
    except (OSError, termios.error):
        return None


def _as_int(value: object) -> Optional[int]:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
