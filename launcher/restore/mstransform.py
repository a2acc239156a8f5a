"""Convert MindSpore checkpoints written by one world (and sharding strategy) for another, once, before
the ranks start, and cache the result.

MindSpore reshards with ``transform_checkpoint_by_rank(rank, {src rank: file}, out, src_strategy,
dst_strategy)`` (the sources a target rank needs come from ``rank_list_for_transform``). The launcher
never imports MindSpore: the conversion runs in a subprocess of the job's interpreter, which has it.

The result is cached under ``<checkpoint dir>/converted/<key>/rank_<r>/<name>``, where ``key`` digests
the source files (path, size, mtime), both strategy files' bytes and the target world size: the
same conversion is never run twice, and a changed input is a new key. It is written atomically: into
``converted/.<key>.tmp-<host>-<pid>``, every file fsynced, then the directory renamed to ``<key>``. A
directory with the final name is complete; a crash mid-conversion leaves only a temporary directory,
which is never loaded (the next conversion of the same key on that host removes it once its pid is
gone).
On several nodes each launcher may convert the same key at once: the first rename wins and the
others discard their copy.
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence, Tuple

import psutil

from launcher.common import signals
from launcher.common.errors import LauncherError
from launcher.common.inputfiles import open_regular
from launcher.supervision import guard

logger = logging.getLogger(__name__)

CONVERTED_DIR = "converted"
_TMP = ".tmp-"
_CHUNK = 1 << 20
_POLL_SECONDS = 0.2  # how soon a stop signal interrupts a conversion

#: Run by the job's interpreter; reads the job as JSON on stdin. Standard library and MindSpore only.
TRANSFORM_SCRIPT = r"""
import json, os, sys
import mindspore as ms
job = json.load(sys.stdin)
for rank in job["ranks"]:
    needed = ms.rank_list_for_transform(rank, job["src_strategy"], job["dst_strategy"])
    files = {int(src): job["sources"][str(int(src))] for src in needed}
    out = os.path.join(job["tmp"], "rank_%d" % rank, job["name"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    ms.transform_checkpoint_by_rank(rank, files, out, job["src_strategy"], job["dst_strategy"])
    print("converted rank %d from %s" % (rank, sorted(files)), flush=True)
"""


@dataclass(frozen=True)
class TransformJob:
    """One conversion of a step to a new world.

    Attributes:
        sources: ``(source rank, checkpoint file)`` for every rank that wrote the step.
        src_strategy: the strategy file the step was written with.
        dst_strategy: the strategy file of the world that resumes.
        target_world_size: ranks that resume.
        name: the converted files' name (the source files' name, so the step stays in it).
        output: the cache entry, ``<checkpoint dir>/converted/<key>``.
    """

    sources: Tuple[Tuple[int, str], ...]
    src_strategy: str
    dst_strategy: str
    target_world_size: int
    name: str
    output: str

    def to_json(self) -> dict:
        """The plan record's ``transform`` object."""
        return {"sources": {str(rank): path for rank, path in self.sources}, "src_strategy": self.src_strategy,
                "dst_strategy": self.dst_strategy, "name": self.name, "output": self.output}

    def file_for(self, rank: int) -> str:
        """The converted checkpoint rank ``rank`` loads."""
        return os.path.join(self.output, f"rank_{rank}", self.name)


def job_interpreter(command: Sequence[str]) -> str:
    """The interpreter of the job's command (``python train.py`` -> ``python``, resolved on PATH), or
    the launcher's own for a command that is not a Python interpreter (``train.py``, a wrapper)."""
    first = command[0] if command else ""
    if re.fullmatch(r"python[\d.]*", os.path.basename(first)):
        return shutil.which(first) or first
    return sys.executable


def plan_job(checkpoint_dir: str, sources: Sequence[Tuple[int, str]], src_strategy: str, dst_strategy: str,
             target_world_size: int) -> TransformJob:
    """The job and its cache entry. Reads the strategy files and stats the sources (for the key).

    Raises:
        OSError: a strategy file or a source cannot be read.
    """
    digest = hashlib.sha256(f"world={target_world_size}\n".encode())
    for rank, path in sorted(sources):
        st = os.stat(path)
        digest.update(f"{rank} {path} {st.st_size} {st.st_mtime_ns}\n".encode())
    for path in (src_strategy, dst_strategy):
        digest.update(_file_digest(path).encode() + b"\n")
    output = os.path.join(checkpoint_dir, CONVERTED_DIR, digest.hexdigest()[:20])
    name = os.path.basename(sorted(sources)[0][1])
    return TransformJob(tuple(sorted(sources)), src_strategy, dst_strategy, target_world_size, name, output)


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with os.fdopen(open_regular(path, "checkpoint file"), "rb") as stream:  # a FIFO would block open()
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_cached(job: TransformJob) -> bool:
    """Whether the complete result is there (only a renamed directory counts)."""
    return all(os.path.isfile(job.file_for(rank)) for rank in range(job.target_world_size))


def convert(job: TransformJob, python: str, timeout: float = 3600.0) -> bool:
    """Run the conversion unless cached; True when it ran.

    Args:
        job: what to convert.
        python: the job's interpreter (it imports MindSpore; the launcher does not).
        timeout: seconds before the conversion is killed and reported as failed.

    Raises:
        LauncherError: the interpreter failed, timed out, or wrote no file for some rank.
    """
    if is_cached(job):
        logger.info("checkpoint conversion cached: %s", job.output)
        return False
    parent = os.path.dirname(job.output)
    os.makedirs(parent, exist_ok=True)
    _remove_dead_leftovers(parent, os.path.basename(job.output))
    tmp = os.path.join(parent, f".{os.path.basename(job.output)}{_TMP}{socket.gethostname()}-{os.getpid()}")
    os.makedirs(tmp)
    spec = {"ranks": list(range(job.target_world_size)), "src_strategy": job.src_strategy,
            "dst_strategy": job.dst_strategy, "name": job.name, "tmp": tmp,
            "sources": {str(rank): path for rank, path in job.sources}}
    try:
        _run(python, spec, timeout)
        missing = [r for r in range(job.target_world_size)
                   if not os.path.isfile(os.path.join(tmp, f"rank_{r}", job.name))]
        if missing:
            raise LauncherError(f"checkpoint conversion wrote no file for ranks {missing}")
        _fsync_tree(tmp)
        _publish(tmp, job.output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _remove_dead_leftovers(parent: str, key: str) -> None:
    """Remove temporary directories of ``key`` that a crashed conversion on this host left behind
    (their pid is gone); other hosts' and live ones are left alone."""
    prefix = f".{key}{_TMP}{socket.gethostname()}-"
    for name in os.listdir(parent):
        pid = name[len(prefix):]
        if name.startswith(prefix) and pid.isdigit() and not psutil.pid_exists(int(pid)):
            logger.info("removing %s, left by an interrupted conversion", name)
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _run(python: str, spec: dict, timeout: float) -> None:
    logger.info("converting checkpoints for %d ranks with %s", len(spec["ranks"]), python)
    try:
        # Its own session so it is killed as a group; the parent-death signal so a SIGKILLed
        # launcher does not leave a conversion writing into the checkpoint dir.
        proc = subprocess.Popen([python, "-c", TRANSFORM_SCRIPT], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=guard.child_setup)
    except OSError as exc:
        raise LauncherError(f"checkpoint conversion: cannot run {python}: {exc.strerror or exc}") from exc
    stderr = _communicate(proc, json.dumps(spec), timeout)
    if proc.returncode != 0:
        lines = stderr.strip().splitlines() or ["(no output)"]
        # MindSpore ends a C++ error with its source location; the cause is the last "...Error: " line.
        cause = next((line for line in reversed(lines) if "Error: " in line), lines[-1])
        raise LauncherError(f"checkpoint conversion failed (exit {proc.returncode}): {cause.strip()}")


def _communicate(proc: subprocess.Popen, spec: str, timeout: float) -> str:
    """Wait for the conversion, its stderr back; a stop signal or the deadline kills its group.

    A conversion can take minutes: the kubelet's SIGTERM must stop the launcher now, not after it.
    """
    deadline = time.monotonic() + timeout
    data: "str | None" = spec
    while True:
        try:
            _, stderr = proc.communicate(data, timeout=_POLL_SECONDS)
            return stderr
        except subprocess.TimeoutExpired:
            data = None  # sent once; retrying communicate() loses no output
        if signals.has_pending() or time.monotonic() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if signals.has_pending():
                raise LauncherError("checkpoint conversion interrupted by a stop signal")
            raise LauncherError(f"checkpoint conversion did not finish within {timeout:.0f} s")


def _fsync_tree(root: str) -> None:
    """Every file and directory under ``root`` on disk before the rename makes it visible."""
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(directory)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: str, output: str) -> None:
    """Rename ``tmp`` to ``output``; another launcher that got there first wins."""
    try:
        os.rename(tmp, output)
    except OSError:
        if not os.path.isdir(output):
            raise
        logger.info("checkpoint conversion %s was published by another launcher first", output)
        return
    _fsync_dir(os.path.dirname(output))
