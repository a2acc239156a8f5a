"""Reading ``events.jsonl`` for its readers (goodput, ``launcher status``, the timelines, ``launcher
report``): the usable events of a run, fast.

Through the one reader (``launcher.common.inputrecords.JsonLines``); an event whose fields the
readers convert or use as keys has them of the types in :data:`EVENT_FIELDS`, or it is skipped
(counted), never half-used. Light to import: ``launcher status`` reads through it on its click-free
path and must answer in under 100 ms.
"""

from typing import List, NamedTuple, Sequence

from launcher.common.inputrecords import INT, INTS, NUMBER, OR_NONE, TEXT, JsonLines, typed


def last_run(events: Sequence[dict]) -> List[dict]:
    """The events of the newest run in an events file (runs append to the same file)."""
    starts = [i for i, ev in enumerate(events) if ev.get("event") == "start"]
    if not starts:
        return list(events)
    first = starts[-1]
    run_id = events[first].get("run_id")
    return [ev for ev in events[first:] if ev.get("run_id") == run_id]


#: How ``EventLog`` writes a ``start`` event (``json.dumps``' default separators): a hint where the
#: newest run begins, checked after parsing.
_START = b'"event": "start"'
#: The fields of an event that its readers (goodput, status, the timeline) convert or use as keys,
#: with their types; an event with any of them of another type is skipped (counted), never half-used.
EVENT_FIELDS = {"event": TEXT, "ts": NUMBER, "attempt": INT + OR_NONE, "rank": INT + OR_NONE, "ranks": None,
                "exited_at": NUMBER + OR_NONE, "at": NUMBER + OR_NONE, "after_rank": INT + OR_NONE,
                "exit_code": INT + OR_NONE, "state": TEXT + OR_NONE, "restarts_left": INT + OR_NONE,
                "max_restarts": INT + OR_NONE, "rss_bytes": INT + OR_NONE, "pid": INT + OR_NONE,
                "generation": INT + OR_NONE}
#: Per kind of event, fields whose type differs from :data:`EVENT_FIELDS`.
_KIND_FIELDS = {"attempt_start": {"ranks": INTS, "attempt": INT}}


class EventsRead(NamedTuple):
    """The events read from an events file and how many lines were skipped (not a usable event)."""

    events: List[dict]
    skipped: int


def usable(event: dict) -> bool:
    """Whether ``event`` has an ``event`` name, a ``ts``, and the types of :data:`EVENT_FIELDS`."""
    kind = event.get("event")
    if type(kind) is not str or "ts" not in event:
        return False
    return typed(event, _CHECKS.get(kind, _CHECKS[None])) is None


#: Per kind of event (None: any other), the checks :func:`usable` makes.
_CHECKS = {kind: {k: v for k, v in {**EVENT_FIELDS, **fields}.items() if v is not None}
           for kind, fields in {None: {}, **_KIND_FIELDS}.items()}


def read_events(path: str, newest_run: bool = False) -> EventsRead:
    """The usable events of the events file ``path`` ([] without one), in file order.

    Read by the one reader (``launcher.common.inputrecords.JsonLines``: a FIFO, a device or a symlink
    is refused, a line over 1 MiB is skipped while it is read, numbers are bounded). With
    ``newest_run`` only the newest run's events are kept, read fast: ``launcher status`` must answer
    in under 100 ms, so only the lines from the newest ``start`` on are parsed, in one ``json.loads`` per
    block (a per-line ``json.loads`` cost more than everything else ``status`` does).

    Raises:
        InputFileError: the file is not a regular file (or a symlink).
        OSError: it cannot be read.
    """
    lines = JsonLines(path, "events file")
    events: List[dict] = []
    try:
        blocks = lines.blocks()
    except FileNotFoundError:
        return EventsRead([], 0)
    for block in blocks:
        hint = block.rfind(_START) if newest_run else -1
        if hint >= 0:
            newest = lines.parse(block[block.rfind(b"\n", 0, hint) + 1:])
            if newest and newest[0].get("event") == "start":
                events = newest  # what came before belongs to older runs
                continue
            block = block[:block.rfind(b"\n", 0, hint) + 1]  # the hint missed: parse the rest too
            events += lines.parse(block) + newest
            continue
        events += lines.parse(block)
    kept = [ev for ev in events if usable(ev)]
    return EventsRead(last_run(kept) if newest_run else kept, lines.skipped + len(events) - len(kept))


def read_last_run(path: str) -> List[dict]:
    """The newest run's usable events in the events file ``path`` (see :func:`read_events`)."""
    return read_events(path, newest_run=True).events
