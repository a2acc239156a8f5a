"""Benchmark 7: scale, in process (``time.perf_counter``, median of the measured runs after a warm-up).

* A 1.0 rank table of 512 servers x 16 devices (8,192 ranks, from ``generate_rank_table``): parse
  (``parse_rank_table``), full validation (``validate_rank_table``: JSON Schema + semantic checks).
* Every local rank's environment (``locate_server`` + ``worker_specs``), for one server (the last
  one, the worst case for lookups) and for all 512 servers.
* A restore plan for 16,384 ranks: replica groups of 8 (layout dp=8 x tp=8 x pp=256), 4 fault ranks,
  no checkpoint directory; then with a synthetic checkpoint directory (``rank_<r>/`` holding a periodic
  and, on healthy ranks, a breakpoint checkpoint), including the scanner's default settle interval;
  and every rank's environment from that plan (``plan.env_for``).
* The same plan before a restart from the launcher's checkpoint index (issue #19): nothing saved
  since the last plan, and after ``SAVERS`` ranks saved a new checkpoint (inotify events drained and
  the changed directories listed as the event loop does while the files appear, timed apart).
* On a simulated shared file system: the full scan of ``SLOW_FS_RANKS`` rank directories, the
  index's check of all 16,384 (no inotify; every rank reports its saves in ``.saves/``), and the plan
  after ``SAVERS`` ranks saved and reported a new step: once with the failure right after the save
  round (the plan reads the round), once after the event loop's poll absorbed it (the poll comes
  ``RACY_SECONDS`` later, when the directory's mtime proves the next change; timed apart).
  Every save round is a new step (nothing rotated), so ``.saves/`` grows by ``SAVERS`` per round.
* The launcher itself over that tree (:mod:`bench.scalelive`): ``launcher run --nnodes 1024
  --nproc-per-node 16``, the ``restart`` -> ``restore_plan`` events of its first and later restarts,
  and of a first restart right after a save round (issue #29).
"""

import os
import time
from typing import Callable, Dict, List, Optional

from bench.common import (GATE, RETRIES, RETRY_SHARE, LoadMeter, Result, Row, Settings, TempDir, fmt, median, ms,
                          progress)

NAME = "scale"
SERVERS, DEVICES = 512, 16
WORLD, DP, TP, PP = 16384, 8, 8, 256
FAULTS = (3, 5000, 9999, 16383)
TARGET_MS = 100.0


def timed(func: Callable[[], object], settings: Settings) -> List[float]:
    """Seconds per call of ``func`` over the measured runs (after the warm-up calls).

    Each measured call waits for the quiet gate; a call of 0.1 s or more during which other processes
    took more than ``RETRY_SHARE`` of the machine is repeated once (within the benchmark's budget).
    """
    for _ in range(settings.warmup):
        func()
    times = []
    for _ in range(settings.runs):
        for attempt in range(2):
            GATE.wait()
            meter, start = LoadMeter(), time.perf_counter()
            func()
            elapsed = time.perf_counter() - start
            if elapsed < 0.1 or attempt or meter.share() <= RETRY_SHARE or not RETRIES.take(elapsed):
                break
        times.append(elapsed)
    return times


def _table_doc() -> dict:
    from launcher.jobspec.ranktable import generate_rank_table

    return generate_rank_table([(f"10.{i // 256}.{i % 256}.1", DEVICES) for i in range(SERVERS)])


def _env_builder(table) -> Callable[[Optional[int]], int]:
    """``build(index)``: every local rank's spec on server ``index`` (None: on every server)."""
    from launcher.jobspec.rankenv import EnvContext, worker_specs
    from launcher.jobspec.topology import Topology, locate_server

    def build(index: Optional[int]) -> int:
        """Build the specs; returns how many."""
        built = 0
        for server in (table.servers if index is None else [table.servers[index]]):
            here = locate_server(table, server.server_id, {})
            topo = Topology(table, here, "rank table bench", "/tmp/hccl.json", False, 29500)
            ctx = EnvContext("pytorch", topo, "bench", 3, "/tmp/run", "/tmp/group_info", {})
            built += len(worker_specs(ctx, ("python", "train.py"), 0))
        return built

    return build


def _cpu_timed(func: Callable[[], object], cpu: List[float]) -> None:
    """Call ``func``, appending the calling thread's CPU seconds to ``cpu``."""
    start = time.thread_time()
    func()
    cpu.append(time.thread_time() - start)


def _saves():
    """The ranks' helper reporting their saves (``launcher/rankhooks/launcher_saves.py``)."""
    import sys

    from launcher.supervision.debugging import HOOKS_DIR

    if HOOKS_DIR not in sys.path:
        sys.path.append(HOOKS_DIR)
    import launcher_saves  # pylint: disable=import-error

    return launcher_saves


def _save(path: str, data: bytes) -> None:
    """A rank's save as the PyTorch example does it: the file, then its report."""
    with open(path, "wb") as fh:
        fh.write(data)
    _saves().report_saved(path)


def _make_checkpoints(root: str) -> None:
    """The tree, every file reported by its rank, with every directory's mtime an hour back (saved
    long before the plan; directories changed within the index's racy window would be listed again)."""
    old = time.time() - 3600
    for rank in range(WORLD):
        rank_dir = os.path.join(root, f"rank_{rank}")
        os.mkdir(rank_dir)
        names = ["ckpt-1_100.pt"] + ([] if rank in FAULTS else ["ckpt-1_150_breakpoint.pt"])
        for name in names:
            _save(os.path.join(rank_dir, name), b"x" * 64)
        os.utime(rank_dir, (old, old))
    for path in (os.path.join(root, ".saves"), root):
        os.utime(path, (old, old))


def _save_round(root: str, step: int, drain: Optional[Callable[[], None]] = None) -> None:
    """``SAVERS`` ranks, spread over the job, save (and report) periodic step ``step``."""
    for rank in range(0, WORLD, WORLD // SAVERS):
        _save(os.path.join(root, f"rank_{rank}", f"ckpt-1_{step}.pt"), b"y" * 64)
        if drain is not None and rank % 512 == 0:
            drain()  # the event loop reads the queue as events come


SAVERS = 2048


def _index_times(root: str, inputs, settings: Settings) -> Dict[str, List[float]]:
    """The plan from the checkpoint index: unchanged tree; then per run ``SAVERS`` ranks (spread over
    the job) save the next periodic step, untimed, the index's event-loop update timed apart."""
    from launcher.restore import CheckpointIndex, compute_plan

    index = CheckpointIndex(root)
    try:
        compute_plan(inputs, index=index)  # the launcher's first plan: a full listing
        out = {"plan_index": timed(lambda: compute_plan(inputs, index=index), settings),
               "plan_index_saved": [], "index_update": [], "index_update_cpu": [], "plan_index_saved_cpu": []}
        for run in range(settings.warmup + settings.runs):
            _save_round(root, 200 + run, index.drain)
            start, cpu_start = time.perf_counter(), time.thread_time()
            index.update()  # what the index's thread runs after the burst
            update, update_cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            cpu: List[float] = []  # the planning thread's CPU: less noisy than wall time under load
            [plan_time] = timed(lambda: _cpu_timed(lambda: compute_plan(inputs, index=index), cpu),
                                Settings(1, 0, settings.quick))
            if run >= settings.warmup:
                out["plan_index_saved_cpu"].append(cpu[-1])
                out["index_update"].append(update)
                out["index_update_cpu"].append(update_cpu)
                out["plan_index_saved"].append(plan_time)
        return out
    finally:
        index.close()


def run(settings: Settings) -> Result:
    """Time every step; each must stay under 100 ms."""
    from launcher.jobspec.ranktable import parse_rank_table, validate_rank_table

    doc = _table_doc()
    table = parse_rank_table(doc)
    build = _env_builder(table)
    times: Dict[str, List[float]] = {
        "parse": timed(lambda: parse_rank_table(doc), settings),
        "validate": timed(lambda: validate_rank_table(doc), settings),
        "env_one_server": timed(lambda: build(SERVERS - 1), settings),
    }
    progress("scale: rank table done; environments of all servers next")
    times["env_all_servers"] = timed(lambda: build(None), settings)
    times.update(_plan_times(settings))
    diag = diagnostics(doc, table, settings)
    raw = {k: [round(v, 6) for v in vs] for k, vs in times.items()}
    raw["diagnostics"] = diag
    return Result(_rows(times, settings), raw, _details(doc, table, build, diag, times))


def diagnostics(doc: dict, table, settings: Settings) -> Dict[str, float]:
    """Where the misses come from: validation split into JSON Schema and semantic checks, and the
    all-servers environments again with the table's quadratic lookups memoised (patched in this
    process only, restored afterwards)."""
    from launcher.jobspec.ranktable.walk import semantic_problems
    from launcher.jobspec.ranktable.validate import _passes, _validator  # pylint: disable=protected-access

    def schema_only() -> None:
        """Only the JSON Schema walk."""
        for _ in _validator(doc["version"]).iter_errors(dict(doc)):
            pass

    quick = Settings(max(1, settings.runs // 2), 1, settings.quick)
    out = {"schema_only_s": median(timed(schema_only, quick)),
           "compiled_only_s": median(timed(lambda: _passes(doc["version"], dict(doc)), quick)),
           "semantic_only_s": median(timed(lambda: semantic_problems(doc), quick))}
    out["env_all_servers_memoised_s"] = median(_memoised(table, lambda: timed(lambda: _env_builder(table)(None),
                                                                               quick)))
    return out


def _memoised(table, measure: Callable[[], List[float]]) -> List[float]:
    """Run ``measure`` with ``RankTable.world_size``, ``server_index`` and ``find_servers`` answered
    from precomputed values (what caching them in the launcher would give)."""
    from launcher.jobspec.ranktable.model import RankTable

    world = sum(len(s.devices) for s in table.servers)
    index = {id(s): i for i, s in enumerate(table.servers)}
    by_address: Dict[str, list] = {}
    for server in table.servers:
        for address in server.addresses:
            by_address.setdefault(address, []).append(server)
    saved = {name: RankTable.__dict__[name] for name in ("world_size", "server_index", "find_servers")}
    try:
        RankTable.world_size = property(lambda self: world)
        RankTable.server_index = lambda self, server: index[id(server)]
        RankTable.find_servers = lambda self, addresses: list(
            {id(s): s for a in addresses for s in by_address.get(a, [])}.values())
        return measure()
    finally:
        for name, value in saved.items():
            setattr(RankTable, name, value)


def _plan_times(settings: Settings) -> Dict[str, List[float]]:
    from launcher.restore import PlanInputs, compute_plan

    inputs = PlanInputs(world_size=WORLD, dp=DP, tp=TP, pp=PP, extra_fault_ranks=FAULTS)
    out = {"plan_no_ckpt": timed(lambda: compute_plan(inputs), settings)}
    if settings.quick:
        return out
    with TempDir("ckpt") as root:
        start = time.perf_counter()
        _make_checkpoints(root)
        progress(f"scale: synthetic checkpoint dir of {WORLD} ranks made in {time.perf_counter() - start:.1f} s")
        with_ckpt = PlanInputs(world_size=WORLD, dp=DP, tp=TP, pp=PP, extra_fault_ranks=FAULTS, checkpoint_dir=root)
        out["plan_ckpt"] = timed(lambda: compute_plan(with_ckpt), settings)
        plan = compute_plan(with_ckpt)
        out["plan_env_all_ranks"] = timed(lambda: [plan.env_for(r) for r in range(WORLD)], settings)
        progress(f"scale: plan with checkpoints: {plan.kind} at step {plan.step}, {len(plan.warnings)} warning(s)")
        out.update(_index_times(root, with_ckpt, settings))
        # pylint: disable=import-outside-toplevel  # they import this module
        from bench.scalebg import background_rounds
        from bench.scalefs import slow_fs_scan
        from bench.scalelive import live_plans

        out.update(live_plans(root, settings.runs))  # the launcher itself, before the rounds below

        out.update(background_rounds(root, with_ckpt))  # before slow_fs_scan writes digest sidecars
        out.update(slow_fs_scan(root, with_ckpt))
    return out


SLOW_FS_RANKS, SLOW_FS_LATENCY = 2048, 0.001
#: bench.scalelive's rows (it cannot be imported here: it imports this module).
LIVE_ROWS = (("live_first", "live `launcher run --nnodes 1024 --nproc-per-node 16` (16,384 ranks) over that tree, "
              "first restart: `restart` -> `restore_plan` event"),
             ("live_later", "the same, later restarts"),
             ("live_saved_first", f"the same, first restart, failure the moment a round of {SAVERS:,} saves ended"))


_ROWS = (("parse", f"parse a 1.0 rank table, {SERVERS} servers x {DEVICES} devices"),
         ("validate", "validate it fully (JSON Schema + semantic checks)"),
         ("env_one_server", f"environments of the {DEVICES} local ranks of one server"),
         ("env_all_servers", f"environments of every rank, all {SERVERS} servers"),
         ("plan_no_ckpt", f"restore plan, {WORLD:,} ranks, groups of {DP}, {len(FAULTS)} faults, no checkpoints"),
         ("plan_ckpt", "restore plan, same, synthetic checkpoint dir, full scan (`launcher plan`; incl. 50 ms settle)"),
         ("plan_index", "restore plan before a restart, checkpoint index, nothing saved since the last plan"),
         ("plan_index_saved", f"restore plan before a restart, checkpoint index, after {SAVERS:,} ranks saved"),
         ("slow_fs_plan_polled", f"restore plan before a restart, checkpoint index, simulated shared file system "
          f"({SLOW_FS_LATENCY * 1e3:.0f} ms per stat/listing/open), after {SAVERS:,} ranks saved and reported a step "
          "and the event loop's poll absorbed it"),
         ("slow_fs_plan_saved", "the same, the failure right after the save round (before the poll: the plan "
          "lists `.saves/` and applies the round)"),
         ("bg_local_plan_at_once", f"restore plan, the index's thread running, local disk: called the moment a round "
          f"of {SAVERS:,} saves (another process) ends"),
         ("bg_local_plan_after", "the same, once the thread absorbed the round"),
         ("bg_slow_fs_plan_at_once", "the same on the simulated shared file system: called the moment the round ends"),
         ("bg_slow_fs_plan_after", "the same, once the thread's poll absorbed the round"),
         ("plan_env_all_ranks", f"restore environment of all {WORLD:,} ranks from that plan"),
         *LIVE_ROWS)


def _rows(times: Dict[str, List[float]], settings: Settings) -> List[Row]:
    rows = []
    for key, metric in _ROWS:
        if key in times:
            value = ms(median(times[key]))
            rows.append(Row(NAME, metric, "ms", value, {}, "-", "< 100 ms",
                            value is not None and value < TARGET_MS, len(times[key])))
    return rows


def _details(doc: dict, table, build, diag: Dict[str, float], times: Dict[str, List[float]]) -> List[str]:
    import json

    from launcher.restore.checkpoints import PROBE_RANKS, SCAN_THREADS

    text = json.dumps(doc)
    start = time.perf_counter()
    json.loads(text)
    decode = time.perf_counter() - start
    lines = [f"- The rank table is {len(text) / 1e6:.2f} MB of JSON ({table.world_size:,} ranks); `json.loads` "
             f"of it takes {fmt(ms(decode))} ms (not included above). {build(None):,} rank environments "
             "are built for all servers.",
             f"- Validation split: JSON Schema compiled by fastjsonschema {fmt(ms(diag['compiled_only_s']))} ms, "
             f"semantic checks {fmt(ms(diag['semantic_only_s']))} ms; the jsonschema walk, now run only to "
             f"explain a table that fails, {fmt(ms(diag['schema_only_s']))} ms.",
             "- Environments of all servers with `RankTable.world_size`, `server_index` and `find_servers` "
             f"memoised (patched in the bench process only): {fmt(ms(diag['env_all_servers_memoised_s']))} ms."]
    if "slow_fs_scan" in times:
        lines.append(f"- Checkpoint scan of {SLOW_FS_RANKS:,} rank directories (2 files each, 50 ms settle) on a "
                     f"simulated shared file system, {SLOW_FS_LATENCY * 1e3:.0f} ms per `scandir`/`stat` (one run "
                     f"each): {fmt(median(times['slow_fs_scan']))} s as the launcher scans (the first "
                     f"{PROBE_RANKS} directories time the file system, then {SCAN_THREADS} threads), "
                     f"{fmt(median(times['slow_fs_scan_one_thread']))} s in one thread. The checkpoint index's "
                     f"check of all {WORLD:,} rank directories there, every rank reporting its saves "
                     f"(`stat` of the checkpoint and `.saves/` directories, nothing changed): "
                     f"{fmt(ms(median(times['slow_fs_index'])))} ms.")
    if "slow_fs_poll" in times:
        lines.append(f"- Simulated shared file system: the event loop's poll that absorbs a round of {SAVERS:,} "
                     f"reports (one listing of `.saves/`, the reports applied) takes "
                     f"{fmt(ms(median(times['slow_fs_poll'])))} ms, outside the plan's time; after it the index's "
                     f"scan takes {fmt(ms(median(times['slow_fs_scan_polled'])))} ms of the plan (the rest is the "
                     "planner's; it opens no digest sidecar the index's listing did not see).")
    if "slow_fs_plan_sidecars" in times:
        lines.append(f"- Simulated shared file system, a `.sha256` sidecar beside each of the {SAVERS:,} files the "
                     f"plan picks, verified once before (by the first plan): the plan "
                     f"{fmt(ms(median(times['slow_fs_plan_sidecars'])))} ms (a `stat` of each file and sidecar, "
                     f"no hash; 3 runs), of which CPU {fmt(ms(median(times['slow_fs_plan_sidecars_cpu'])))} ms.")
    if "plan_index_saved_cpu" in times:
        lines.append("- CPU time of the planning thread (`time.thread_time`, medians; less noisy than wall time on "
                     f"a loaded machine): after {SAVERS:,} ranks saved, local disk "
                     f"{fmt(ms(median(times['plan_index_saved_cpu'])))} ms; simulated shared file system after "
                     f"the poll {fmt(ms(median(times['slow_fs_plan_polled_cpu'])))} ms.")
    if "bg_local_loop_lag" in times:
        lines.append("- The index's thread (`ckpt-index`) absorbing a round of "
                     f"{SAVERS:,} saves written by another process ({len(times['bg_local_loop_lag'])} rounds each): "
                     "the event loop (a 1 ms ticker in the main thread) woke at most "
                     f"{fmt(ms(median(times['bg_local_loop_lag'])))} ms late on the local disk and "
                     f"{fmt(ms(median(times['bg_slow_fs_loop_lag'])))} ms on the simulated shared file system, "
                     f"{fmt(ms(median(times['bg_baseline_loop_lag'])))} ms during a round without any index (the "
                     "machine's load and the writer); the absorption ran in the loop before (the update and the "
                     "poll below, then the loop's delay). The round was "
                     f"absorbed {fmt(ms(median(times['bg_local_absorbed'])))} / "
                     f"{fmt(ms(median(times['bg_slow_fs_absorbed'])))} ms after its last save.")
    if "bg_local_plan_at_once_cpu" in times:
        lines.append("- CPU time of the planning thread in those rounds (medians): called the moment the round "
                     f"ends {fmt(ms(median(times['bg_local_plan_at_once_cpu'])))} ms on the local disk, "
                     f"{fmt(ms(median(times['bg_slow_fs_plan_at_once_cpu'])))} ms on the simulated shared file "
                     f"system; once the round was absorbed {fmt(ms(median(times['bg_local_plan_after_cpu'])))} / "
                     f"{fmt(ms(median(times['bg_slow_fs_plan_after_cpu'])))} ms.")
    if "live_load" in times:
        lines.append("- Live runs (`bench/scalelive.py`): other processes took a median "
                     f"{median(times['live_load']):.0%} of the CPUs while they ran.")
    if "index_update" in times:
        cpu = (f" ({fmt(ms(median(times['index_update_cpu'])))} ms of CPU)" if "index_update_cpu" in times
               else "")
        lines.append(f"- Checkpoint index: after {SAVERS:,} ranks saved and reported a step, the index's update "
                     "(inotify events drained as they came; the reports applied, the changed directories listed "
                     f"where the reports do not account for them) takes {fmt(ms(median(times['index_update'])))} "
                     f"ms{cpu}, outside the plan's time.")
    return lines
