"""What ``launcher status`` shows: a job's state, read from its run dir only.

Files, not the control socket: it answers with the supervisor dead, stopped or busy, never makes the
supervisor do work on its loop, and costs a few small reads (``launcher.json``, ``state.json``,
``events.jsonl``) plus one ``/proc`` read per rank. The price: a rank's state is what the supervisor
last recorded (events are written as they happen, so it lags by the time of one event at most).

Heartbeat and step columns come from each rank's heartbeat slot (``<run-dir>/heartbeats/rank_<r>``,
written by ranks that call ``launcher_heartbeat.heartbeat`` when a hang option is on), else from
``heartbeat`` events; without either they are ``None`` and the text view says ``-``. Ranks named
stragglers in this attempt (``straggler`` events) are listed.
"""

import json
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

from launcher.common import jobs as jobs_mod
from launcher.common import rundir as rundir_mod
from launcher.common.errors import LauncherError
from launcher.common.inputfiles import InputFileError, read_record
from launcher.common.inputrecords import INT, NUMBER, OR_NONE, typed
from launcher.monitoring import eventsfile
from launcher.monitoring import goodput as goodput_mod
from launcher.monitoring.heartbeats import HEARTBEAT_DIR, read_slot, slot_path

EVENTS = "events.jsonl"


#: The fields of ``launcher.json``, ``state.json`` and its rank entries that status shows or uses.
_RECORD_FIELDS = {"pid": INT + OR_NONE, "started": NUMBER + OR_NONE, "ended": NUMBER + OR_NONE,
                  "attempt": INT + OR_NONE, "ranks": (list,) + OR_NONE}
_RANK_FIELDS = {"rank": INT, "pid": INT}


def _read_json(path: str) -> dict:
    """A run-dir record by the one reader; {} when missing or unusable, its wrong-typed fields dropped."""
    try:
        data = read_record(path, os.path.basename(path))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if typed({k: v}, _RECORD_FIELDS) is None}


def _proc_state(pid: int) -> Optional[str]:
    """The kernel's state letter of ``pid`` (R, S, D, T, Z, ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def find_run_dir(run_dir: Optional[str], job: Optional[str]) -> str:
    """The run dir to show: as prestop finds it, else the newest job under the base dir.

    Raises:
        UsageError: several running jobs (listed), a bad ``--job``.
        LauncherError: no job at all, or no such run dir.
    """
    found = jobs_mod.resolve(run_dir, job)
    if found is None:
        known = jobs_mod.scan(rundir_mod.base_dir())
        if not known:
            raise LauncherError(f"no jobs under {rundir_mod.base_dir()}", ["pass --run-dir DIR of a `launcher run`"])
        found = known[-1].run_dir
    if not os.path.isdir(found):
        raise LauncherError(f"no run dir {found}", ["see `launcher jobs`"])
    return found


def render(run_dir: str, as_json: bool) -> str:
    """What ``launcher status`` prints for ``run_dir``: the JSON document or the text view."""
    doc = job_status(run_dir)
    return json.dumps(doc, indent=2) if as_json else "\n".join(format_status(doc))


def job_status(run_dir: str, now: Optional[float] = None) -> dict:
    """The status document of the job in ``run_dir`` (``launcher status --json``).

    Args:
        run_dir: The job's run dir.
        now: The time to measure ages and a live run's goodput against (default: now).
    """
    now = time.time() if now is None else now
    record = _read_json(os.path.join(run_dir, rundir_mod.LAUNCHER))
    state = _read_json(os.path.join(run_dir, rundir_mod.STATE))
    live = jobs_mod.is_live(run_dir)
    try:
        events, skipped = eventsfile.read_events(os.path.join(run_dir, EVENTS), newest_run=True)
        unreadable = None
    except (OSError, InputFileError) as exc:
        events, skipped, unreadable = [], 0, str(exc) if isinstance(exc, InputFileError) else \
            f"cannot read {os.path.join(run_dir, EVENTS)}: {exc.strerror or exc}"
    attempt = state.get("attempt")
    seen = _Seen(events, attempt)
    doc = {"job": os.path.basename(os.path.normpath(run_dir)), "run_dir": run_dir,
           "status": "running" if live else "ended" if record.get("ended") else "died",
           "launcher_pid": record.get("pid"), "started": record.get("started"), "ended": record.get("ended"),
           "attempt": attempt, "restarts_left": seen.restarts_left,
           "ranks": _ranks(state, seen, attempt, now, os.path.join(run_dir, HEARTBEAT_DIR)),
           "stragglers": sorted(seen.stragglers), "restore_plan": _bare(seen.plan),
           "cluster": {"hold": seen.hold, "update": _bare(seen.update)}, "device_wait": seen.device_wait,
           "standbys": _standbys(seen, state) if live else [], "now": now,
           "events_skipped": skipped, "events_unreadable": unreadable}
    good = goodput_mod.compute(events, now=now if live else None)
    doc["goodput"] = good.to_json()
    return doc


class _Seen:
    """What the status shows from the events, in one pass over them (they may be many).

    Attributes:
        attempt: The attempt ``state.json`` names: rank events of other attempts are not shown.
        exited: rank -> its ``rank_exited`` in ``attempt`` (not restarted in place since).
        beats: rank -> its newest ``heartbeat`` event.
        stragglers: Ranks named in ``attempt``'s ``straggler`` events.
        plan: The newest ``restore_plan``; update: the newest ``cluster_update``.
        hold: The reason of a ``cluster_hold`` not ended yet.
        device_wait: A ``device_wait`` not ended yet (the held devices and their holders).
        restarts_left: From the newest ``restart``, else ``start``'s ``max_restarts``.
        standbys: rank -> its newest ``standby_ready`` (``--preload``).
    """

    def __init__(self, events: List[dict], attempt: Optional[int]):
        self.attempt = attempt
        self.exited: Dict[int, dict] = {}
        self.beats: Dict[int, dict] = {}
        self.stragglers: set = set()
        self.standbys: Dict[int, dict] = {}
        self.plan = self.update = self.hold = self.restarts_left = self.device_wait = None
        for ev in events:
            seen = self._SEEN.get(ev.get("event"))
            if seen is not None:
                seen(self, ev)

    def _beat(self, ev: dict) -> None:
        self.beats[ev.get("rank")] = ev

    def _standby(self, ev: dict) -> None:
        if ev.get("rank") is not None:  # a standby stands in for a rank: without one it is not shown
            self.standbys[ev["rank"]] = ev

    def _exited(self, ev: dict) -> None:
        if ev.get("attempt") == self.attempt:
            self.exited[ev.get("rank")] = ev

    def _spawned(self, ev: dict) -> None:
        if ev.get("attempt") == self.attempt:
            self.exited.pop(ev.get("rank"), None)  # restarted in place

    def _straggler(self, ev: dict) -> None:
        if ev.get("attempt") == self.attempt and ev.get("rank") is not None:
            self.stragglers.add(ev["rank"])

    def _restart(self, ev: dict) -> None:
        if "restarts_left" in ev:
            self.restarts_left = ev.get("restarts_left")

    #: kind of event -> what it tells the status (the newest of a kind wins).
    _SEEN: Dict[str, Callable[["_Seen", dict], None]] = {
        "heartbeat": _beat,
        "rank_exited": _exited,
        "rank_spawned": _spawned,
        "straggler": _straggler,
        "restore_plan": lambda self, ev: setattr(self, "plan", ev),
        "cluster_update": lambda self, ev: setattr(self, "update", ev),
        "standby_ready": _standby,
        "cluster_hold": lambda self, ev: setattr(self, "hold", ev.get("reason")),
        "cluster_hold_end": lambda self, ev: setattr(self, "hold", None),
        "device_wait": lambda self, ev: setattr(self, "device_wait", _bare(ev)),
        "device_wait_end": lambda self, ev: setattr(self, "device_wait", None),
        "start": lambda self, ev: setattr(self, "restarts_left", ev.get("max_restarts")),
        "restart": _restart,
    }


def _bare(ev: Optional[dict]) -> Optional[dict]:
    """An event without its bookkeeping fields."""
    return None if ev is None else {k: v for k, v in ev.items() if k not in ("run_id", "launcher_pid", "event")}


def _ranks(state: dict, seen: _Seen, attempt: Optional[int], now: float, slots: str) -> List[dict]:
    """One row per rank of the current attempt: pid, process state, recorded state, heartbeat (from the
    rank's heartbeat slot under ``slots`` when it has one, else a ``heartbeat`` event)."""
    rows = []
    for entry in state.get("ranks") or ():
        if not isinstance(entry, dict) or "pid" not in entry or typed(entry, _RANK_FIELDS) is not None:
            continue
        rank, pid = entry.get("rank"), entry["pid"]
        proc = _proc_state(pid) if pid > 0 else None
        done = seen.exited.get(rank)
        age, step = _slot_beat(slot_path(slots, rank), pid)
        beat = seen.beats.get(rank)
        if age is None and beat:
            age, step = round(now - beat["ts"], 3), beat.get("step")
        rows.append({"rank": rank, "pid": pid, "attempt": attempt, "process": proc,
                     "state": (done.get("state") or "exited") if done else ("running" if proc and proc != "Z"
                                                                          else "gone"),
                     "exit_code": done.get("exit_code") if done else None,
                     "heartbeat_age": age, "step": step})
    return rows


def _slot_beat(path: str, pid: int) -> Tuple[Optional[float], Optional[int]]:
    """Age (s) and step of the last beat in a rank's heartbeat slot, when this rank process wrote one.

    The slot holds ``time.monotonic()``, which is one clock for every process of the machine."""
    beat = read_slot(path)
    if beat is None or beat.pid != pid or beat.at <= 0:
        return None, None
    return round(time.monotonic() - beat.at, 3), (beat.step if beat.step >= 0 else None)


def _standbys(seen: _Seen, state: dict) -> List[dict]:
    """``--preload``'s warm standbys waiting now: the newest ready one of each rank, alive, no rank yet."""
    ranks = {row.get("pid") for row in state.get("ranks") or () if isinstance(row, dict)}
    return [{"rank": rank, "pid": ev.get("pid"), "rss_bytes": ev.get("rss_bytes")}
            for rank, ev in sorted(seen.standbys.items())
            if ev.get("pid") not in ranks and isinstance(ev.get("pid"), int) and ev["pid"] > 0
            and _proc_state(ev["pid"]) not in (None, "Z")]


def format_status(doc: dict) -> List[str]:
    """The text view of a status document."""
    return _job_lines(doc) + _rank_lines(doc["ranks"]) + _note_lines(doc) + _goodput_lines(doc["goodput"])


def _job_lines(doc: dict) -> List[str]:
    """The job, its restore plan, the cluster's word and a device wait."""
    plan, cluster = doc["restore_plan"], doc["cluster"]
    update = cluster["update"] or {}
    faulty = update.get("newly_faulty_local")
    lines = [f"job {doc['job']}  {doc['status']}  launcher pid {doc['launcher_pid'] or '?'}  "
             f"attempt {_dash(doc['attempt'])}  restarts left {_dash(doc['restarts_left'])}",
             f"run dir {doc['run_dir']}",
             f"restore plan: {plan.get('kind')} step {_dash(plan.get('step'))} ({plan.get('reason')})"
             if plan else "restore plan: none (no --checkpoint-dir)",
             f"cluster: {'HOLD: ' + str(cluster['hold']) if cluster['hold'] else 'no hold'}"
             + (f"; faulty local ranks {faulty}" if faulty else "")]
    wait = doc.get("device_wait")
    return lines + ([f"waiting for device(s) {wait.get('devices')}, held by {wait.get('holders')}"] if wait else [])


def _rank_lines(ranks: List[dict]) -> List[str]:
    """The table of ranks."""
    lines = [f"{'rank':>5} {'pid':>8} {'proc':>4} {'state':<10} {'exit':>5} {'heartbeat':>10} {'step':>8}"]
    for row in ranks:
        age = "-" if row["heartbeat_age"] is None else f"{row['heartbeat_age']:.1f}s ago"
        lines.append(f"{row['rank']:>5} {row['pid']:>8} {row['process'] or '-':>4} {row['state']:<10} "
                     f"{_dash(row['exit_code']):>5} {age:>10} {_dash(row['step']):>8}")
    return lines


def _note_lines(doc: dict) -> List[str]:
    """Warm standbys, stragglers, and what became of the events file, when there is something to say."""
    lines = []
    if doc.get("standbys"):
        lines.append("warm standbys (--preload): " + ", ".join(
            f"rank {sb['rank']} pid {sb['pid']} {(sb['rss_bytes'] or 0) >> 20} MiB" for sb in doc["standbys"]))
    if doc.get("stragglers"):
        lines.append(f"stragglers (slower than their peers): ranks {', '.join(map(str, doc['stragglers']))}")
    if doc.get("events_unreadable"):
        lines.append(f"events: {doc['events_unreadable']}")
    elif doc.get("events_skipped"):
        lines.append(f"events: {doc['events_skipped']} line(s) of {EVENTS} skipped (not an event the launcher writes)")
    return lines


def _goodput_lines(good: dict) -> List[str]:
    """The goodput line and one line per failure."""
    ratio = goodput_mod.ratio_text(good["ratio"], good.get("ratio_bounds"))
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in good["parts"].items() if v or k == "productive")
    return [f"goodput {ratio} of {good['wall']:.1f}s: {parts}"] + [
        f"  failure in attempt {failure['attempt']}: rank {_dash(failure['rank'])} {failure['cause']}; "
        f"lost {failure['time_lost']:.1f}s, {_recomputed(failure)}" for failure in good["failures"]]


def _recomputed(failure: dict) -> str:
    """``30 steps recomputed in 12.0s``, ``steps recomputed unknown`` without step numbers."""
    steps, seconds = failure["steps_recomputed"], failure["recompute_seconds"]
    if steps is None:
        return "steps recomputed unknown"
    return f"{steps} steps recomputed" + ("" if seconds is None or not steps else f" in {seconds:.1f}s")


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
