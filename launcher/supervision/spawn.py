"""Mechanism: starting one rank's process in a session of its own, with ``PR_SET_PDEATHSIG=SIGKILL``.

The parent-death signal can only be set by the process itself, before it runs the rank's program.
Set from a ``preexec_fn``, it makes Python ``fork`` the whole launcher and run Python in the child
before the ``exec``: 2-4 ms of the launcher's time per rank on this 2-core machine, more when it is
busy, since the launcher waits until the child was scheduled and reached its ``exec``. Without a
``preexec_fn`` Python uses ``vfork`` and runs only C between the fork and the ``exec`` (0.2-0.3 ms;
docs/benchmarks.md, launch). So a rank starts as ``setpriv --pdeathsig KILL -- COMMAND``
(util-linux 2.33 or later): setpriv sets the signal and ``exec``s the command in the same process,
which keeps it (``prctl(2)``: kept across ``execve`` of a program that is not set-user-ID and has no
file capabilities). The rank is the process it was with the ``preexec_fn``: same pid, session,
environment, open files, parent-death signal.

The rank starts the old way (``preexec_fn``) where the wrapper could change what anyone sees: no
usable setpriv (``setpriv --pdeathsig KILL -- setpriv --version`` did not succeed), a CPU set to apply
(``--bind-cores``: set in the child so that every thread the rank starts inherits it), or a program
that would not ``exec`` directly: not found, not executable, neither an ELF binary nor a ``#!``
script whose interpreter exists. There ``Popen`` raises the ``OSError`` the launcher reports, as
before, where setpriv would exit 127 in the rank's place, or hand a script without ``#!`` to
``/bin/sh`` as ``execvp`` does.
"""

import functools
import os
import subprocess
from typing import Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

from launcher.common.inputfiles import InputFileError, open_regular
from launcher.common.programs import which
from launcher.supervision import guard as guard_mod
from launcher.supervision.states import ExitInfo

#: The wrapper's arguments before the rank's command.
PDEATHSIG_ARGS = ("--pdeathsig", "KILL", "--")
#: Bytes read from the head of a program to see how the kernel executes it.
_HEAD = 256


class Spawner:
    """Starts ranks; checks once, in the background, whether setpriv can set their parent-death signal.

    Args:
        setpriv: The setpriv program; default: found on ``PATH`` (None: never use it).
    """

    def __init__(self, setpriv: Optional[str] = "") -> None:
        self._setpriv = which("setpriv") if setpriv == "" else setpriv
        self._usable: Optional[bool] = None if self._setpriv else False
        self._probe: Optional[subprocess.Popen] = None
        self._direct: Dict[Tuple[str, str], bool] = {}  # (program, PATH) -> it execs directly
        if self._setpriv:
            try:  # vfork and exec: it runs while the launcher prepares the first attempt
                self._probe = subprocess.Popen([self._setpriv, *PDEATHSIG_ARGS, self._setpriv, "--version"],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, close_fds=True)
            except OSError:
                self._usable = False

    @property
    def probe_pid(self) -> Optional[int]:
        """The probe's pid while its exit is not known (for the event loop's ``watch_pid``)."""
        return self._probe.pid if self._probe is not None and self._usable is None else None

    def probed(self, info: ExitInfo) -> None:
        """The event loop reaped the probe: its exit status decides."""
        if self._usable is None:
            self._usable = info.returncode == 0
            self._probe.returncode = info.returncode

    def usable(self) -> bool:
        """Whether ranks start through setpriv (waits for the probe the first time)."""
        if self._usable is None:
            try:
                _, status = os.waitpid(self._probe.pid, 0)
                self._usable = os.waitstatus_to_exitcode(status) == 0
                self._probe.returncode = 0  # reaped here: keep Popen from waiting on it again
            except ChildProcessError:  # reaped elsewhere without ``probed``: its status is lost
                self._usable = False
        return self._usable

    def popen(self, argv: Sequence[str], env: Mapping[str, str], stdio: Mapping[str, int],
              cpus: Optional[FrozenSet[int]]) -> subprocess.Popen:
        """Start ``argv`` in a new session, dying with the launcher, on ``cpus`` (None: unbound)."""
        if cpus is None and self.usable() and self._execs_directly(argv[0], env):
            return subprocess.Popen([self._setpriv, *PDEATHSIG_ARGS, *argv], env=env, **stdio,
                                    start_new_session=True, close_fds=True)
        setup = guard_mod.child_setup if cpus is None else functools.partial(_child_setup_bound, cpus)
        return subprocess.Popen(list(argv), env=env, **stdio, start_new_session=True, close_fds=True,
                                preexec_fn=setup)

    def _execs_directly(self, program: str, env: Mapping[str, str]) -> bool:
        key = (program, env.get("PATH", os.defpath))
        if key not in self._direct:
            self._direct[key] = execs_directly(program, env)
        return self._direct[key]


def execs_directly(program: str, env: Mapping[str, str]) -> bool:
    """Whether ``exec`` of ``program`` succeeds as it is: an executable ELF file, or a ``#!`` script
    whose interpreter is an executable file."""
    path = which(program, env)
    if path is None:
        return False
    try:  # the user's program: its first bytes, through the one reader (a FIFO is not waited for)
        fd = open_regular(path, "program")
    except (OSError, InputFileError):
        return False
    try:
        head = os.read(fd, _HEAD)
    except OSError:
        return False
    finally:
        os.close(fd)
    if head.startswith(b"\x7fELF"):
        return True
    if not head.startswith(b"#!"):
        return False
    words = head[2:].split(b"\n", 1)[0].split()
    interpreter = os.fsdecode(words[0]) if words else ""
    return os.path.isabs(interpreter) and os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)


def _child_setup_bound(cpus: FrozenSet[int]) -> None:
    """``preexec_fn`` of a rank with a CPU set: in the child before exec, so every thread it ever starts
    inherits the set (set from the parent after the start, threads already started would not)."""
    guard_mod.child_setup()
    os.sched_setaffinity(0, cpus)
