"""Heartbeats from inside a rank, for ``launcher run --heartbeat-timeout``: nearly free for the loop.

Standard library only, and never ``import launcher`` (the ranks may run a Python without the launcher
installed). The launcher puts this file's directory at the end of the ranks' ``PYTHONPATH`` and names
a per-rank slot file in ``LAUNCHER_HEARTBEAT_FILE``; without that variable every call does nothing,
so a script may call it unconditionally::

    import launcher_heartbeat as hb

    for step, batch in enumerate(loader):
        train_step(batch)
        hb.heartbeat(step=step)
        if step % 1000 == 0:
            with hb.section("checkpoint"):
                save(model)

A beat is one ``struct.pack_into`` into a 64-byte ``mmap``'d page shared with the launcher: no
syscall, no lock, no connection. The launcher reads the slots on a timer. On import the module also
registers ``faulthandler`` on ``SIGUSR1`` (writing next to the slot) and marks that in the slot, so
the launcher may ask this rank for its Python stacks when py-spy is not available.

Slot layout (little-endian, 64 bytes; ``launcher.monitoring.heartbeats`` reads it): ``flags`` (u32,
bit 0: faulthandler on SIGUSR1, bit 1: the interpreter is exiting), ``pid`` (u32), last beat (f64, ``time.monotonic()``), step (i64,
-1 unknown), section start (f64, 0 outside a section), section name (32 bytes, NUL-padded).
"""

import atexit
import faulthandler
import mmap
import os
import signal
import struct
import time
from contextlib import contextmanager

ENV_VAR = "LAUNCHER_HEARTBEAT_FILE"
SLOT_FORMAT = "<IIdqd32s"
SLOT_SIZE = struct.calcsize(SLOT_FORMAT)
FLAG_FAULTHANDLER = 1
FLAG_EXITING = 2
#: Where faulthandler writes the stacks on SIGUSR1: the slot's path plus this suffix.
STACKS_SUFFIX = ".stacks"

_BEAT = struct.Struct("<dq")          # last beat, step: at offset 8
_SECTION = struct.Struct("<d32s")     # section start, name: at offset 24
_slot = None
_step = -1
_stacks_file = None


def _open(path):
    """Map the slot (created if the launcher did not); None when it cannot be, so beats stay no-ops."""
    global _stacks_file
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < SLOT_SIZE:
                os.ftruncate(fd, SLOT_SIZE)
            slot = mmap.mmap(fd, SLOT_SIZE)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    flags = 0
    if hasattr(signal, "SIGUSR1"):
        try:
            _stacks_file = open(path + STACKS_SUFFIX, "a")  # append: the launcher truncates it
            faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True)
            flags |= FLAG_FAULTHANDLER
        except (OSError, RuntimeError, ValueError):  # not the main thread, a read-only dir: no fallback
            pass
    atexit.register(_exiting, slot, flags)
    # No beat yet (0.0): importing this module is not progress, the --heartbeat-initial-timeout holds.
    struct.pack_into(SLOT_FORMAT, slot, 0, flags, os.getpid(), 0.0, -1, 0.0, b"")
    return slot


def _exiting(slot, flags):
    """At interpreter exit: the rank is done, its teardown (a framework's, which may take long) is
    not a hang."""
    struct.pack_into("<I", slot, 0, flags | FLAG_EXITING)


def heartbeat(step=None):
    """Say this rank made progress (``step``: the training step, if known). Costs about a microsecond."""
    global _step
    if _slot is None:
        return
    if step is not None:
        _step = step
    _BEAT.pack_into(_slot, 8, time.monotonic(), _step)


@contextmanager
def section(name):
    """A named stretch (``checkpoint``, ``eval``) judged by ``--section-timeout NAME=SECONDS`` instead
    of the steady heartbeat timeout; a beat on entry and on exit."""
    if _slot is None:
        yield
        return
    now = time.monotonic()
    _SECTION.pack_into(_slot, 24, now, name.encode("utf-8")[:32])
    _BEAT.pack_into(_slot, 8, now, _step)
    try:
        yield
    finally:
        _SECTION.pack_into(_slot, 24, 0.0, b"")
        heartbeat()


_path = os.environ.get(ENV_VAR)
if _path:
    _slot = _open(_path)
