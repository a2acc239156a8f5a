"""The shared directory of coordinated restarts (``--sync-dir``): its files, written and read.

Restart generations (docs/multinode.md): generation ``g`` is the attempt number, the same on every
node. Files, under ``DIR/<run-id>/inc_<k>/`` (an incarnation is one start of the whole job; a job
started again with the same run id, as a Volcano job restart does, gets the next one)::

    join.<i>                  server i joined this incarnation
    closed                    a launcher of this incarnation ended: a new start does not join it
    gen_<g>/failed.<i>.json   server i's ranks that failed on their own in generation g, with exit info
    gen_<g>/stopped.<i>       every process of generation g on server i is gone; it will restart
    gen_<g>/done.<i>          every rank of server i exited 0 in generation g; it starts nothing more
    gen_<g>/abort             the job ends in generation g (first writer wins): exit code and reason
    gen_<g>/next.json         elastic (etcd): the servers of generation g+1 (first writer wins)
    gen_0/start.json          elastic (etcd): the servers generation 0 starts on (first writer wins)

Every file is written whole (temp file, then rename, or link for the exclusive ones), so a reader sees
all of it or nothing, and a node only ever creates its own files. Other nodes' records are input like
any file: read by the one reader (:func:`launcher.common.inputfiles.read_record`: bounded, no symlink
followed, numbers in range) and checked by :func:`valid`; one that fails either is left out with one
warning, and the job goes on. Other nodes' files are found by
listing the generation directory every ``interval`` seconds from the event loop: inotify does not
see other NFS clients' writes.
"""

import json
import logging
import os
import re
import socket
import time
from dataclasses import field
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple, Union

from launcher.common.errors import LauncherError
from launcher.common.inputfiles import InputFileError, loads_record, read_record
from launcher.common.inputrecords import INT, INTS, NUMBER, OR_NONE, TEXT, typed
from launcher.common.records import record
from launcher.common.warnonce import WarnOnce
from launcher.supervision.policy import Failure
from launcher.supervision.states import ExitInfo

log = logging.getLogger(__name__)

CLOSED, ABORT, STOPPED, DONE = "closed", "abort", "stopped", "done"
NEXT, START, MASTER = "next", "start", "master"
_MARKER = re.compile(r"(failed)\.(\d+)\.json|(stopped|done)\.(\d+)|(abort)|(next|start|master)\.json")
#: What a launcher that joins a running job writes as ``failed.<i>.json``: rank -1, a note, not a failure.
JOIN_NOTE = {"rank": -1, "ranks": [], "note": "joining", "returncode": 1}
_INCARNATION = re.compile(r"inc_(\d+)")


@record(frozen=True)
class Generation:
    """What the files of one generation say.

    Attributes:
        number: The generation (attempt number).
        failed: Server index -> its ``failed.<i>.json`` record.
        stopped: Servers whose processes of this generation are all gone, restarting.
        done: Servers whose ranks all exited 0.
        abort: The ``abort`` record, if the job ends.
        lost: Servers that joined and are gone without a word (their lease expired: coordinators
            with membership only, ``launcher.cluster.etcdstore``).
        next: The ``next.json`` record: the servers of generation ``number + 1`` when they differ
            from this one's (elastic membership; the first writer wins).
        start: Generation 0 only, the ``start.json`` record: the servers it starts on when fewer than
            all had joined (elastic, ``launcher.cluster.syncstart``; the first writer wins).
        master: The ``master.json`` record: where the master of generation ``number + 1`` listens
            when it moved with rank 0 to another server (``addr``, ``port``, ``reason``), written by
            that server's launcher.
    """

    number: int
    failed: Dict[int, dict] = field(default_factory=dict)
    stopped: FrozenSet[int] = frozenset()
    done: FrozenSet[int] = frozenset()
    abort: Optional[dict] = None
    lost: FrozenSet[int] = frozenset()
    next: Optional[dict] = None
    start: Optional[dict] = None
    master: Optional[dict] = None

    def failed_ranks(self) -> Tuple[int, ...]:
        """The union of every node's failed ranks: the restore plan's fault ranks."""
        return tuple(sorted({int(r) for record in self.failed.values() for r in record.get("ranks", ())}))

    def missing(self, servers: Union[int, Iterable[int]]) -> List[int]:
        """Servers (a count, or the indices of the generation's members) that have neither stopped
        nor finished this generation."""
        members = range(servers) if isinstance(servers, int) else servers
        gone = self.stopped | self.done
        return [i for i in members if i not in gone]

    def failures(self, exclude: Optional[int] = None) -> List[Failure]:
        """Each node's first failure, earliest first (by the failing node's clock)."""
        found = [(failure.info.wall_time, i, failure) for i, failure in
                 ((i, failure_of(self.number, r)) for i, r in self.failed.items() if i != exclude)]
        return [f for _, _, f in sorted(found, key=lambda item: item[:2])]

    def exit_code(self) -> int:
        """The job's exit code: the earliest failing rank's, else the abort's, else 1."""
        failures = self.failures()
        if failures:
            return failures[0].info.exit_code
        return int((self.abort or {}).get("exit_code") or 1)


def failure_of(generation: int, record: dict) -> Failure:
    """A failure record of a node (``failed.<i>.json`` or ``abort``) as the supervisor's ``Failure``."""
    rank = int(record.get("rank", -1))
    label = f"rank {rank} on {record.get('name', 'server ?')}" if rank >= 0 \
        else " ".join(str(part) for part in (record.get("name"), record.get("note")) if part)
    return Failure(generation, rank, label, ExitInfo(int(record.get("returncode", 1)),
                                                     float(record.get("exited_at", record.get("ts", 0.0)))))


def collect(number: int, names: Iterable[str], load: Callable[[str], Optional[dict]]) -> Generation:
    """What the records ``names`` of generation ``number`` say; ``load(name)`` reads one (None: skip it)."""
    failed: Dict[int, dict] = {}
    marks: Dict[str, Set[int]] = {STOPPED: set(), DONE: set()}
    records: Dict[str, Optional[dict]] = {ABORT: None, NEXT: None, START: None, MASTER: None}
    for name in names:
        match = _MARKER.fullmatch(name)
        if match is None:
            continue
        if match.group(3):
            marks[match.group(3)].add(int(match.group(4)))
            continue
        record = load(name)
        if record is not None and match.group(1):
            failed[int(match.group(2))] = record
        elif record is not None:
            records[match.group(5) or match.group(6)] = record
    return Generation(number, failed, frozenset(marks[STOPPED]), frozenset(marks[DONE]), records[ABORT],
                      next=records[NEXT], start=records[START], master=records[MASTER])


def stamp(index: int, name: str, data: dict) -> dict:
    """A record as server ``index`` (called ``name``) writes it: who, where, when, then ``data``."""
    return {"server": index, "name": name, "host": socket.gethostname(), "pid": os.getpid(), "ts": time.time(),
            **data}


#: What a launcher writes in every record (:func:`stamp`), and per kind of record the fields its
#: readers use, with the fields that must be there.
_STAMP = {"server": INT, "name": TEXT, "host": TEXT, "pid": INT, "ts": NUMBER}
_FIELDS = {
    "failed": ({"rank": INT, "ranks": INTS, "label": TEXT, "returncode": INT, "exit_code": INT,
                "exited_at": NUMBER, "note": TEXT + OR_NONE}, ()),
    ABORT: ({"exit_code": INT + OR_NONE, "reason": TEXT}, ("reason",)),
    NEXT: ({"servers": INTS}, ("servers",)),
    START: ({"servers": INTS}, ("servers",)),
    MASTER: ({"addr": TEXT, "port": INT, "reason": TEXT}, ("addr",)),
    "join": ({"address": TEXT}, ()),
}
_bad_record = WarnOnce(log)


def problem(record: object, kind: str) -> Optional[str]:
    """Why ``record`` is not a record of ``kind`` the launcher can use (None: it is)."""
    if not isinstance(record, dict):
        return f"it is {type(record).__name__}, not an object"
    fields, required = _FIELDS.get(kind, ({}, ()))
    missing = next((name for name in required if name not in record), None)
    if missing is not None:
        return f"it has no {missing!r}"
    return typed(record, _STAMP) or typed(record, fields)


def checked(data: Optional[bytes], where: str, name: str) -> Optional[dict]:
    """The record ``name`` read from ``where`` (None: absent), or None with one warning (once per
    record and problem) when it cannot be used: the job goes on without it.

    Args:
        data: The raw record (an etcd value), or None to read the file ``where``.
        where: The file or key, for messages.
        name: The record's name (``failed.1.json``): its kind.
    """
    try:
        record = read_record(where, "coordination record") if data is None \
            else loads_record(data, where, "coordination record")
    except FileNotFoundError:
        return None
    except InputFileError as exc:
        _bad_record((where, str(exc)), "%s; ignoring it, the job goes on", exc)
        return None
    except OSError as exc:
        _bad_record((where, exc.errno), "cannot read coordination record %s (%s); ignoring it, the job goes on",
                    where, exc.strerror or exc)
        return None
    return usable(record, where, name)


def usable(record: object, where: str, name: str) -> Optional[dict]:
    """A parsed record ``name`` (one a view carried, or :func:`checked`'s), or None with one warning
    (once per record and problem) when it is not one a launcher writes."""
    why = problem(record, _kind(name))
    if why is None:
        return record  # type: ignore[return-value]
    _bad_record((where, why), "coordination record %s is not one a launcher writes (%s); ignoring it, the job "
                "goes on", where, why)
    return None


def _kind(name: str) -> str:
    """``failed``, ``abort``, ``next``, ... for a record's name (``failed.1.json``, ``join.3``)."""
    match = _MARKER.fullmatch(name)
    if match is None:
        return name.split(".", 1)[0]
    return "failed" if match.group(1) else (match.group(3) or match.group(5) or match.group(6))


class SyncDir:
    """The files of one incarnation of the job, as seen by server ``index``.

    Args:
        path: ``DIR/<run-id>/inc_<k>``.
        index: This server's index in the rank table.
        names: Every server's name (``server_id``), by index.
    """

    def __init__(self, path: str, index: int, names: Sequence[str]):
        self.path = path
        self.index = index
        self.names = tuple(names)
        self.count = len(self.names)

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""
        return f"server {index} ({self.names[index]})" if 0 <= index < self.count else f"server {index}"

    @classmethod
    def join(cls, base: str, run_id: str, index: int, names: Sequence[str]) -> "SyncDir":
        """Join the current incarnation of ``run_id``, or start the next one.

        The newest ``inc_<k>`` is joined unless it is ``closed`` or already has this server's
        ``join.<index>`` (a previous start of this node): then ``inc_<k+1>``. Creating a directory
        and ``join.<index>`` are both exclusive, so nodes starting together end in the same one.
        """
        root = os.path.join(os.path.abspath(base), run_id)
        os.makedirs(root, exist_ok=True)
        numbers = [int(m.group(1)) for m in map(_INCARNATION.fullmatch, os.listdir(root)) if m]
        number = max(numbers, default=0)
        while True:
            path = os.path.join(root, f"inc_{number}")
            os.makedirs(path, exist_ok=True)
            files = cls(path, index, names)
            if not os.path.exists(os.path.join(path, CLOSED)) and files._publish("", f"join.{index}", {},
                                                                                 exclusive=True):
                return files
            number += 1

    def gen_path(self, generation: int) -> str:
        """``inc_<k>/gen_<g>``."""
        return os.path.join(self.path, f"gen_{generation}")

    def read(self, generation: int) -> Generation:
        """Every node's files of ``generation`` (files not readable yet are left out)."""
        directory = self.gen_path(generation)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        return collect(generation, names, lambda name: _load(os.path.join(directory, name)))

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Publish ``gen_<g>/<name>``; with ``exclusive``, False when it already exists."""
        return self._publish(f"gen_{generation}", name, data, exclusive)

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended: a later start of the job does not join it."""
        self._publish("", CLOSED, {"reason": reason}, exclusive=True)

    def shutdown(self) -> None:
        """Nothing to release: files are written at once."""

    def _publish(self, sub: str, name: str, data: dict, exclusive: bool) -> bool:
        directory = os.path.join(self.path, sub) if sub else self.path
        record = stamp(self.index, self.name(self.index), data)
        target = os.path.join(directory, name)
        tmp = os.path.join(directory, f".{name}.{socket.gethostname()}.{os.getpid()}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(record, fh)
                fh.flush()
                os.fsync(fh.fileno())
            if exclusive:
                os.link(tmp, target)  # fails if it exists, where a rename would replace it
            else:
                os.replace(tmp, target)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise LauncherError(f"--sync-dir: cannot write {target}: {exc.strerror or exc}") from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _load(path: str) -> Optional[dict]:
    """A record written by a launcher, or None (missing, or unusable: warned once)."""
    return checked(None, path, os.path.basename(path))
