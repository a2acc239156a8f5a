"""``OutputWatch``: one ``rank_output`` per rank and attempt, dated by the log's first growth after
the spawn; what the log held before the spawn is not output; the timer stops once every rank talked."""

import os

from launcher.run.outputwatch import OutputWatch


class Group:
    def __init__(self):
        self.log_paths, self.timers = {}, []

    def call_later(self, delay, fn):
        self.timers.append(fn)
        return len(self.timers)

    def cancel(self, timer):
        self.timers[timer - 1] = None


class Host:
    def __init__(self):
        self.group, self.events = Group(), []

    def emit(self, event, **fields):
        self.events.append((event, fields))


def fire(group):
    """Run the pending timer (the loop would, after 0.2 s); False when none is pending."""
    pending = [i for i, fn in enumerate(group.timers) if fn is not None]
    if not pending:
        return False
    fn, group.timers[pending[-1]] = group.timers[pending[-1]], None
    fn()
    return True


def test_first_output_per_rank_and_attempt(tmp_path):
    host, watch = Host(), OutputWatch()
    watch.start(host)
    logs = {r: tmp_path / f"rank_{r}.log" for r in (0, 1)}
    logs[1].write_text("left over from before\n")
    host.group.log_paths = {r: str(p) for r, p in logs.items()}
    watch.on_event("attempt_start", {"attempt": 0, "ranks": [0, 1]})
    for rank in (0, 1):
        watch.on_event("rank_spawned", {"rank": rank})
    assert fire(host.group) and host.events == []  # nothing new yet: rank 1's old text does not count
    with open(logs[0], "a") as fh:
        fh.write("hello\n")
    os.utime(logs[0], (1000.0, 1000.0))
    assert fire(host.group)
    assert host.events == [("rank_output", {"attempt": 0, "rank": 0, "at": 1000.0})]
    with open(logs[0], "a") as fh:
        fh.write("more\n")
    with open(logs[1], "a") as fh:
        fh.write("late\n")
    assert fire(host.group)
    assert [f["rank"] for _, f in host.events] == [0, 1]  # rank 0 only once
    assert not fire(host.group)  # every rank talked: no more polling


def test_output_just_before_the_attempt_ends_counts(tmp_path):
    host, watch = Host(), OutputWatch()
    watch.start(host)
    log = tmp_path / "rank_0.log"
    host.group.log_paths = {0: str(log)}
    watch.on_event("attempt_start", {"attempt": 3, "ranks": [0]})
    watch.on_event("rank_spawned", {"rank": 0})
    log.write_text("Traceback ...\n")
    watch.on_event("attempt_end", {"attempt": 3, "failed": True})
    assert [(e, f["attempt"]) for e, f in host.events] == [("rank_output", 3)]
    watch.stop()
