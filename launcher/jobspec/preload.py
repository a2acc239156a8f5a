"""``--preload``: the pure rules of warm standby ranks (which commands, which variables).

A standby (``launcher.supervision.standby``) is an interpreter that already imported the preload
modules and becomes a rank on a (re)start. It can stand in for a rank only when the rank's command
is a Python interpreter running a script or ``-m module``, and only while the variables that act at
interpreter start or import are the ones the standby started with. Both rules live here, without
I/O, so they are unit-tested apart from the processes.
"""

import os
import re
import sys
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from launcher.common.errors import UsageError
from launcher.common.records import record

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Interpreter options whose value is the next token (``-W error``) unless attached (``-Werror``).
_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")
# Options after which there is no script: the program text or stdin, or the interpreter's own output.
_NOT_A_SCRIPT = ("-c", "-", "-h", "-?", "--help", "-V", "--version", "--help-env", "--help-xoptions",
                 "--help-all", "-i")

#: Variables read when the interpreter starts or its libraries load: a standby that started with
#: other values than the rank gets would not be the same process (sys.path, the allocator, threads
#: pools, preloaded libraries such as TaskD's libtaskd.so, locale and stdio encodings).
START_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "MALLOC_", "GLIBC_", "LC_", "TORCH_")
START_NAMES = ("LANG", "LANGUAGE", "HOME", "PATH", "TMPDIR")


#: ``--preload`` values that are not module lists.
AUTO, NONE = "auto", "none"
#: What the ranks record that is never a standby's to import: the launcher's hooks, the script.
_NEVER = ("__main__", "sitecustomize", "usercustomize")
#: The standard library: cheap to import, so not worth a standby's memory (Python 3.10+ lists it).
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def preload_mode(text: Optional[str]) -> Tuple[bool, Tuple[str, ...]]:
    """``--preload``'s value as ``(auto, modules)``: unset or ``auto`` -> ``(True, ())``, ``none`` or
    empty -> ``(False, ())``, a list -> ``(False, modules)``.

    Raises:
        UsageError: a name that is not a dotted Python module name.
    """
    if text is None or text.strip() == AUTO:
        return True, ()
    if text.strip() == NONE:
        return False, ()
    return False, parse_modules(text)


def learned_modules(names: Iterable[str], known: Iterable[str], excluded: Iterable[str]) -> List[str]:
    """The names the ranks recorded that a standby has yet to import, in order, once each.

    Args:
        names: Names as recorded (``launcher_imports``), duplicates and all.
        known: Names already preloaded or pending.
        excluded: Modules refused in this run: they and their submodules are left out.
    """
    seen = set(known)
    prefixes = tuple(excluded)
    out = []
    for name in names:
        if (name in seen or not _MODULE.match(name) or name.startswith("launcher_") or name in _NEVER
                or name.partition(".")[0] in _STDLIB
                or any(name == p or name.startswith(p + ".") for p in prefixes)):
            continue
        seen.add(name)
        out.append(name)
    return out


def parse_modules(text: Optional[str]) -> Tuple[str, ...]:
    """``"torch, numpy"`` -> ``("torch", "numpy")``; empty or None -> ``()``.

    Raises:
        UsageError: a name that is not a dotted Python module name.
    """
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    bad = [name for name in names if not _MODULE.match(name)]
    if bad:
        raise UsageError(f"--preload {text!r}: {', '.join(repr(b) for b in bad)} "
                         f"{'is not a module name' if len(bad) == 1 else 'are not module names'}",
                         ["expected a comma-separated list like torch,numpy"])
    return tuple(dict.fromkeys(names))


@record(frozen=True)
class PythonEntry:
    """A rank command that a standby can run: ``PYTHON [OPTIONS] script.py ARGS`` or ``-m module ARGS``.

    Attributes:
        interpreter: The interpreter and its options, as the command gives them (the standby starts so).
        module: True for ``-m module``.
        target: The script path or the module name, as given.
        args: The script's arguments.
    """

    interpreter: Tuple[str, ...]
    module: bool
    target: str
    args: Tuple[str, ...]


def python_entry(command: Sequence[str]) -> Optional[PythonEntry]:
    """The command as a :class:`PythonEntry`, or None when it is not a Python interpreter running a
    script or ``-m module`` (another program, ``-c``, stdin, an interactive or help option)."""
    if not command or not _PYTHON.match(os.path.basename(command[0])):
        return None
    index = 1
    while index < len(command):
        token = command[index]
        if _without_script(token):
            return None
        if token == "-m" or (token.startswith("-m") and not token.startswith("--")):
            return _module_entry(command, index)
        if token == "--":
            index += 1
            break
        if not token.startswith("-"):
            break
        index += 2 if token in _WITH_VALUE else 1
    if index >= len(command):
        return None
    return PythonEntry(tuple(command[:index]), False, command[index], tuple(command[index + 1:]))


def _without_script(token: str) -> bool:
    """Whether an interpreter option means no script runs: ``-c``, stdin, ``-i``, help or version."""
    return token in _NOT_A_SCRIPT or token.startswith("-c") or (token.startswith("-") and "i" in token[1:2])


def _module_entry(command: Sequence[str], index: int) -> Optional[PythonEntry]:
    """``command[index]`` is ``-m`` or ``-mMODULE``: the entry, or None when no module follows."""
    token = command[index]
    module = token[2:] or (command[index + 1] if index + 1 < len(command) else "")
    rest = index + (1 if token[2:] else 2)
    return PythonEntry(tuple(command[:index]), True, module, tuple(command[rest:])) if module else None


def is_start_variable(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether ``name`` acts at interpreter start or import (``extra``: names the preloaded modules read)."""
    return name.startswith(START_PREFIXES) or name in START_NAMES or name in set(extra)


def start_env_diff(standby_env: Mapping[str, str], rank_env: Mapping[str, str], extra: Iterable[str] = ()) -> List[str]:
    """The start-time variables whose value (or presence) differs between a standby and a rank, sorted.

    Args:
        standby_env: The environment the standby started with.
        rank_env: The environment the rank gets now.
        extra: Further names that count (those the preloaded modules read while importing).
    """
    extra = set(extra)
    names = {name for name in (*standby_env, *rank_env) if is_start_variable(name, extra)}
    return sorted(name for name in names if standby_env.get(name) != rank_env.get(name))
