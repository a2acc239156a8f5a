"""Benchmark 6: log throughput of 8 ranks printing as fast as they can.

Each rank (``scripts/spam.py``) writes ``<rank> <seq>`` lines with ``sys.stdout.write`` for 10 s after a
file barrier, then reports how many it wrote. Throughput = lines found in the rank files / the ranks'
common writing window. Variants, alternated run by run:

* ours: ranks write into pipes; the launcher tees them to ``rank_<r>.log`` and to the console with a
  ``[rank N]`` prefix (console -> /dev/null);
* ours with ``--console-ranks none``: ranks write into pipes too; the launcher moves the bytes into
  the files in the kernel (``splice``), so that a full log disk fails the launcher's write, not the rank's;
* direct: the same 8 processes started by the bench, writing their files themselves as ranks without a
  launcher do (the log file opened as the launcher opens it, stderr into it, ``PYTHONUNBUFFERED=1``,
  buffered as the launcher's ranks are): the baseline, everything but the launcher;
* torchrun ``--tee 3 --log-dir D``: ranks write files, torchrun tails them to the console.

The launcher runs ranks unbuffered, as torchrun does (``python -u``): every line is one ``write``
system call. So the baseline is unbuffered too, and the three ``, block-buffered`` variants repeat
ours and direct with ``PYTHONUNBUFFERED=`` (empty: the launcher keeps a user's value, Python reads
empty as unset), Python's default 8 KiB buffer. A baseline buffered unlike the ranks under the
launcher measures the buffering, not the launcher (it hid here as a 5.6x "gap" on 2026-11-23).

Every run checks that the files hold as many lines as the ranks wrote. One extra, unmeasured run of
ours sends the console to a file and verifies every rank file (sequence numbers contiguous) and every
console line (``^\\[rank N\\] N <seq>$``, per-rank order contiguous, nothing interleaved mid-line).
"""

import glob
import os
import re
import subprocess
import time
from typing import Dict, List, Optional

import psutil

from bench.common import (PYTHON, Job, Result, Row, Settings, TempDir, alternate, cleanup, column, fmt,
                          job_env, launcher_argv, median, progress, read_lines, script, torchrun_argv)
from launcher.common.envnames import PYTHONUNBUFFERED
from launcher.supervision.output import open_log

NAME = "logs"
NPROC = 8
BUFFERED = ", block-buffered"  # suffix of the variants run with PYTHONUNBUFFERED= (empty)
KINDS = ("ours", "ours --console-ranks none", "direct", "torchrun --tee 3",
         "ours" + BUFFERED, "ours --console-ranks none" + BUFFERED, "direct" + BUFFERED)
TARGET = 0.9  # at most 10 % slower than direct file output


def rank_env(kind: str, env: Dict[str, str]) -> Dict[str, str]:
    """The job's environment for ``kind``: the block-buffered variants set ``PYTHONUNBUFFERED=`` (empty),
    which the launcher keeps; the unbuffered direct baseline gets the ``PYTHONUNBUFFERED=1`` the launcher
    adds to a rank's environment (torchrun runs ``python -u`` instead)."""
    if kind.endswith(BUFFERED):
        return dict(env, **{PYTHONUNBUFFERED: ""})
    return dict(env, **{PYTHONUNBUFFERED: "1"}) if kind == "direct" else env


def start(kind: str, tmp: TempDir, env: Dict[str, str], console, command: Optional[List[str]] = None
          ) -> List[subprocess.Popen]:
    """Start one job of ``kind`` running ``command`` (default: ``scripts/spam.py``) as its ranks; returns
    the launcher / torchrun process, or the 8 ranks for direct."""
    command = command or [PYTHON, script("spam.py")]
    logs, env = tmp.sub("logs"), rank_env(kind, env)
    if kind.startswith("direct"):
        os.makedirs(logs)
        procs = []
        for rank in range(NPROC):
            out = open_log(os.path.join(logs, f"rank_{rank}.log"))  # O_APPEND, as the launcher opens it
            try:
                procs.append(subprocess.Popen(command, env=dict(env, RANK=str(rank)), stdin=subprocess.DEVNULL,
                                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            finally:
                os.close(out)
        return procs
    if kind.startswith("ours"):
        extra = ["--console-ranks", "none"] if "none" in kind else []
        argv = launcher_argv(NPROC, tmp.sub("run"), logs, command, extra)
    else:
        argv = torchrun_argv(NPROC, command[1:], ["--tee", "3", "--log-dir", logs])
    return [Job(argv, env, stdout=console or subprocess.DEVNULL).proc]


def rank_files(kind: str, logs: str) -> Dict[int, str]:
    """Rank -> the file its output reached."""
    if kind.startswith("ours"):
        paths = glob.glob(os.path.join(logs, "latest", "attempt_0", "rank_*.log"))
        return {int(re.search(r"rank_(\d+)", p).group(1)): p for p in paths}
    if kind.startswith("direct"):
        return {r: os.path.join(logs, f"rank_{r}.log") for r in range(NPROC)}
    paths = glob.glob(os.path.join(logs, "**", "attempt_0", "*", "stdout.log"), recursive=True)
    return {int(os.path.basename(os.path.dirname(p))): p for p in paths}


def count_lines(path: str) -> int:
    """Newlines in ``path`` (read in 4 MiB chunks)."""
    total = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            total += chunk.count(b"\n")
    return total


def one_run(kind: str, seconds: float, console_path: Optional[str] = None) -> dict:
    """One job of 8 spamming ranks; lines/s that reached the files, and lines lost."""
    tmp = TempDir("logs")
    with tmp:
        env = job_env(ready=tmp.sub("ready"), stats=tmp.sub("stats"), nproc=NPROC, seconds=seconds)
        console = open(console_path, "wb") if console_path else None
        try:
            procs = start(kind, tmp, env, console)
            cpu = _wait_sampling(procs, not kind.startswith("direct"), seconds + 90)
        finally:
            if console:
                console.close()
            cleanup()
        stats = {int(f[0]): (int(f[1]), float(f[2]), float(f[3])) for f in read_lines(tmp.sub("stats"))}
        files = rank_files(kind, tmp.sub("logs"))
        metrics = _throughput(stats, {r: count_lines(p) for r, p in files.items()})
        metrics["supervisor_cpu_s"] = cpu
        if console_path:
            metrics.update(verify(files, stats, console_path))
    return metrics


def _wait_sampling(procs: List[subprocess.Popen], sample: bool, timeout: float) -> Optional[float]:
    """Wait for ``procs``; with ``sample``, return the last CPU time (user + sys) of the first one
    (the launcher or torchrun agent) seen before it exited."""
    watched = psutil.Process(procs[0].pid) if sample else None
    deadline, cpu = time.monotonic() + timeout, None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if watched is not None:
            try:
                times = watched.cpu_times()
                cpu = times.user + times.system
            except psutil.Error:
                pass
        time.sleep(0.2)
    return cpu


def formatting_cost(chunks: int = 300) -> Dict[str, float]:
    """Nanoseconds per line of the launcher's console formatting (``RankOutput._to_console`` on read-size
    chunks of ``r seq`` lines, console = /dev/null), and of a reference that prefixes with one
    ``bytes.replace`` per chunk (what a Python tee can do at best)."""
    from launcher.supervision.console import Console
    from launcher.supervision.output import CHUNK, RankOutput

    chunk = b"".join(b"3 %d\n" % i for i in range(1000000, 1013000))[:CHUNK]
    lines = chunk.count(b"\n") * chunks
    with open(os.devnull, "wb") as devnull:
        out = RankOutput(-1, -1, "rank 3", Console(devnull.fileno(), "stdout"))  # as the launcher writes it
        start = time.perf_counter()
        for _ in range(chunks):
            out._to_console(chunk)  # pylint: disable=protected-access
        current = time.perf_counter() - start
        prefix, partial = b"[rank 3] ", b""
        start = time.perf_counter()
        for _ in range(chunks):
            data = partial + chunk
            cut = data.rfind(b"\n") + 1
            partial = data[cut:]
            devnull.write(prefix + data[:cut - 1].replace(b"\n", b"\n" + prefix) + b"\n")
            devnull.flush()
        alternative = time.perf_counter() - start
    return {"current_ns_per_line": current / lines * 1e9, "replace_ns_per_line": alternative / lines * 1e9}


def _throughput(stats: Dict[int, tuple], found: Dict[int, int]) -> dict:
    if len(stats) < NPROC:
        return {"error": f"only {len(stats)} of {NPROC} ranks reported"}
    window = max(s[2] for s in stats.values()) - min(s[1] for s in stats.values())
    lost = sum(max(0, stats[r][0] - found.get(r, 0)) for r in stats)
    return {"lines_per_s": sum(found.values()) / window, "window_s": window, "lines": sum(found.values()),
            "written": sum(s[0] for s in stats.values()), "lost": lost}


def verify(files: Dict[int, str], stats: Dict[int, tuple], console_path: str) -> dict:
    """Exact check: each rank file is ``r 0``..``r n-1``; each console line is ``[rank r] r <seq>`` with
    every rank's sequence complete and in order."""
    bad_files = 0
    for rank, (count, _start, _end) in stats.items():
        with open(files[rank], "rb") as fh:
            bad_files += fh.read() != b"".join(b"%d %d\n" % (rank, i) for i in range(count))
    with open(console_path, "rb") as fh:
        data = fh.read()
    matched, bad_order = 0, 0
    for rank, (count, _start, _end) in stats.items():
        seqs = re.findall(rb"^\[rank %d\] %d (\d+)$" % (rank, rank), data, re.M)
        matched += len(seqs)
        bad_order += seqs != [b"%d" % i for i in range(count)]
    total = data.count(b"\n")
    return {"verified_lines": total, "bad_rank_files": bad_files, "console_lines_malformed": total - matched,
            "console_ranks_out_of_order": bad_order}


def run(settings: Settings) -> Result:
    """Throughput of every variant, then the verification run."""
    seconds, warm = (1.0, 1.0) if settings.quick else (10.0, 1.0)
    if settings.warmup:
        for kind in KINDS:
            progress(f"logs warm-up {kind}: " + str(one_run(kind, warm).get("lines_per_s")))
    variants = {kind: (lambda k=kind: one_run(k, seconds)) for kind in KINDS}
    runs = alternate(variants, Settings(settings.runs, 0, settings.quick), "logs")
    with TempDir("logs-console") as tmp:
        check = one_run("ours", 1.0 if settings.quick else 3.0, os.path.join(tmp, "console"))
    progress(f"logs verification: {check}")
    cost = formatting_cost()
    return Result(_rows(runs, check), {"runs": runs, "verification": check, "seconds": seconds,
                                       "formatting": cost}, _details(runs, check, seconds, cost))


def _rows(runs: Dict[str, List[dict]], check: dict) -> List[Row]:
    rate = {kind: median(column(runs[kind], "lines_per_s")) for kind in KINDS}
    count = len(runs["ours"])
    rows = []
    for kind, label in (("ours", "tee'd to files + console"), ("ours --console-ranks none", "files only"),
                        ("ours" + BUFFERED, "block-buffered, tee'd to files + console"),
                        ("ours --console-ranks none" + BUFFERED, "block-buffered, files only")):
        base = "direct" + BUFFERED if kind.endswith(BUFFERED) else "direct"  # the same buffering
        share = rate[kind] / rate[base] if rate[kind] and rate[base] else None
        anchors = {base: rate[base]}
        if kind == "ours":
            anchors["torchrun --tee 3"] = rate["torchrun --tee 3"]
        rows.append(Row(NAME, f"{NPROC} ranks, {label}: lines/s reaching the files", "lines/s", rate[kind],
                        anchors, f"{fmt(share)}x {base}" if share else "-",
                        "ranks slowed <= 10 % vs direct, same buffering", share is not None and share >= TARGET, count))
    lost = sum(r.get("lost", 0) for kind in KINDS if kind.startswith("ours") for r in runs[kind])
    lost += check.get("bad_rank_files", 1)
    broken = check.get("console_lines_malformed", 1) + check.get("console_ranks_out_of_order", 1)
    rows.append(Row(NAME, "ours: lines lost (all runs) + rank files not contiguous (check run)", "count", lost,
                    {}, "-", "0", lost == 0, count))
    rows.append(Row(NAME, "ours: console lines malformed / interleaved / out of order (check run)", "count",
                    broken, {}, "-", "0", broken == 0, 1))
    return rows


def _details(runs: Dict[str, List[dict]], check: dict, seconds: float, cost: Dict[str, float]) -> List[str]:
    rate = {k: median(column(runs[k], "lines_per_s")) for k in ("direct", "direct" + BUFFERED)}
    lines = [f"- {NPROC} ranks x {seconds:.0f} s; stdout unbuffered as the launcher and torchrun run ranks (one "
             "`write` per line), `, block-buffered` variants with `PYTHONUNBUFFERED=` (empty). Lines written per "
             "run (median): " + "; ".join(f"{k} {fmt(median(column(runs[k], 'written')))}" for k in KINDS) + "."]
    if all(rate.values()):
        lines.append(f"- Unbuffered output itself, without any launcher: the direct writers at {fmt(rate['direct'])} "
                     f"lines/s unbuffered, {fmt(rate['direct' + BUFFERED])} block-buffered "
                     f"({fmt(rate['direct' + BUFFERED] / rate['direct'])}x).")
    cpu = {k: median(column(runs[k], "supervisor_cpu_s")) for k in KINDS if not k.startswith("direct")}
    lines.append("- CPU used by the supervising process itself during a run (median, of the "
                 f"{2 * seconds:.0f} CPU-seconds {os.cpu_count()} cores offer in {seconds:.0f} s): "
                 + "; ".join(f"{k} {fmt(v)} s" for k, v in cpu.items()) + ".")
    lines.append(f"- The launcher's console formatting as it is (`RankOutput._to_console`, read-size chunks, in "
                 f"process): {fmt(cost['current_ns_per_line'])} ns per line; reference, one `bytes.replace` per "
                 f"chunk: {fmt(cost['replace_ns_per_line'])} ns per line.")
    lines.append("- Per run, millions of lines/s (other processes' share of the CPUs during the run): " + "; ".join(
        f"{k}: " + ", ".join(f"{fmt(r.get('lines_per_s', 0) / 1e6)} ({r.get('foreign_cpu_share', 0):.0%})"
                             for r in runs[k]) for k in KINDS) + ".")
    lost = {k: sum(r.get("lost", 0) for r in runs[k]) for k in KINDS}
    lines.append("- Lines missing from the files, all measured runs: " + "; ".join(f"{k} {v}" for k, v in lost.items())
                 + ".")
    lines.append(f"- Check run (console to a file): {check.get('verified_lines')} console lines, "
                 f"{check.get('console_lines_malformed')} malformed, {check.get('console_ranks_out_of_order')} ranks "
                 f"with gaps or reordering on the console, {check.get('bad_rank_files')} rank files not exactly "
                 "`r 0` .. `r n-1`.")
    return lines


def side_by_side(kinds: List[str], runs: int, seconds: float) -> Dict[str, Dict[str, float]]:
    """A few variants alternated run by run (A B A B ...): median lines/s and the supervisor's CPU
    seconds of each (a quick before/after of one change, without the whole benchmark)."""
    results: Dict[str, List[dict]] = {kind: [] for kind in kinds}
    for _ in range(runs):
        for kind in kinds:
            results[kind].append(one_run(kind, seconds))
            progress(f"logs {kind}: {fmt(results[kind][-1].get('lines_per_s', 0))} lines/s")
    return {kind: {"lines_per_s": median(column(rows, "lines_per_s")),
                   "supervisor_cpu_s": median([r["supervisor_cpu_s"] or 0.0 for r in rows]),
                   "lost": sum(r.get("lost", 0) for r in rows)} for kind, rows in results.items()}


if __name__ == "__main__":  # python -m bench.logs [--runs N] [--seconds S] KIND ...
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.logs", description=side_by_side.__doc__)
    parser.add_argument("kinds", nargs="+", choices=KINDS, metavar="KIND")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(side_by_side(args.kinds, args.runs, args.seconds), indent=1))
