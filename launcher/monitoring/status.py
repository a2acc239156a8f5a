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
from typing import Dict, List, Optional, Tuple

from launcher.common import jobs as jobs_mod
from launcher.common import rundir as rundir_mod
from launcher.monitoring import goodput as goodput_mod
from launcher.monitoring.events import read_events
from launcher.monitoring.heartbeats import HEARTBEAT_DIR, read_slot, slot_path

EVENTS = "events.jsonl"


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _proc_state(pid: int) -> Optional[str]:
    """The kernel's state letter of ``pid`` (R, S, D, T, Z, ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


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
    events = goodput_mod.last_run(read_events(os.path.join(run_dir, EVENTS)))
    attempt = state.get("attempt")
    doc = {"job": os.path.basename(os.path.normpath(run_dir)), "run_dir": run_dir,
           "status": "running" if live else "ended" if record.get("ended") else "died",
           "launcher_pid": record.get("pid"), "started": record.get("started"), "ended": record.get("ended"),
           "attempt": attempt, "restarts_left": _restarts_left(events),
           "ranks": _ranks(state, events, attempt, now, os.path.join(run_dir, HEARTBEAT_DIR)),
           "stragglers": sorted({ev.get("rank") for ev in events
                                 if ev.get("event") == "straggler" and ev.get("attempt") == attempt}),
           "restore_plan": _last(events, "restore_plan"),
           "cluster": _cluster(events), "standbys": _standbys(events, state) if live else [], "now": now}
    good = goodput_mod.compute(events, now=now if live else None)
    doc["goodput"] = good.to_json()
    return doc


def _last(events: List[dict], kind: str) -> Optional[dict]:
    """The newest event of ``kind`` without its bookkeeping fields."""
    for ev in reversed(events):
        if ev.get("event") == kind:
            return {k: v for k, v in ev.items() if k not in ("run_id", "launcher_pid", "event")}
    return None


def _restarts_left(events: List[dict]) -> Optional[int]:
    for ev in reversed(events):
        if ev.get("event") == "restart" and "restarts_left" in ev:
            return ev["restarts_left"]
        if ev.get("event") == "start":
            return ev.get("max_restarts")
    return None


def _ranks(state: dict, events: List[dict], attempt: Optional[int], now: float, slots: str) -> List[dict]:
    """One row per rank of the current attempt: pid, process state, recorded state, heartbeat (from the
    rank's heartbeat slot under ``slots`` when it has one, else a ``heartbeat`` event)."""
    exited: Dict[int, dict] = {}
    beats: Dict[int, dict] = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "rank_exited" and ev.get("attempt") == attempt:
            exited[ev.get("rank")] = ev
        elif kind == "rank_spawned" and ev.get("attempt") == attempt:
            exited.pop(ev.get("rank"), None)  # restarted in place
        elif kind == "heartbeat":
            beats[ev.get("rank")] = ev
    rows = []
    for entry in state.get("ranks") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
            continue
        rank, pid = entry.get("rank"), entry["pid"]
        proc = _proc_state(pid) if pid > 0 else None
        done = exited.get(rank)
        age, step = _slot_beat(slot_path(slots, rank), pid)
        beat = beats.get(rank)
        if age is None and beat:
            age, step = round(now - beat["ts"], 3), beat.get("step")
        rows.append({"rank": rank, "pid": pid, "attempt": attempt, "process": proc,
                     "state": done["state"] if done else ("running" if proc and proc != "Z" else "gone"),
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


def _standbys(events: List[dict], state: dict) -> List[dict]:
    """``--preload``'s warm standbys waiting now: the newest ready one of each rank, alive, no rank yet."""
    ranks = {row.get("pid") for row in state.get("ranks", [])}
    ready = {ev.get("rank"): ev for ev in events if ev.get("event") == "standby_ready"}
    return [{"rank": rank, "pid": ev.get("pid"), "rss_bytes": ev.get("rss_bytes")} for rank, ev in sorted(ready.items())
            if ev.get("pid") not in ranks and _proc_state(ev.get("pid")) not in (None, "Z")]


def _cluster(events: List[dict]) -> dict:
    """Cluster holds: a ``cluster_hold`` not yet ended, and the newest reset.json update."""
    hold = None
    for ev in events:
        if ev.get("event") == "cluster_hold":
            hold = ev.get("reason")
        elif ev.get("event") == "cluster_hold_end":
            hold = None
    return {"hold": hold, "update": _last(events, "cluster_update")}


def format_status(doc: dict) -> List[str]:
    """The text view of a status document."""
    good = doc["goodput"]
    lines = [f"job {doc['job']}  {doc['status']}  launcher pid {doc['launcher_pid'] or '?'}  "
             f"attempt {_dash(doc['attempt'])}  restarts left {_dash(doc['restarts_left'])}",
             f"run dir {doc['run_dir']}"]
    plan = doc["restore_plan"]
    lines.append(f"restore plan: {plan.get('kind')} step {_dash(plan.get('step'))} ({plan.get('reason')})"
                 if plan else "restore plan: none (no --checkpoint-dir)")
    cluster = doc["cluster"]
    update = cluster["update"] or {}
    lines.append(f"cluster: {'HOLD: ' + str(cluster['hold']) if cluster['hold'] else 'no hold'}"
                 + (f"; faulty local ranks {update.get('newly_faulty_local')}" if update.get("newly_faulty_local")
                    else ""))
    lines.append(f"{'rank':>5} {'pid':>8} {'proc':>4} {'state':<10} {'exit':>5} {'heartbeat':>10} {'step':>8}")
    for row in doc["ranks"]:
        age = "-" if row["heartbeat_age"] is None else f"{row['heartbeat_age']:.1f}s ago"
        lines.append(f"{row['rank']:>5} {row['pid']:>8} {row['process'] or '-':>4} {row['state']:<10} "
                     f"{_dash(row['exit_code']):>5} {age:>10} {_dash(row['step']):>8}")
    if doc.get("standbys"):
        lines.append("warm standbys (--preload): " + ", ".join(f"rank {sb['rank']} pid {sb['pid']} "
                                                             f"{sb['rss_bytes'] >> 20} MiB" for sb in doc["standbys"]))
    if doc.get("stragglers"):
        lines.append(f"stragglers (slower than their peers): ranks {', '.join(map(str, doc['stragglers']))}")
    ratio = "?" if good["ratio"] is None else f"{100 * good['ratio']:.1f}%"
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in good["parts"].items() if v or k == "productive")
    lines.append(f"goodput {ratio} of {good['wall']:.1f}s: {parts}")
    for failure in good["failures"]:
        steps = "" if failure["steps_recomputed"] is None else f", {failure['steps_recomputed']} steps recomputed"
        lines.append(f"  failure in attempt {failure['attempt']}: rank {_dash(failure['rank'])} {failure['cause']}; "
                     f"lost {failure['time_lost']:.1f}s{steps}")
    return lines


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
