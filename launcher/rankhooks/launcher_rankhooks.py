"""Debugging hooks that run inside a rank, with the rank's own interpreter.

Standard library only, and never ``import launcher``: the ranks may run a Python that does not have
the launcher installed. The launcher puts this file's directory at the *end* of ``PYTHONPATH`` (so it
never shadows a module of the job) and uses it two ways:

- ``PYTHONBREAKPOINT=launcher_rankhooks.breakpoint_hint`` for ranks without the terminal:
  ``breakpoint()`` prints one line saying how to debug that rank, and the rank carries on, instead
  of pdb reading end-of-file from /dev/null and dying with a ``bdb.BdbQuit`` traceback.
- ``python launcher_rankhooks.py SCRIPT.py ARGS`` (or ``-m MODULE ARGS``) with ``launcher run
  --pdb``: runs the job's script; on an uncaught exception it prints the traceback as usual, asks
  the launcher for its terminal over the control socket, and runs ``pdb`` post-mortem on it. Only
  the first failing rank of an attempt gets it; the others exit as they would have.
"""

import json
import os
import socket
import sys
import traceback

_hinted = set()


def _rank():
    return os.environ.get("RANK") or os.environ.get("RANK_ID") or "?"


def breakpoint_hint(*_args, **_kwargs):
    """``sys.breakpointhook`` for a rank without the terminal: one line per call site, then carry on."""
    caller = sys._getframe(1)
    where = "{}:{}".format(os.path.basename(caller.f_code.co_filename), caller.f_lineno)
    if where in _hinted:
        return
    _hinted.add(where)
    rank = _rank()
    holder = os.environ.get("LAUNCHER_DEBUG_RANK")
    why = "rank {} has the terminal".format(holder) if holder else "ranks have no terminal"
    sys.stderr.write("breakpoint() at {} skipped: {}; run the launcher with --debug-rank {} to debug "
                     "rank {} here\n".format(where, why, rank, rank))
    sys.stderr.flush()


def _connect(sock, path):
    """Connect through the directory's fd, as the launcher binds: a unix socket path must be short."""
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        via_fd = "/proc/self/fd/{}".format(dir_fd)
        sock.connect(os.path.join(via_fd, os.path.basename(path)) if os.path.isdir(via_fd) else path)
    finally:
        os.close(dir_fd)


def _ask_for_terminal():
    """The launcher's terminal path, or None with the reason it gave (or why it could not be asked)."""
    path = os.environ.get("LAUNCHER_CONTROL_SOCKET")
    if not path:
        return None, "no launcher control socket"
    request = {"command": "debug-terminal", "args": {"rank": _rank(), "pid": os.getpid()}}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30.0)
            _connect(sock, path)
            sock.sendall((json.dumps(request) + "\n").encode())
            answer = json.loads(sock.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as exc:
        return None, "cannot reach the launcher: {}".format(exc)
    if answer.get("ok") and answer.get("tty"):
        return answer["tty"], None
    return None, answer.get("error") or "refused"


def _post_mortem(tb):
    tty, why = _ask_for_terminal()
    if tty is None:
        sys.stderr.write("post-mortem debugger not started: {}\n".format(why))
        return
    import pdb

    fd = os.open(tty, os.O_RDWR | os.O_NOCTTY)
    with open(fd, "r") as term_in, open(os.dup(fd), "w", buffering=1) as term_out:  # a tty cannot seek: no "r+"
        term_out.write("\n[launcher] rank {} raised; post-mortem debugger (q to let the job end)\n".format(_rank()))
        debugger = pdb.Pdb(stdin=term_in, stdout=term_out)
        debugger.reset()
        debugger.interaction(None, tb)


def _run(argv):
    import runpy

    if argv[:1] == ["-m"] and len(argv) > 1:
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python SCRIPT` would have it
        runpy.run_path(argv[0], run_name="__main__")


def _user_frames(tb):
    """The traceback from the job's first frame on: this wrapper's and runpy's frames are noise."""
    import runpy

    ours = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))
    while tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != "<frozen runpy>" and os.path.abspath(name) not in ours:
            break
        tb = tb.tb_next
    return tb


def main(argv):
    """Run the job's script (``argv``); post-mortem on its uncaught exception."""
    try:
        _run(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        kind, value, tb = sys.exc_info()
        tb = _user_frames(tb)
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        _post_mortem(tb)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
