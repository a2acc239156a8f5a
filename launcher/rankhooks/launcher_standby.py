"""A warm standby rank: an interpreter that imported the job's heavy modules and waits to become a rank.

Standard library only, and never ``import launcher`` (the ranks' Python may not have it). Started by
``launcher.supervision.standby`` exactly as a rank is (same interpreter and options, own session,
parent-death signal, the job's token and cgroup) as ``PYTHON [OPTIONS] launcher_standby.py FD``,
where FD is one end of a SOCK_SEQPACKET socket pair whose other end the launcher holds:

1. The launcher sends ``{"modules", "script", "cwd"}``: what to import, and the rank command it will
   most likely run after the interpreter and its options (so the imports see the ``sys.path[0]`` and
   working directory the rank will).
2. The standby imports the modules, refuses to go on if that started a thread, and answers
   ``{"ready": true, "rss": bytes, "threads": n, "env_read": [...]}`` (``env_read``: the variables
   the imports looked up through ``os.environ``) or ``{"ready": false, "error": "..."}``.
3. It blocks on the socket, touching nothing. On a (re)start the launcher sends
   ``{"env", "argv", "script", "cwd"}`` with the rank's stdin, stdout and stderr (SCM_RIGHTS); the standby
   becomes the rank: those fds on 0-2, ``os.environ`` replaced (which also sets the C-level
   environment), ``sys.argv``, ``sys.orig_argv``, ``sys.path[0]`` as Python sets it, the working
   directory, the signal dispositions and mask it was born with, and a fresh ``__main__``; then it
   runs the script or module with ``python script.py`` semantics (exit codes, tracebacks,
   KeyboardInterrupt). End-of-file on the socket (the launcher is done with it) ends it quietly.
"""

_FRESH_MAIN = dict(globals())  # what a script's __main__ holds before its first line: the rank's starts so

import json  # noqa: E402  (after the snapshot above)
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
_FRESH_HANDLERS = {s: signal.getsignal(s) for s in _SIGNALS}
_FRESH_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
_MAX_MESSAGE = 1 << 22


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


def _rss():
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _preload(modules):
    """Import ``modules``; returns the variables they looked up through ``os.environ``."""
    environ_type = type(os.environ)
    original = environ_type.__getitem__
    read = set()

    def recording(self, key):
        read.add(key if isinstance(key, str) else os.fsdecode(key))
        return original(self, key)

    environ_type.__getitem__ = recording
    try:
        for name in modules:
            __import__(name)
    finally:
        environ_type.__getitem__ = original
    return sorted(read)


def _prepare(sock):
    message, _fds = _receive(sock)
    module, target, _args = _entry(message["script"])
    os.chdir(message["cwd"])
    _set_path0(_path0(module, target, message["cwd"]))
    try:
        env_read = _preload(message["modules"])
    except BaseException as exc:  # a module that fails to import: the ranks start cold and say why
        _send(sock, {"ready": False, "error": "importing failed: {}: {}".format(type(exc).__name__, exc)})
        return False
    threads = _threads()
    if threads > 1:
        _send(sock, {"ready": False, "threads": threads,
                     "error": "importing {} started {} thread(s)".format(", ".join(message["modules"]), threads - 1)})
        return False
    _send(sock, {"ready": True, "rss": _rss(), "threads": threads, "env_read": env_read})
    return True


def _become(sock):
    """Wait for the rank's start; returns ``(module?, target)`` once this process is the rank."""
    message, fds = _receive(sock, 3)
    sys.stdout.flush()
    sys.stderr.flush()
    for target_fd, fd in enumerate(fds):
        os.dup2(fd, target_fd)  # dup2 leaves 0-2 inheritable, as they are in a fresh interpreter
        os.close(fd)
    sock.close()
    os.chdir(message["cwd"])
    os.environ.clear()  # unsetenv / putenv: the C-level environment follows
    os.environ.update(message["env"])
    module, target, args = _entry(message["script"])
    _set_path0(_path0(module, target, message["cwd"]))
    sys.argv = ["-m" if module else target, *args]
    sys.orig_argv = list(message["argv"])
    for signum, handler in _FRESH_HANDLERS.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, _FRESH_MASK)
    return module, target


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
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    try:
        if not _prepare(sock):
            return 3
        module, target = _become(sock)
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
