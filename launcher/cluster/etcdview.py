"""One record that every node reads instead of every other node's records: the leader's *view*.

With a record per node per generation that every node follows, one restart of N nodes costs etcd
N x N watch events (every ``stopped.<i>`` to every node), and the join N x N as well. Instead one
node, the **leader** (whoever holds ``view.leader``, a key on its lease: created if absent at join,
taken over by the first follower to see it gone), follows every key of the incarnation and
publishes ``view``; the others follow only ``view`` and ``view.leader`` (one watch on the range
``[view, view/)``). The view holds:

- ``joined``, ``lost``: the servers that joined the incarnation, and those lost (joined, lease gone,
  not done), as bitmaps (hex: 250 characters for 1,000 servers);
- ``gens``: per generation, ``records`` (every ``failed.<i>.json``, ``abort``, ``next.json``,
  ``start.json``, ``master.json``, as etcd holds them) and, for the two newest, ``stopped``/``done``
  as bitmaps.

A new failure record, an abort, a proposal, a lost server, or a set that became complete (every
server joined; every joined server not lost stopped or finished a generation) is published at
once; other progress of the sets at most every ``VIEW_INTERVAL`` seconds. Each node's records stay
where they were (``gen_<g>/stopped.<i>`` ...): the leader reads them, and a new leader finds them.
Records and marks are only ever added, so a reader takes the union of what it read itself and
what the view says.
"""

import itertools
import json
import logging
import time
from typing import Dict, FrozenSet, Iterable, Mapping, Optional, Set, Tuple

from launcher.cluster.etcdclient import EtcdError
from launcher.cluster.etcdjoin import parse
from launcher.cluster.syncdir import DONE, STOPPED, usable
from launcher.common.inputfiles import loads_json

log = logging.getLogger(__name__)

#: The largest view read: one failure record of every node of a 10,000-node job fits.
LIMIT_VIEW = 64 * 1024 * 1024

VIEW, LEADER = "view", "view.leader"
#: Seconds between two publications of the view that only show progress (nothing to act on).
VIEW_INTERVAL = 0.5
#: Seconds per server between two publications whose only news is a barrier's progress (more
#: ``stopped`` or ``done`` marks, which nobody acts on before the barrier is complete): each goes to
#: every follower, so at 1,000 servers one every 2 s (not 4-5 fan-outs of the view per restart, which
#: competed with the failure's own view for etcd's and the nodes' CPU); never less than VIEW_INTERVAL.
MARKS_INTERVAL_PER_SERVER = 0.002
#: Generations whose stopped/done sets the view carries (the running one and the one before).
MARKED_GENERATIONS = 2
_RECORDS = ("failed.", "abort", "next.json", "start.json", "master.json")
CUE = ("", b"", False)  # in a store's write queue: publish the view (if the leader and it changed)


def bits(servers: Iterable[int]) -> str:
    """A set of server indices as a hex bitmap."""
    value = 0
    for index in servers:
        value |= 1 << index
    return format(value, "x")


#: The most servers a bitmap may name (hex digits: 4 servers each); a longer one is not a launcher's.
MAX_SERVERS = 1 << 20


_BIT_BYTES = bytes.maketrans(b"01", b"\0\1")


def unbits(text: object) -> FrozenSet[int]:
    """The set of a hex bitmap (empty for anything else, a bitmap of more than MAX_SERVERS too)."""
    text = str(text)
    if len(text) > MAX_SERVERS // 4:
        return frozenset()
    try:
        value = int(text, 16)
    except ValueError:
        return frozenset()
    if value <= 0:
        return frozenset()
    # bit i as byte i (1 or 0), picked in C: half the time of a loop over the digits (a follower
    # reads the 1,000-bit sets of a generation on every view)
    return frozenset(itertools.compress(itertools.count(), bin(value)[:1:-1].encode().translate(_BIT_BYTES)))


def view_range(prefix: str) -> Tuple[str, str]:
    """The key range a follower watches: ``view`` and ``view.leader`` (``.`` sorts before ``/``)."""
    return prefix + VIEW, prefix + VIEW + "/"


def compose(prefix: str, count: int, snapshot: Mapping[str, bytes], parse) -> dict:
    """The view of ``snapshot`` (every key of the incarnation), for ``count`` servers.

    ``lost`` is every server that joined and whose ``member.<i>`` is gone: a reader leaves out those
    that finished the generation it reads, as the leader does. ``parse(bytes, key) -> dict or None``
    reads a record as the store does (bounded, checked, warned once).
    """
    present: Dict[str, Set[int]] = {"join": set(), "member": set()}
    gens: Dict[int, dict] = {}
    for key, value in snapshot.items():
        name = key[len(prefix):]
        kind, _, index = name.partition(".")
        if kind in present:
            if index.isdigit():
                present[kind].add(int(index))
            continue
        if not name.startswith("gen_") or "/" not in name:
            continue
        number, record = name[4:].split("/", 1)
        if not number.lstrip("-").isdigit():  # generation -1: before generation 0 (a master that moved)
            continue
        gen = gens.setdefault(int(number), {"records": {}, STOPPED: set(), DONE: set()})
        kind, _, index = record.partition(".")
        if kind in (STOPPED, DONE) and index.isdigit():
            gen[kind].add(int(index))
        elif record.startswith(_RECORDS):
            parsed = parse(value, key)
            if parsed is not None:
                gen["records"][record] = parsed
    newest = sorted(gens)[-MARKED_GENERATIONS:]
    joined = present["join"]
    return {"joined": bits(joined), "lost": bits(joined - present["member"]), "count": count,
            "gens": {str(g): {"records": gen["records"],
                              **({STOPPED: bits(gen[STOPPED]), DONE: bits(gen[DONE])} if g in newest else {})}
                     for g, gen in gens.items()}}


def complete(view: Mapping) -> Set[str]:
    """What the view shows complete: ``joined`` (every server), and each generation whose every
    joined server that is not lost stopped or finished it."""
    joined, lost = unbits(view.get("joined")), unbits(view.get("lost"))
    found = {"joined"} if len(joined) >= int(view.get("count", 0)) else set()
    for number, gen in view.get("gens", {}).items():
        if STOPPED in gen and joined - lost <= unbits(gen[STOPPED]) | unbits(gen.get(DONE)):
            found.add(number)
    return found


def urgent(view: Mapping, published: Optional[Mapping]) -> bool:
    """Whether ``view`` must go out now: something a node acts on changed since ``published``."""
    if published is None:
        return True
    records = lambda v: {n: g.get("records") for n, g in v.get("gens", {}).items()}  # noqa: E731
    return (view.get("lost") != published.get("lost") or records(view) != records(published)
            or complete(view) != complete(published))


def progress_interval(view: Mapping, published: Mapping, count: int) -> float:
    """Seconds between two publications of progress only: ``VIEW_INTERVAL`` while servers join (an
    elastic start counts them), longer when only a barrier's marks moved on (``MARKS_INTERVAL_PER_SERVER``)."""
    if view.get("joined") != published.get("joined"):
        return VIEW_INTERVAL
    return max(VIEW_INTERVAL, count * MARKS_INTERVAL_PER_SERVER)


def encode(view: Mapping) -> bytes:
    return json.dumps(view, separators=(",", ":")).encode()


def decode(raw: Optional[bytes]) -> dict:
    """A published view, or an empty one (absent or unreadable)."""
    try:
        view = loads_json(raw, "etcd", "coordination view at") if raw is not None and len(raw) <= LIMIT_VIEW else {}
    except ValueError:  # InputFileError too: not JSON, too deep, numbers out of range
        return {}
    return view if isinstance(view, dict) and isinstance(view.get("gens", {}), dict) else {}


def generation(view: Mapping, number: int) -> Tuple[Dict[str, dict], FrozenSet[int], FrozenSet[int]]:
    """Generation ``number`` in ``view``: its records by name, its stopped and done servers."""
    gen = view.get("gens", {}).get(str(number))
    if not isinstance(gen, dict):
        return {}, frozenset(), frozenset()
    records = gen.get("records")
    return (records if isinstance(records, dict) else {}), unbits(gen.get(STOPPED, "0")), unbits(gen.get(DONE, "0"))


def viewed(record: object, key: str, name: str) -> Optional[dict]:
    """A record the view carries for ``key`` (None: absent or unusable, warned once)."""
    return usable(record, f"{key} (in the view)", name) if record is not None else None


class Leading:
    """How :class:`~launcher.cluster.etcdstore.EtcdStore` becomes the leader and publishes the view
    (a mixin: the store's attributes; its writer thread publishes on ``CUE``)."""

    _published: Optional[dict] = None  # what this server last published as the leader
    _published_at = 0.0
    _view_due: Optional[float] = None  # a publication of progress waits until then

    def _campaign(self) -> None:
        """Become the leader if nobody is (``view.leader`` on this server's lease, if absent)."""
        if self.leading or self.expelled:
            return
        try:
            won = self.client.create(self.prefix + LEADER, self._record({}), self.lease)
        except EtcdError as exc:
            self._reachable(str(exc))
            return
        if won:
            log.info("etcd: this server leads the coordination (it publishes the view the others follow)")
            self.leading, self._published = True, None
            self._snapshot = self.client.range(self.prefix)[1]  # every key before the first view

    def _view_cue(self) -> None:
        """Ask the writer thread to publish the view (once for any number of changes before it does)."""
        if self._view_due != 0.0:
            self._view_due = 0.0
            self._writes.put(CUE)

    def _publish_view(self) -> None:
        """Publish the view if it changed: at once when a node would act on the change, else at most
        every :func:`progress_interval` seconds."""
        self._view_due = None
        if not self.leading or self.expelled:
            return
        view = compose(self.prefix, self.count, self._snapshot, parse)  # parse(raw, key)
        if view == self._published:
            return
        wait = 0.0 if urgent(view, self._published) else \
            self._published_at + progress_interval(view, self._published, self.count) - time.monotonic()
        if wait > 0:
            self._view_due = time.monotonic() + wait
            return
        self.client.put(self.prefix + VIEW, encode(view))
        self._published, self._published_at = view, time.monotonic()
