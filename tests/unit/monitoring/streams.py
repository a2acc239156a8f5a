"""Seeded random event streams shaped like the launcher's ``events.jsonl``, for the golden and
property tests of the readers (goodput, status, the timelines).

A stream follows a run loosely (start, attempts with their spawns, beats, outputs, failures, hangs,
holds and restarts, an end or none) and, now and then, breaks the order a launcher writes: events out
of place, clocks going back, fields missing. Every reader must cope with both.
"""

import random
from typing import List

#: Every event kind a reader of events.jsonl looks at, and a few it must skip.
_NOISE = ("straggler", "standby_ready", "cluster_update", "sync_start", "gasp", "stop_group", "stacks_dumped",
          "restart", "cluster_hold", "cluster_hold_end", "device_wait", "device_wait_end", "step_first",
          "step_regained", "step_last", "heartbeat", "rank_output", "hang_detected", "rank_exited", "rank_spawned",
          "attempt_end", "restore_plan", "attempt_start")


#: Kinds whose rank is never left out or null here: ``launcher status`` failed on them (now fixed, see
#: test_status.py::test_events_without_a_rank), so the golden outputs recorded before the fix have none.
_RANKED = ("standby_ready", "straggler")


class _Stream:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.ts = round(1000.0 + rng.random() * 100, 3)
        self.events: List[dict] = []
        self.ranks = list(range(rng.randint(1, 4)))
        self.step = 0

    def tick(self, most: float = 5.0) -> float:
        back = self.rng.random() < 0.05  # a clock that goes back a little
        self.ts = round(self.ts + (-self.rng.random() if back else self.rng.random() * most), 3)
        return self.ts

    def add(self, event: str, **fields) -> None:
        self.events.append({"ts": self.tick(), "event": event, "run_id": "r", **fields})

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p

    def rank(self):
        return self.rng.choice(self.ranks + [None] if self.maybe(0.1) else self.ranks)

    def earlier(self, most: float = 3.0) -> float:
        return round(self.ts - self.rng.random() * most, 3)

    def beat(self, attempt: int) -> None:
        self.step += self.rng.randint(0, 7)
        kind = self.rng.choice(("heartbeat", "heartbeat", "step_first", "step_regained", "step_last"))
        fields = {"rank": self.rank(), "step": self.step}
        if self.maybe(0.5):
            fields["attempt"] = attempt
        if self.maybe(0.4):
            fields["at"] = self.earlier()
        self.add(kind, **fields)

    def hang(self, attempt: int) -> None:
        fields = {"attempt": attempt, "rank": self.rank(), "reason": "no heartbeat or output for 10.0 s"}
        for key in ("last_beat", "last_output"):
            if self.maybe(0.5):
                fields[key] = self.earlier(20.0)
        self.add("hang_detected", **fields)

    def exit(self, attempt: int, state: str) -> None:
        fields = {"attempt": attempt, "rank": self.rank(), "state": state, "exited_at": self.earlier(1.0)}
        if self.maybe(0.3):
            fields["signal"] = self.rng.choice(("SIGKILL", "SIGTERM"))
        else:
            fields["exit_code"] = self.rng.choice((0, 1, 3, 137, None))
        if self.maybe(0.1):
            del fields["exited_at"]
        self.add("rank_exited", **fields)

    def noise(self, attempt: int) -> None:
        """One event of any kind, with plausible fields, anywhere."""
        kind = self.rng.choice(_NOISE)
        fields = {"attempt": attempt, "rank": self.rank(), "step": self.step, "reason": "noise",
                  "ranks": self.ranks, "failed": self.maybe(0.5), "scope": self.rng.choice(("rank", "group")),
                  "after_rank": self.rank(), "restarts_left": self.rng.randint(0, 3), "at": self.earlier(),
                  "pid": 2 ** 22 + 50 + self.rng.randint(0, 9), "rss_bytes": self.rng.randint(0, 2 ** 31),
                  "state": self.rng.choice(("failed", "stopped", "succeeded"))}
        keep = self.rng.sample(sorted(fields), self.rng.randint(0, len(fields)))
        if kind in _RANKED:
            fields["rank"], keep = self.rng.choice(self.ranks), keep + ["rank"]
        self.add(kind, **{k: fields[k] for k in keep})

    def attempt(self, attempt: int) -> bool:
        """One attempt; False when the run ends with it."""
        if self.maybe(0.15):
            self.add("device_wait", devices=[0], holders=[{"pid": 7, "name": "python"}])
            if self.maybe(0.8):
                self.add("device_wait_end", waited=1.0)
        if self.maybe(0.2):
            self.add("cluster_hold", reason="FaultFlushing")
            if self.maybe(0.8):
                self.add("cluster_hold_end", waited_for=True)
        self.add("attempt_start", attempt=attempt, ranks=self.ranks)
        if self.maybe(0.4):
            self.add("restore_plan", attempt=attempt, kind="periodic", step=max(0, self.step - self.rng.randint(0, 20)),
                     reason="newest")
            self.step = self.events[-1]["step"]
        for rank in self.ranks:
            if self.maybe(0.95):
                self.add("rank_spawned", attempt=attempt, rank=rank, pid=2 ** 22 + 10 + rank)
        for _ in range(self.rng.randint(0, 12)):
            choice = self.rng.random()
            if choice < 0.45:
                self.beat(attempt)
            elif choice < 0.7:
                self.add("rank_output", attempt=attempt, rank=self.rank(), at=self.earlier(0.5))
            elif choice < 0.8:
                self.add("straggler", attempt=attempt, rank=self.rng.choice(self.ranks))
            elif choice < 0.9:
                self.add("standby_ready", rank=self.rng.choice(self.ranks), pid=2 ** 22 + 40, rss_bytes=self.rng.randint(0, 2 ** 30))
            else:
                self.noise(attempt)
        return self.end_attempt(attempt)

    def end_attempt(self, attempt: int) -> bool:
        how = self.rng.choice(("fail", "fail", "hang", "signal", "succeed", "live", "rank_restart"))
        if how == "live":
            return False
        if how == "hang":
            self.hang(attempt)
        elif how == "signal":
            self.add(self.rng.choice(("stop_group", "gasp")), attempt=attempt, reason="SIGTERM")
        if how in ("fail", "rank_restart"):
            self.exit(attempt, "failed")
        if how == "rank_restart":
            self.add("restart", attempt=attempt, scope="rank", after_rank=self.rank(),
                     restarts_left=self.rng.randint(0, 3))
            self.add("rank_spawned", attempt=attempt, rank=self.rank())
            return True
        if self.maybe(0.7):
            self.add("stop_group", attempt=attempt, reason="rank failed")
        for _ in range(self.rng.randint(0, len(self.ranks))):
            self.exit(attempt, "succeeded" if how == "succeed" else "stopped")
        self.add("attempt_end", attempt=attempt, failed=how != "succeed")
        if how == "succeed":
            return False
        if self.maybe(0.8):
            self.add("restart", attempt=attempt + 1, scope="group", restarts_left=self.rng.randint(0, 3))
        if self.maybe(0.3):
            self.add("cluster_update", newly_faulty_local=[self.rank()], hold="FaultFlushing")
        return True


def stream(seed: int) -> List[dict]:
    """The events of one run (sometimes after an older run's, in the same file), from ``seed``."""
    rng = random.Random(seed)
    s = _Stream(rng)
    if rng.random() < 0.1:  # an older run in the same file
        s.events.append({"ts": s.tick(), "event": "start", "run_id": "old"})
        s.events.append({"ts": s.tick(), "event": "attempt_start", "run_id": "old", "attempt": 0, "ranks": [0]})
    s.add("start", max_restarts=rng.randint(0, 3), server="node-a")
    for attempt in range(rng.randint(1, 4)):
        if not s.attempt(attempt):
            break
    if rng.random() < 0.6:
        s.add("job_end", reason="succeeded")
        if rng.random() < 0.5:
            s.add("stop", reason="succeeded")
    for _ in range(rng.randint(0, 3) if rng.random() < 0.25 else 0):  # events out of place
        i, j = rng.randrange(len(s.events)), rng.randrange(len(s.events))
        s.events[i], s.events[j] = s.events[j], s.events[i]
    return s.events
