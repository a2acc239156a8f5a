"""Warm-standby probe: dump everything a rank could use to tell how it was started, then end as asked.

Standard library only. Writes ``--out DIR/<attempt>-<rank>.json`` (atomically) with os.environ, the
C-level environment (libc ``getenv`` of each name, and libc's ``environ`` array), /proc/self/environ,
sys.argv, sys.orig_argv, sys.path, sys.flags, ``__main__``'s attributes, every signal disposition and
the blocked mask, session and process group, the parent-death signal, working directory, umask,
stdio targets and modes, open fds and threads. Then, on the attempt given by ``--fail-attempt``, the
rank given by ``--fail-rank`` ends with ``--mode`` (earlier attempts with exit 3), once the file
``--fail-when`` exists: ``exit3`` (SystemExit(3)), ``raise`` (uncaught exception), ``kill`` (SIGKILL
itself), ``interrupt`` (KeyboardInterrupt), ``exitmsg`` (SystemExit with a message); everyone else
exits 0, or with ``--wait-term`` waits for SIGTERM (the dying gasp) with a handler that writes
``<attempt>-<rank>.term`` (after ``.term.ready``) and exits 143.
"""

import argparse
import atexit
import ctypes
import json
import os
import signal
import sys
import time


def _proc_status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return None


def _fd_target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _c_environ():
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    entries, index = [], 0
    while environ[index]:
        entries.append(environ[index].decode(errors="surrogateescape"))
        index += 1
    getenv = {name: (libc.getenv(name.encode()) or b"").decode(errors="surrogateescape") for name in os.environ}
    return sorted(entries), getenv


def _pdeathsig():
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


def _handler_name(handler):
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return str(handler)
    return getattr(handler, "__qualname__", repr(handler))


def snapshot():
    """Everything compared between a cold and a warm start."""
    import __main__

    c_entries, c_getenv = _c_environ()
    with open("/proc/self/environ", "rb") as fh:
        proc_environ = sorted(e.decode(errors="surrogateescape") for e in fh.read().split(b"\0") if e)
    umask = os.umask(0)
    os.umask(umask)
    return {
        "environ": dict(os.environ),
        "c_environ": c_entries,
        "c_getenv": c_getenv,
        "proc_environ": proc_environ,
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "path": sys.path,
        "flags": repr(sys.flags),
        "executable": sys.executable,
        "main": {key: repr(value) for key, value in vars(__main__).items()
                 if key.startswith("__") and key not in ("__builtins__",)},
        "main_spec": repr(__main__.__spec__),
        "main_file": __main__.__file__,
        "main_loader": type(__main__.__loader__).__name__,
        "name": __name__,
        "signals": {str(s): _handler_name(signal.getsignal(s))
                    for s in range(1, signal.NSIG) if s in signal.valid_signals()
                    and s not in (signal.SIGKILL, signal.SIGSTOP)},
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "sigblk": _proc_status("SigBlk"),
        "sigign": _proc_status("SigIgn"),
        "session_leader": os.getsid(0) == os.getpid(),
        "group_leader": os.getpgid(0) == os.getpid(),
        "pdeathsig": _pdeathsig(),
        "cwd": os.getcwd(),
        "umask": umask,
        "stdio": [_fd_target(fd) for fd in (0, 1, 2)],
        "stdio_inheritable": [os.get_inheritable(fd) for fd in (0, 1, 2)],
        "stdio_modes": [repr(getattr(stream, "line_buffering", None)) + repr(getattr(stream, "encoding", None))
                        for stream in (sys.stdin, sys.stdout, sys.stderr)],
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "affinity": sorted(os.sched_getaffinity(0)),
        "scheduling": [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)],  # a standby waits as SCHED_IDLE/BATCH
        "token_in_proc_environ": any(e.startswith("LAUNCHER_JOB_TOKEN=") for e in proc_environ),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempt", type=int, default=0)
    parser.add_argument("--wait-term", action="store_true")
    parser.add_argument("--fail-when", help="the failing rank waits until this file exists (the test's trigger)")
    args, _extra = parser.parse_known_args()
    rank = int(os.environ.get("RANK", os.environ.get("RANK_ID", "0")))  # PyTorch's name, else MindSpore's
    attempt = int(os.environ.get("LAUNCHER_ATTEMPT", "0"))
    doc = snapshot()
    path = os.path.join(args.out, f"{attempt}-{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    print(f"probe rank {rank} attempt {attempt}", flush=True)
    atexit.register(print, f"probe rank {rank} atexit", flush=True)  # runs on every exit but SIGKILL and _exit
    if rank == args.fail_rank and attempt <= args.fail_attempt:
        while args.fail_when and not os.path.exists(args.fail_when):
            time.sleep(0.01)
        _fail(args.mode if attempt == args.fail_attempt else "exit3")  # earlier attempts: a plain failure first
    if args.wait_term:
        _wait_term(os.path.join(args.out, f"{attempt}-{rank}.term"))
    return 0


def _wait_term(path):
    """The dying gasp: a handler that writes ``path`` and exits 143, installed before the ready file."""
    def on_term(_signum, _frame):
        with open(path, "w") as fh:
            fh.write("term\n")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    with open(path + ".ready", "w"):
        pass
    while True:
        signal.pause()


def _fail(mode):
    if mode == "exit3":
        raise SystemExit(3)
    if mode == "exitmsg":
        sys.exit("probe says goodbye")
    if mode == "raise":
        raise RuntimeError("probe failure")
    if mode == "interrupt":
        raise KeyboardInterrupt
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
