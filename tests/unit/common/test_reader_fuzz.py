"""A property-based fuzzer over every reader of what the launcher did not write (issue #27).

Each reader gets what a peer, a cluster, another user or a broken disk could hand it: random bytes,
deep nesting, numbers out of range, JSON of the right shape with the wrong types, and in place of the
file a FIFO, a symlink to ``/dev/zero``, a directory, or nothing. What must hold, for every one:

* it returns, or raises only what its callers turn into one warning or exit 2 (``InputFileError`` /
  ``UsageError`` / ``ValueError`` / ``OSError``, as documented on it; docs/inputs.md) - never a
  RecursionError, OverflowError, TypeError, AttributeError, UnicodeDecodeError, KeyError;
* the records it returns can be used (the coordination records by ``Generation``, the events by
  goodput, ``launcher status`` and the timeline) without any of those either;
* at most one warning per call, and never a hang: every call runs under a ``SIGALRM`` timeout.

Each reader runs ``MAX_EXAMPLES`` examples (a few seconds); the corpus of fixed cases is
``tests/data/malformed`` (test_inputfiles.py) and the CLI-level cases are
tests/integration/test_run_dir_inputs.py and test_foreign_records.py.
"""

import json
import logging
import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.common import inputfiles, inputrecords, inputyaml
from launcher.common import rundir as rundir_mod
from launcher.common.errors import UsageError
from launcher.common.inputfiles import InputFileError

MAX_EXAMPLES = 40
TIMEOUT = 10  # seconds for one call: a read of a few KiB takes microseconds
#: Field names the readers look at: fuzzed records use them, so that wrong types reach the checks.
FIELDS = ["ranks", "rank", "returncode", "exit_code", "exited_at", "ts", "name", "note", "reason", "servers", "addr",
          "port", "server", "event", "attempt", "state", "step", "at", "pid", "started", "ended", "gasp_timeout",
          "last_save", "message", "extraInfo", "py_callstack", "after_rank", "scope", "rss_bytes", "restarts_left",
          "max_restarts", "failed", "signal", "source", "server_list", "server_count", "status", "version",
          "device", "rank_id", "device_id", "server_id", "RankList", "FaultRanks", "RetryTime", "GracefulExit",
          "create_time", "address", "label", "host"]
HUGE = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1" * 5000, "18446744073709551616", "1e308", "-0", "1.5"]

SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=10) | st.sampled_from(["0", "-1", "SIGTERM", "start", "rank_exited", "failed"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=4), inner, max_size=5),
                           max_leaves=20)


def _dumps(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _huge_in_place(data: dict) -> bytes:
    """A record whose every number is replaced by a number out of range (as text)."""
    text = _dumps(data)
    return text.replace(b"0", b"1e999", 1) if b"0" in text else text[:-1] + b', "ts": 1e999}'


RECORDS = st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=8)
CONTENT = st.one_of(
    st.binary(max_size=300),
    st.integers(50, 100_000).map(lambda n: b"[" * n),
    st.integers(50, 20_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.builds(lambda field, number: f'{{"{field}": [{number}], "{field}x": {number}}}'.encode(),
              st.sampled_from(FIELDS), st.sampled_from(HUGE)),
    RECORDS.map(_dumps),
    JSON_VALUES.map(_dumps),
    RECORDS.map(_huge_in_place),
    st.lists(RECORDS.map(_dumps) | st.binary(max_size=40), max_size=6).map(b"\n".join),
)
KINDS = st.sampled_from(["file"] * 6 + ["fifo", "dev-zero", "directory", "missing", "symlink"])
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


class _Hang(Exception):
    pass


@contextmanager
def deadline(seconds: int = TIMEOUT):
    """A hang (a blocking open, an endless read) becomes a failure of the test, not of the suite."""
    def expire(signum, frame):
        raise _Hang(f"the reader hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextmanager
def warnings_counted():
    handler = _Warnings()
    root = logging.getLogger("launcher")
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)


def plant(path: Path, kind: str, content: bytes) -> None:
    """``path`` made into ``kind``, holding ``content`` when it is a file."""
    if kind == "file":
        path.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        (path.parent / (path.name + ".real")).write_bytes(content)
        path.symlink_to(path.name + ".real")


@contextmanager
def planted(kind: str, content: bytes, name: str = "input"):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        plant(path, kind, content)
        yield path


def expect(call, allowed=(InputFileError, OSError)):
    """Run ``call`` under the deadline; only ``allowed`` may come out of it."""
    with deadline():
        try:
            return call()
        except allowed as exc:
            assert "\n" not in str(exc).strip() or isinstance(exc, UsageError), str(exc)
            return None


# -- the file readers of launcher.common ------------------------------------------------------------
@FUZZ
@given(KINDS, CONTENT)
def test_read_json(kind, content):
    with planted(kind, content) as path:
        expect(lambda: inputfiles.read_json(str(path), "rank table", inputfiles.LIMIT_RANK_TABLE))


@FUZZ
@given(KINDS, CONTENT)
def test_read_record(kind, content):
    with planted(kind, content) as path:
        expect(lambda: inputfiles.read_record(str(path), "state file"))


@FUZZ
@given(KINDS, CONTENT)
def test_read_line(kind, content):
    with planted(kind, content) as path:
        expect(lambda: inputfiles.read_line(str(path), "version"))


@FUZZ
@given(KINDS, CONTENT | st.text(max_size=200).map(str.encode)
       | st.builds(lambda n: (" " * n + "- x\n") * 1, st.integers(0, 300)).map(str.encode))
def test_read_yaml(kind, content):
    with planted(kind, content) as path:
        expect(lambda: inputyaml.read_yaml(str(path), "config file", inputfiles.LIMIT_CONFIG))


@FUZZ
@given(KINDS, CONTENT)
def test_json_lines(kind, content):
    with planted(kind, content) as path:
        objects = expect(lambda: inputrecords.JsonLines(str(path), "events file", line_limit=256, block=64).objects())
        assert objects is None or all(type(item) is dict for item in objects)


# -- coordination records: --sync-dir files and etcd values -----------------------------------------
RECORD_NAMES = st.sampled_from(["failed.1.json", "abort", "next.json", "start.json", "master.json", "join.2"])


def _usable(number, name, record):
    """What the coordinator does with a record it was given."""
    from launcher.cluster.syncdir import collect

    state = collect(number, [name], lambda _: record)
    state.failures(), state.failed_ranks(), state.exit_code()
    for proposal in (state.next, state.start):
        if proposal is not None:
            tuple(int(i) for i in proposal.get("servers", ()))
    if state.abort is not None:
        str(state.abort["reason"]), state.abort.get("name")
    if state.master is not None:
        str(state.master.get("addr")), int(state.master.get("port", 1))


@FUZZ
@given(KINDS, CONTENT, RECORD_NAMES)
def test_sync_dir_records(kind, content, name):
    from launcher.cluster.syncdir import checked

    with planted(kind, content, name) as path, warnings_counted() as warned:
        record = expect(lambda: checked(None, str(path), name), allowed=())
        assert len(warned) <= 1
        if record is not None:
            _usable(0, name, record)


@FUZZ
@given(CONTENT, RECORD_NAMES, st.integers(0, 2 ** 31))
def test_etcd_values(content, name, salt):
    from launcher.cluster.etcdstore import _parse

    with warnings_counted() as warned:
        record = expect(lambda: _parse(content, f"/launcher/fuzz/inc_{salt}/gen_0/{name}"), allowed=())
        assert len(warned) <= 1
    if record is not None:
        _usable(0, name, record)


# -- cluster reports ---------------------------------------------------------------------------------
@FUZZ
@given(KINDS, CONTENT, st.none() | st.binary(max_size=30))
def test_reset_json(kind, content, restart_type):
    from launcher.cluster.resetjson import read_reset

    with planted(kind, content, "reset.json") as path:
        if restart_type is not None:
            (path.parent / "restartType").write_bytes(restart_type)
        expect(lambda: read_reset(str(path)), allowed=(ValueError, OSError))


@FUZZ
@given(KINDS, CONTENT)
def test_fault_npus_and_reset_json_for_the_restore_plan(kind, content):
    from launcher.restore.faults import collect_faults

    with planted(kind, content, "fault-npus") as path:
        expect(lambda: collect_faults(8, str(path), str(path)), allowed=())


@FUZZ
@given(KINDS, CONTENT)
def test_rank_table(kind, content):
    from launcher.jobspec.ranktable.files import load_rank_table

    with planted(kind, content, "hccl.json") as path:
        expect(lambda: load_rank_table(str(path)), allowed=(ValueError, OSError, UsageError))


@FUZZ
@given(KINDS, CONTENT)
def test_config_file(kind, content):
    from launcher.jobspec.options import load_config

    with planted(kind, content, "config.yaml") as path:
        expect(lambda: load_config(str(path)), allowed=(UsageError,))


@FUZZ
@given(KINDS, CONTENT)
def test_groups_file(kind, content):
    from launcher.restore.groups import read_groups_file

    with planted(kind, content, "groups.yaml") as path:
        expect(lambda: read_groups_file(str(path), 8), allowed=())


# -- the run dir: status, report, prestop, goodput -------------------------------------------------
RUN_DIR_FILES = st.sampled_from([rundir_mod.EVENTS, rundir_mod.STATE, rundir_mod.LAUNCHER])
#: Per kind of event, the fields goodput, status and the timeline read.
EVENT_KINDS = {
    "start": ["max_restarts"], "attempt_start": ["attempt", "ranks"], "rank_spawned": ["attempt", "rank", "pid"],
    "rank_exited": ["attempt", "rank", "state", "exit_code", "exited_at", "signal"],
    "attempt_end": ["attempt", "failed"], "restart": ["attempt", "scope", "after_rank", "restarts_left"],
    "gasp": ["attempt", "source"], "heartbeat": ["rank", "step", "at"], "restore_plan": ["attempt", "step", "kind"],
    "standby_ready": ["rank", "pid", "rss_bytes"], "straggler": ["attempt", "rank"], "job_end": [],
    "step_first": ["attempt", "step", "at"], "step_regained": ["attempt", "step", "at"], "step_last": ["attempt", "step"],
    "stop_group": ["attempt", "ranks"], "cluster_hold": ["reason"], "cluster_hold_end": [],
    "cluster_update": ["newly_faulty_local"]}
#: What a launcher writes in a field; one value in four is of another type instead.
_INT, _TEXT = st.integers(-1, 3), st.sampled_from(["failed", "exited", "SIGTERM", "group", "rank"])
RIGHT = {"ranks": st.lists(_INT, max_size=3), "exited_at": st.floats(0, 2000), "at": st.floats(0, 2000),
         "state": _TEXT, "scope": _TEXT, "signal": _TEXT, "source": _TEXT, "reason": _TEXT, "kind": _TEXT,
         "failed": st.booleans(), "newly_faulty_local": st.lists(_INT, max_size=2)}
WRONG = (st.none() | st.booleans() | st.floats() | st.text(max_size=3) | st.lists(st.integers(-2, 3), max_size=3)
         | st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def _event(kind: str) -> st.SearchStrategy:
    fields = {name: st.one_of(*[RIGHT.get(name, _INT)] * 3, WRONG) for name in EVENT_KINDS[kind]}
    return st.fixed_dictionaries({"event": st.just(kind), "ts": st.one_of(*[st.floats(0, 2000)] * 5, WRONG)},
                                 optional=fields)


EVENTS = st.sampled_from(sorted(EVENT_KINDS)).flatmap(_event)
EVENT_LINES = st.lists(EVENTS.map(_dumps), max_size=16).map(b"\n".join)


@contextmanager
def fuzzed_run_dir(name: str, kind: str, content: bytes):
    from tests.unit.monitoring.test_status import EVENTS, write_run_dir

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(write_run_dir(Path(tmp) / "run", 2, 2 ** 22 + 1, EVENTS))
        (run_dir / name).unlink()
        plant(run_dir / name, kind, content)
        yield run_dir


@settings(FUZZ, max_examples=3 * MAX_EXAMPLES)
@given(RUN_DIR_FILES, KINDS, CONTENT | EVENT_LINES | EVENT_LINES)
def test_status(name, kind, content):
    from launcher.monitoring.status import format_status, job_status

    with fuzzed_run_dir(name, kind, content) as run_dir:
        doc = expect(lambda: job_status(str(run_dir), now=3000.0), allowed=())
        with deadline():
            format_status(doc)
            json.dumps(doc)


@settings(FUZZ, max_examples=3 * MAX_EXAMPLES)
@given(KINDS, EVENT_LINES | CONTENT)
def test_report(kind, content):
    from launcher.monitoring.eventsfile import read_events
    from launcher.monitoring.timeline import render

    with fuzzed_run_dir(rundir_mod.EVENTS, kind, content) as run_dir:
        read = expect(lambda: read_events(str(run_dir / rundir_mod.EVENTS), newest_run=True))
        if read is not None and read.events:
            with deadline():
                render(read.events, "fuzz")


@FUZZ
@given(RUN_DIR_FILES, KINDS, CONTENT)
def test_prestop_reads(name, kind, content):
    """What prestop reads before its gasp: the run dir's records, its recorded ranks and gasp timeout."""
    from launcher.control import gasp as gasp_mod
    from launcher.control.prestop import _recorded_gasp_timeout

    with fuzzed_run_dir(name, kind, content) as run_dir:
        rd = rundir_mod.RunDir(str(run_dir), create=False)
        try:
            record = expect(lambda: rd.read_json(rundir_mod.LAUNCHER) or {}, allowed=())
            state = expect(lambda: rd.read_json(rundir_mod.STATE) or {}, allowed=())
            with deadline():
                budget = _recorded_gasp_timeout(record if isinstance(record, dict) else {})
                assert 0 <= budget <= inputfiles.MAX_NUMBER
                gasp_mod.recorded_ranks(state)
        finally:
            rd.close()


@FUZZ
@given(KINDS, CONTENT)
def test_small_run_dir_files(kind, content):
    """The gasp gate's state, a rank's heartbeat slot and its torch error file."""
    from launcher.control.gasp import GaspGate
    from launcher.monitoring.errorfile import read_error_file
    from launcher.monitoring.heartbeats import read_slot

    with planted(kind, content) as path:
        expect(lambda: GaspGate(str(path), 60.0).allowed(), allowed=())
        expect(lambda: read_slot(str(path)), allowed=())
        expect(lambda: read_error_file(str(path)), allowed=())


@pytest.mark.parametrize("data", [b"[" * 60000, b'{"command": "gasp", "args": {"timeout": 1e999}}', b"\xff" * 10])
def test_control_requests_are_bounded(data):
    """What the control server parses from a client's line (it caught ValueError, not RecursionError)."""
    with pytest.raises(ValueError):
        inputfiles.loads_json(data, "control socket", "request on")


#: Values as a launcher writes them, for the fields that are not small integers.
GOOD = {"ranks": [0, 1], "exited_at": 1029.5, "at": 1029.0, "state": "failed", "scope": "rank", "signal": "SIGTERM",
        "source": "prestop", "reason": "FaultFlushing", "kind": "periodic", "failed": True, "newly_faulty_local": [1]}
#: Every type a JSON value can have that is not what the launcher writes in some field.
WRONG_VALUES = [None, True, 1.5, -1, "x", "1", [1], [[1]], {"a": 1}, 2 ** 63, -2 ** 63]


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_every_wrong_type_of_every_event_field(tmp_path, kind):
    """The exhaustive twin of the events fuzzing: each field an event of ``kind`` is read for, with each
    JSON type, in a run otherwise as a launcher writes it, through status, goodput and the timeline."""
    from launcher.monitoring.status import format_status, job_status
    from launcher.monitoring.timeline import render
    from tests.unit.monitoring.test_status import EVENTS as RUN, write_run_dir

    run_dir = Path(write_run_dir(tmp_path / "run", 2, 2 ** 22 + 1, RUN))
    base = [json.dumps({"run_id": "r", **ev}) for ev in RUN]
    for field in EVENT_KINDS[kind] + ["ts", "event"]:
        for value in WRONG_VALUES:
            bad = {"run_id": "r", "event": kind, "ts": 1030.0, **{name: GOOD.get(name, 1) for name in EVENT_KINDS[kind]},
                   field: value}
            (run_dir / rundir_mod.EVENTS).write_text("\n".join(base[:-1] + [json.dumps(bad), base[-1]]) + "\n")
            with deadline():
                doc = job_status(str(run_dir), now=3000.0)
                format_status(doc)
                from launcher.monitoring.eventsfile import read_events
                events = read_events(str(run_dir / rundir_mod.EVENTS), newest_run=True).events
                render(events, "fuzz")
