"""Benchmark 7: scale, in process (``time.perf_counter``, median of the measured runs after a warm-up).

* A 1.0 rank table of 512 servers x 16 devices (8,192 ranks, from ``generate_rank_table``): parse
  (``parse_rank_table``), full validation (``validate_rank_table``: JSON Schema + semantic checks).
* Every local rank's environment (``locate_server`` + ``worker_specs``), for one server (the last
  one, the worst case for lookups) and for all 512 servers.
* A restore plan for 16,384 ranks: replica groups of 8 (layout dp=8 x tp=8 x pp=256), 4 fault ranks,
  no checkpoint directory; then with a synthetic checkpoint directory (``rank_<r>/`` holding a periodic
  and, on healthy ranks, a breakpoint checkpoint), including the scanner's default settle interval;
  and every rank's environment from that plan (``plan.env_for``).
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


def _make_checkpoints(root: str) -> None:
    for rank in range(WORLD):
        rank_dir = os.path.join(root, f"rank_{rank}")
        os.mkdir(rank_dir)
        names = ["ckpt-1_100.pt"] + ([] if rank in FAULTS else ["ckpt-1_150_breakpoint.pt"])
        for name in names:
            with open(os.path.join(rank_dir, name), "wb") as fh:
                fh.write(b"x" * 64)


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
    from launcher.jobspec.ranktable.validate import _validator  # pylint: disable=protected-access

    def schema_only() -> None:
        """Only the JSON Schema walk."""
        for _ in _validator(doc["version"]).iter_errors(dict(doc)):
            pass

    quick = Settings(max(1, settings.runs // 2), 1, settings.quick)
    out = {"schema_only_s": median(timed(schema_only, quick)),
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
        out.update(_slow_fs_scan(root))
    return out


SLOW_FS_RANKS, SLOW_FS_LATENCY = 2048, 0.001


def _slow_fs_scan(root: str) -> Dict[str, List[float]]:
    """The checkpoint scan of ``SLOW_FS_RANKS`` rank directories on a simulated shared file system
    (``os.scandir`` and ``os.stat`` sleep ``SLOW_FS_LATENCY`` first), once as the launcher does it
    (threads after the probe) and once forced into one thread. One run each: the serial one takes
    seconds, and sleeps are not noisy."""
    from launcher.restore import checkpoints

    real = (checkpoints.os.scandir, checkpoints.os.stat, checkpoints.SLOW_RANK_SECONDS)

    def slow(call):
        def wrapped(*args, **kwargs):
            time.sleep(SLOW_FS_LATENCY)
            return call(*args, **kwargs)
        return wrapped

    out = {}
    try:
        checkpoints.os.scandir, checkpoints.os.stat = slow(real[0]), slow(real[1])
        for key, threshold in (("slow_fs_scan", real[2]), ("slow_fs_scan_one_thread", float("inf"))):
            checkpoints.SLOW_RANK_SECONDS = threshold
            start = time.perf_counter()
            checkpoints.scan_checkpoints(root, SLOW_FS_RANKS)
            out[key] = [time.perf_counter() - start]
    finally:
        checkpoints.os.scandir, checkpoints.os.stat, checkpoints.SLOW_RANK_SECONDS = real
    progress(f"scale: slow file system scan: {out['slow_fs_scan'][0]:.2f} s, one thread "
             f"{out['slow_fs_scan_one_thread'][0]:.2f} s")
    return out


_ROWS = (("parse", f"parse a 1.0 rank table, {SERVERS} servers x {DEVICES} devices"),
         ("validate", "validate it fully (JSON Schema + semantic checks)"),
         ("env_one_server", f"environments of the {DEVICES} local ranks of one server"),
         ("env_all_servers", f"environments of every rank, all {SERVERS} servers"),
         ("plan_no_ckpt", f"restore plan, {WORLD:,} ranks, groups of {DP}, {len(FAULTS)} faults, no checkpoints"),
         ("plan_ckpt", "restore plan, same, synthetic checkpoint dir (incl. 50 ms settle)"),
         ("plan_env_all_ranks", f"restore environment of all {WORLD:,} ranks from that plan"))


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
             f"- Validation split: JSON Schema (jsonschema) {fmt(ms(diag['schema_only_s']))} ms, semantic checks "
             f"{fmt(ms(diag['semantic_only_s']))} ms.",
             "- Environments of all servers with `RankTable.world_size`, `server_index` and `find_servers` "
             f"memoised (patched in the bench process only): {fmt(ms(diag['env_all_servers_memoised_s']))} ms."]
    if "slow_fs_scan" in times:
        lines.append(f"- Checkpoint scan of {SLOW_FS_RANKS:,} rank directories (2 files each, 50 ms settle) on a "
                     f"simulated shared file system, {SLOW_FS_LATENCY * 1e3:.0f} ms per `scandir`/`stat` (one run "
                     f"each): {fmt(median(times['slow_fs_scan']))} s as the launcher scans (the first "
                     f"{PROBE_RANKS} directories time the file system, then {SCAN_THREADS} threads), "
                     f"{fmt(median(times['slow_fs_scan_one_thread']))} s in one thread.")
    return lines
