"""A warm standby rank: an interpreter that imported the job's heavy modules and waits to become a rank.

Standard library only, and never ``import launcher`` (the ranks' Python may not have it). Started by
``launcher.supervision.standby`` exactly as a rank is (same interpreter and options, own session,
parent-death signal, the job's token and cgroup) as ``PYTHON [OPTIONS] launcher_standby.py FD``,
where FD is one end of a SOCK_SEQPACKET socket pair whose other end the launcher holds:

1. The launcher sends ``{"modules", "script", "cwd", "auto"}``: what to import, and the rank command
   it will most likely run after the interpreter and its options (so the imports see the
   ``sys.path[0]`` and working directory the rank will). ``auto``: the modules are what the ranks
   imported (``--preload auto``): only installed packages among them are imported, a failing one is
   skipped.
2. The standby imports the modules one by one; a module whose import started a thread (other than
   an OpenBLAS library's worker pool, as ``import numpy`` starts) or opened a character device (an
   accelerator: ``/dev/davinci*``, ...) is refused. It answers ``{"ready":
   true, "rss": bytes, "threads": n, "env_read": [...], "imported": [...]}`` (``env_read``: the
   variables the imports looked up through ``os.environ``) or ``{"ready": false, "module": name,
   "error": "..."}``. The launcher may send further ``{"modules", "auto"}`` (the ranks imported
   more since): the same again.
3. It blocks on the socket, touching nothing. On a (re)start the launcher sends
   ``{"env", "argv", "script", "cwd"}`` with the rank's stdin, stdout and stderr (SCM_RIGHTS); the standby
   becomes the rank: those fds on 0-2, ``os.environ`` replaced (which also sets the C-level
   environment), ``sys.argv``, ``sys.orig_argv``, ``sys.path[0]`` as Python sets it, the working
   directory, the signal dispositions and mask it was born with, and a fresh ``__main__``; then it
   runs the script or module with ``python script.py`` semantics (exit codes, tracebacks,
   KeyboardInterrupt). End-of-file on the socket (the launcher is done with it) ends it quietly.
"""

_FRESH_MAIN = dict(globals())  # what a script's __main__ holds before its first line: the rank's starts so

import importlib.util  # noqa: E402  (after the snapshot above)
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402

_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
_FRESH_HANDLERS = {s: signal.getsignal(s) for s in _SIGNALS}
_FRESH_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
_MAX_MESSAGE = 1 << 22
_FRESH_POLICY = None  # the scheduling policy the standby was born with (see _background)
#: Character devices every process may hold: not accelerators.
_BENIGN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
                   "/dev/console")


def _receive(sock, with_fds=0):
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, with_fds)
    if not data:
        raise EOFError
    return json.loads(data.decode("utf-8", "surrogateescape")), fds


def _send(sock, message):
    sock.send(json.dumps(message).encode())


def _path0(module, target, cwd):
    """``sys.path[0]`` as the interpreter sets it for ``python script.py`` / ``python -m module``."""
    if getattr(sys.flags, "safe_path", False):
        return None
    if module:
        return cwd
    return os.path.dirname(os.path.realpath(os.path.join(cwd, target)))


def _set_path0(value):
    if sys.path and sys.path[0] == _set_path0.current:
        del sys.path[0]
    if value is not None:
        sys.path.insert(0, value)
    _set_path0.current = value


_set_path0.current = sys.path[0] if sys.path else None


def _entry(argv):
    """``(module?, target, args)`` of the rank command (``argv`` after the interpreter and its options)."""
    if argv[0].startswith("-m"):
        module = argv[0][2:] or argv[1]
        return True, module, argv[2:] if not argv[0][2:] else argv[1:]
    return False, argv[0], argv[1:]


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


#: An OpenBLAS build's thread count, by the prefixes and suffixes of its builds' symbols (numpy's and
#: scipy's wheels bundle ``scipy_openblas`` with 64-bit integers).
_BLAS_NUM_THREADS = [p + "openblas_get_num_threads" + s for p in ("", "scipy_") for s in ("", "64_")]


def _blas_pool_threads():
    """Worker threads of the OpenBLAS libraries loaded here: each keeps a pool of its thread count
    less one, started when ``import numpy`` (or scipy) loads it, sized from ``OPENBLAS_NUM_THREADS``,
    ``OMP_NUM_THREADS`` and the CPU set, which the standby shares with its rank. The threads only
    wait for BLAS calls: a cold rank that imports numpy starts the same pool. Other threads refuse."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line[line.index("/"):].rstrip("\n") for line in maps if "openblas" in line and ".so" in line}
    except (OSError, ValueError):
        return 0
    import ctypes  # only here: most standbys never need it

    pool = 0
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        count = next((getattr(library, name) for name in _BLAS_NUM_THREADS if hasattr(library, name)), None)
        pool += max(int(count()) - 1, 0) if count is not None else 0
    return pool


def _rss():
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _devices():
    """Character devices among this process's open files, other than the terminal's and /dev/null's kind."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        link = "/proc/self/fd/" + fd
        try:
            if stat.S_ISCHR(os.stat(link).st_mode):
                target = os.readlink(link)
                if target not in _BENIGN_DEVICES and not target.startswith("/dev/pts/"):
                    found.append(target)
        except OSError:  # the listing's own fd, or closed meanwhile
            continue
    return sorted(set(found))


def _installed(name):
    """Whether ``name``'s top-level package is installed (under a site-packages or dist-packages
    directory): what ``--preload auto`` imports. The standard library is cheap to import, the job's
    own modules (next to the script) may do anything at import: neither is preloaded."""
    top = name.partition(".")[0]
    if top.startswith("launcher_") or top in ("__main__", "sitecustomize", "usercustomize"):
        return False
    module = sys.modules.get(top)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError):
        return False
    where = spec and (spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or ()), None))
    return bool(where) and any(part in ("site-packages", "dist-packages") for part in where.split(os.sep))


def _iterating(code):
    """Whether a lookup comes from walking the whole environment (``os.environ.items()``, ``.copy()``):
    a module that does so at import (networkx does) would otherwise make every variable, the
    per-attempt ones too, count as read, and no standby would ever match its rank."""
    return ((code.co_name == "__iter__" and "_collections_abc" in code.co_filename)
            or (code.co_name == "copy" and code.co_filename in (os.__file__, "<frozen os>")))


class _Refused(Exception):
    """A module that must not be in a standby: ``(module, reason)``."""


def _import(names, auto, env_read):
    """Import ``names`` in order, each checked for threads and devices; returns those imported.

    ``auto``: the names are what the ranks imported: only installed packages, and one that fails is
    skipped (the rank may have caught that too). ``env_read`` gets the variables the imports read.
    Raises _Refused.
    """
    environ_type = type(os.environ)
    original = environ_type.__getitem__

    def recording(self, key):
        if not _iterating(sys._getframe(1).f_code):
            env_read.add(key if isinstance(key, str) else os.fsdecode(key))
        return original(self, key)

    imported = []
    environ_type.__getitem__ = recording
    try:
        for name in names:
            if name in sys.modules or (auto and not _installed(name)):
                continue
            try:
                __import__(name)
            except Exception as exc:
                if not auto:
                    raise _Refused(name, "importing failed: {}: {}".format(type(exc).__name__, exc))
                continue
            imported.append(name)
            threads, devices = _threads(), _devices()
            started = threads - 1 - (_blas_pool_threads() if threads > 1 else 0)
            if started > 0:
                raise _Refused(name, "importing {} started {} thread(s)".format(name, started))
            if devices:
                raise _Refused(name, "importing {} opened {} (a device: only a rank may hold one)".format(
                    name, ", ".join(devices)))
    finally:
        environ_type.__getitem__ = original
    return imported


def _load(sock, message, env_read):
    """Import what ``message`` names and answer; False when this standby must not serve."""
    try:
        imported = _import(message["modules"], message.get("auto", False), env_read)
    except _Refused as exc:
        module, error = exc.args
        _send(sock, {"ready": False, "module": module, "error": error})
        return False
    except BaseException as exc:  # SystemExit or worse from an import: the ranks start cold and say why
        _send(sock, {"ready": False, "error": "importing failed: {}: {}".format(type(exc).__name__, exc)})
        return False
    _send(sock, {"ready": True, "rss": _rss(), "threads": _threads(), "env_read": sorted(env_read),
                 "imported": imported})
    return True


def _prepare(sock):
    message, _fds = _receive(sock)
    module, target, _args = _entry(message["script"])
    os.chdir(message["cwd"])
    _set_path0(_path0(module, target, message["cwd"]))
    env_read = set()
    if not _load(sock, message, env_read):
        return None
    while True:  # more modules (the ranks imported more since), or the rank's start
        message, fds = _receive(sock, 3)
        if "env" in message:
            return message, fds
        if not _load(sock, message, env_read):
            return None


def _background():
    """Wait and import in the background: as SCHED_IDLE where this process may leave it again (the
    kernel lets it when it holds CAP_SYS_NICE or RLIMIT_NICE allows nice 0), which takes only CPU
    time the ranks leave; else as SCHED_BATCH (any process may go back from it), whose woken task does
    not preempt the running one. Either way the launcher hands every rank of a restart over before the
    first standby takes its CPU. Returns the policy to restore as the rank, or None (keep as is)."""
    try:
        policy = os.sched_getscheduler(0)
        if policy != os.SCHED_OTHER:
            return policy
        if may_leave_idle():
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            try:  # make sure: a rank left in SCHED_IDLE would starve
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                raise SystemExit("cannot leave SCHED_IDLE again: this standby must not become a rank")
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return policy
    except (AttributeError, OSError):
        return None


def may_leave_idle():
    """The kernel's rule for leaving SCHED_IDLE (``can_nice``): CAP_SYS_NICE, or an RLIMIT_NICE that
    allows this process's nice value (``20 - limit <= nice``)."""
    try:
        with open("/proc/self/status") as fh:
            caps = next((line.split()[1] for line in fh if line.startswith("CapEff:")), "0")
        if int(caps, 16) >> 23 & 1:  # CAP_SYS_NICE
            return True
        with open("/proc/self/limits") as fh:
            limit = next((line.split()[3] for line in fh if line.startswith("Max nice priority")), "0")
        return limit == "unlimited" or 20 - int(limit) <= os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, ValueError, IndexError, AttributeError):
        return False


def _become(sock, message, fds):
    """Become the rank ``message`` describes; returns ``(module?, target)``."""
    if _FRESH_POLICY == getattr(os, "SCHED_OTHER", None):
        os.sched_setscheduler(0, _FRESH_POLICY, os.sched_param(0))  # the rank's policy, as a cold one has
    sys.stdout.flush()
    sys.stderr.flush()
    for target_fd, fd in enumerate(fds):
        os.dup2(fd, target_fd)  # dup2 leaves 0-2 inheritable, as they are in a fresh interpreter
        os.close(fd)
    sock.close()
    os.chdir(message["cwd"])
    _replace_environ(message["env"])
    module, target, args = _entry(message["script"])
    _set_path0(_path0(module, target, message["cwd"]))
    sys.argv = ["-m" if module else target, *args]
    sys.orig_argv = list(message["argv"])
    for signum, handler in _FRESH_HANDLERS.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, _FRESH_MASK)
    return module, target


def _replace_environ(new):
    """``os.environ`` (and through ``unsetenv`` / ``putenv`` the C-level environment) becomes ``new``.

    Only the variables that differ are unset or set: the standby started with the previous attempt's
    environment, and each ``putenv`` scans the C environment (clearing and setting all of 100 took
    1.4 ms per rank here). Then the mapping is put in ``new``'s order, as a fresh interpreter's is.
    """
    old = dict(os.environ)
    for name in old.keys() - new.keys():
        del os.environ[name]
    for name, value in new.items():
        if old.get(name) != value:
            os.environ[name] = value
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        data.clear()
        data.update((os.environ.encodekey(name), os.environ.encodevalue(value)) for name, value in new.items())


def _fresh_main(target):
    main = type(sys)("__main__")
    main.__dict__.update({k: v for k, v in _FRESH_MAIN.items() if k not in ("__file__", "__doc__")})
    main.__doc__ = None
    if target is not None:
        main.__file__ = target
        loader = _FRESH_MAIN.get("__loader__")
        if loader is not None:
            main.__loader__ = type(loader)("__main__", target)
    sys.modules["__main__"] = main
    return main


def _run(module, target):
    """Run the rank's code the way ``python`` does; returns only through an exception."""
    if module:
        import runpy

        _fresh_main(None)
        return runpy._run_module_as_main(target, alter_argv=True)  # what `python -m` calls
    path = os.path.abspath(target)  # python makes the script's __file__ and code file name absolute
    main = _fresh_main(path)
    with open(path, "rb") as fh:
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _user_traceback(tb, module):
    """The traceback from the first frame ``python`` itself would show (runpy's for ``-m``)."""
    if module:
        import runpy

        first = runpy._run_module_as_main.__code__
        while tb is not None and tb.tb_frame.f_code is not first:
            tb = tb.tb_next
        return tb
    tb = tb.tb_next  # _main
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _main():
    global _FRESH_POLICY
    _FRESH_POLICY = _background()
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    try:
        start = _prepare(sock)
        if start is None:
            return 3
        module, target = _become(sock, *start)
    except (EOFError, ConnectionError):  # the launcher no longer needs this standby
        return 0
    import atexit

    atexit.register(_exit_by_sigint)
    try:
        _run(module, target)
    except SystemExit:
        raise  # the interpreter handles it exactly as for the script
    except BaseException as exc:
        tb = _user_traceback(exc.__traceback__, module)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        _interrupted.append(isinstance(exc, KeyboardInterrupt))
        return 1
    return 0


_interrupted = []


def _exit_by_sigint():
    """An uncaught KeyboardInterrupt: python exits by SIGINT (status -2 / 130) after the atexit
    handlers; registered before the script runs, so it runs after the script's own."""
    if any(_interrupted):
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    sys.exit(_main())
