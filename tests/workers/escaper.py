"""A rank whose child leaves the rank's process group (the escape tests' worker).

Each rank first starts one escapee (``--escape``): ``setsid`` (a child in a new session), ``setpgid``
(a child in a process group of its own, same session) or ``daemon`` (double fork: the grandchild
sets up a session and re-parents at once). The escapee ignores SIGTERM, SIGINT and SIGHUP, appends
``<rank> <attempt> <pid>`` to ``<ready-file>.escaped`` and execs ``sleep 600`` (with an empty
environment under ``--clear-env``: it drops the launcher's token too). Only then does the rank append
``<rank> <attempt> <pid> <escapees of earlier attempts still alive>`` to ``--ready-file``, and:
  --fail-rank R --exit-code N    rank R exits N on the attempts in --fail-attempts (default 0), once
                                 every local rank of the attempt is up
  --run S                        exit 0 after S seconds (default: wait for a signal)
"""

import argparse
import os
import signal
import sys
import time


def _append(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _lines(path):
    try:
        with open(path) as fh:
            return [line.split() for line in fh]
    except OSError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _escapee(mode, record, clear_env, notify):
    """In the forked child: leave the group, report, become ``sleep`` (never returns)."""
    try:
        if mode == "setpgid":
            os.setpgid(0, 0)
        else:
            os.setsid()
            if mode == "daemon" and os.fork() > 0:
                os._exit(0)  # the grandchild re-parents to the nearest subreaper now
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # kept across exec
        _append(record[0], f"{record[1]} {record[2]} {os.getpid()}\n")
        os.write(notify, b"1")
        os.execve("/bin/sleep", ["sleep", "600"], {} if clear_env else dict(os.environ))
    finally:
        os._exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ready-file", required=True)
    p.add_argument("--escape", choices=("setsid", "setpgid", "daemon"), required=True)
    p.add_argument("--clear-env", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempts", default="0")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--run", type=float)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "-1"))
    attempt = int(os.environ.get("LAUNCHER_ATTEMPT", "0"))
    escaped = a.ready_file + ".escaped"
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        _escapee(a.escape, (escaped, rank, attempt), a.clear_env, write_fd)
    os.close(write_fd)
    os.read(read_fd, 1)  # the escapee is out of our group and recorded
    earlier = sum(1 for r, att, pid in _lines(escaped) if int(att) < attempt and _alive(int(pid)))
    _append(a.ready_file, f"{rank} {attempt} {os.getpid()} {earlier}\n")
    if rank == a.fail_rank and str(attempt) in a.fail_attempts.split(","):
        peers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        while sum(1 for line in _lines(a.ready_file) if line[1] == str(attempt)) < peers:
            time.sleep(0.01)
        sys.exit(a.exit_code)
    if a.run is not None:
        time.sleep(a.run)
        return
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
