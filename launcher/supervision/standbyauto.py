"""``--preload auto``'s half of :class:`launcher.supervision.standby.StandbyPool`: read what the
ranks import, decide when the first standbys may start (the start rule: rent or buy, or at once as
SCHED_IDLE), send them the new names within the memory left, and leave out a module that must not be
preloaded. A base class of the pool, on the pool's state; it runs in the launcher's event loop.
"""

import importlib.util
import json
import logging
import os
import time
from typing import Any, Sequence

from launcher.jobspec.preload import learned_modules
from launcher.supervision.standbylearn import memory_room, rss

log = logging.getLogger("launcher.supervision.standby")

BOOTSTRAP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rankhooks",
                         "launcher_standby.py")
#: Seconds after a restart before the replacements start importing: their imports take CPU the
#: restarted ranks need to resume (measured on 2 loaded cores: 4 standbys importing torch next to 4
#: resuming ranks made the resume take seconds longer), so they wait until the ranks are back to work.
REPLACE_DELAY = 3.0
#: ``--preload auto``: seconds between reads of what the ranks imported. New names go to the standbys
#: once a read finds none (the ranks' imports paused); the first ones after two such reads, so that
#: the standbys' imports do not slow down the ranks' own start.
LEARN_POLL = 1.0
#: ``--preload auto``: the first standbys start once the job has run this many times its start-up (until
#: the ranks' latest import; ``launcher_imports`` writes signs of life): a standby's imports cost about
#: what a rank's start-up did, so a job that ends sooner never pays for standbys it could not use, and one that runs on pays at
#: most what it already ran (rent or buy). Measured: a job that ends while its standbys import loses a
#: rank to torch's exit race far more often (docs/fidelity.md, "A rank lost at the very end").
WARM_AFTER = 2.0
#: ``--preload auto``: modules refused (threads, devices) before auto gives up for the run.
MAX_EXCLUDED = 5


class AutoLearning:
    """The pool's ``--preload auto`` decisions (its attributes are the pool's: see ``StandbyPool``)."""

    def _poll(self) -> None:
        """Read what the ranks imported; once their imports pause, the standbys import the new names."""
        if self.refused is not None:
            return
        new = learned_modules(self.learn.read_new(), (*self.modules, *self._pending), self._excluded)
        now = time.monotonic()
        self._pending.extend(new)
        active = bool(new) or self.learn.grew  # names, or signs of life: the ranks are still importing
        self._quiet = 0 if active else self._quiet + 1
        self._last_new = now if active else self._last_new
        if self._pending and self._quiet >= (1 if self.modules else 2) and self._warm_enough(now):
            more, self._pending = self._pending, []
            self.modules += tuple(more)
            for standby in list(self._standbys.values()):
                self._send_modules(standby, more)
            self._prepare_within_memory()
        elif self._short_of_memory:  # memory may have been freed since
            self._prepare_within_memory()
        self._loop.call_later(LEARN_POLL, self._poll)

    def _warm_enough(self, now: float) -> bool:
        """Whether the job has run long enough for its first standbys (:data:`WARM_AFTER`); once it
        has, always. The start-up runs until the ranks' latest import so far: a lazy import (the
        optimizer's ``torch._dynamo`` on the first step) moves it on."""
        if self.modules:
            return True
        self.startup = round(self._last_new - self._began, 3)
        if now - self._began < WARM_AFTER * self.startup and not self._idle_class():
            return False
        self.emit("standby_timing", startup_seconds=self.startup, started_after_seconds=round(now - self._began, 3),
                  idle_class=self._idle_class())
        return True

    def _idle_class(self) -> bool:
        """Whether the standbys will import as SCHED_IDLE (the standby's own rule, which holds for the
        launcher too: they share its credentials and limits): then they take only CPU time the ranks
        leave, and need not wait for :data:`WARM_AFTER`."""
        if self._idle is None:
            spec = importlib.util.spec_from_file_location("launcher_standby", BOOTSTRAP)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # standard library only, no side effect at import
            self._idle = bool(module.may_leave_idle())
        return self._idle

    def _send_modules(self, standby: Any, names: Sequence[str]) -> None:
        try:
            standby.sock.send(json.dumps({"modules": list(names), "auto": True}).encode())
        except OSError:
            self._discard(standby)
            return
        standby.loading += 1
        standby.ready = False

    def _prepare_within_memory(self) -> None:
        """Standbys for the ranks lacking one, if all of them fit in the memory left (auto only)."""
        missing = [spec for rank, spec in sorted(self._specs.items()) if rank not in self._standbys]
        if not self.modules or not missing or self.refused is not None:
            return
        room, where = memory_room()
        each = self._estimate()
        if room is not None and len(missing) * each > room:
            if not self._short_of_memory:
                log.info("no warm standbys for now: %d x ~%d MiB needed, %d MiB free for them (%s)",
                         len(missing), each >> 20, max(room, 0) >> 20, where)
                self.emit("standby_skipped", ranks=[spec.rank for spec in missing], need_bytes=len(missing) * each,
                          room_bytes=room, where=where)
            self._short_of_memory = True
            return
        self._short_of_memory = False
        self.prepare(missing)

    def _estimate(self) -> int:
        """Bytes one standby will hold: a standby's measured size, else the smallest rank's (a standby
        imports at most what the rank imported), at most --preload-max-rss."""
        sizes = [sb.rss for sb in self._standbys.values() if sb.rss] or [
            size for size in map(rss, self._loop.pids().values()) if size]
        each = min(sizes) if sizes else 0
        return min(each, self.max_rss) if self.max_rss else each

    def _exclude(self, standby: Any, module: str, reason: str) -> None:
        """Auto: a module that must not be preloaded is left out; the others are tried again."""
        self._excluded.append(module)
        self.modules = tuple(learned_modules(self.modules, (), self._excluded))
        if len(self._excluded) > MAX_EXCLUDED:
            self._refuse(standby.rank, f"{reason}; {len(self._excluded)} modules refused")
            return
        log.warning("warm standbys leave out %s: %s", module, reason)
        self.emit("standby_refused", rank=standby.rank, reason=reason, module=module)
        for other in list(self._standbys.values()):
            self._discard(other)
        self._loop.call_later(REPLACE_DELAY, self._prepare_within_memory)
