"""The chaos suite's machinery: launch a job, inject or trigger a fault, and measure the recovery.

A ``ChaosJob`` owns one job's directories (run dir, log dir, checkpoint dir). It may be started
several times on the same directories (a fresh ``launcher run`` after a dying gasp or after the
launcher was SIGKILLed); each start is a ``Launch``. Everything is read back from what the launcher
and the ranks leave behind: ``events.jsonl`` (split per launch by ``launcher_pid``) and the per-attempt
rank logs. The rank logs carry no timestamps, so while a launch runs a watcher thread polls its
logs (every 50 ms) and notes when each rank of each attempt first printed ``resumed from``.
"""

import os
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tests.helpers.launch import Launcher, cli, events_in
from tests.helpers.procs import free_port, pid_alive

REPO = Path(__file__).resolve().parents[2]

# PyTorch: "step 70/200 loss ...", "resumed from <path> at step 70", "final sha256 <hex>";
# PyTorch DCP (examples/pytorch/dcp_train.py, rank 0 only): "[dcp_train rank 0/4] step 7 loss ...";
# MindSpore: "epoch 2 step 23/40 loss ...", "resumed from <path> [launcher plan: ...] at global step 15",
# "final params sha256 <hex>".
STEP_LINE = re.compile(r"^(?:\[dcp_train rank \d+/\d+\] )?(?:epoch \d+ )?step (\d+)(?:/\d+| loss)", re.M)
RESUMED = re.compile(r"resumed from (\S+) (?:\[[^]]*\] )?at (?:global )?step (\d+)")
FINAL_HASH = re.compile(r"final (?:params )?sha256 ([0-9a-f]{64})")
WATCH_INTERVAL = 0.05


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (test side only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def _not_a_socket(directory, names):
    return [n for n in names if stat.S_ISSOCK(os.lstat(os.path.join(directory, n)).st_mode)]


@dataclass
class Launch:
    """One ``launcher run`` process of a job (started through the tests' harness, which kills it at
    the end of a test that left it running; its ranks die with it)."""

    index: int
    nproc: int                                 # its --nproc-per-node (a job may change world size)
    launcher: Launcher
    started: float
    killed_at: Optional[float] = None  # wall time the test SIGKILLed it
    ended_at: Optional[float] = None   # wall time its exit was reaped
    resumed_seen: Dict[Tuple[int, int], float] = field(default_factory=dict)  # (attempt, rank) -> time
    watcher: Optional[threading.Thread] = None

    @property
    def proc(self) -> subprocess.Popen:
        return self.launcher.proc

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Attempt:
    """One attempt of one launch, as recorded: events, rank logs and when each rank resumed."""

    launch: int
    number: int
    spawned_at: float                       # first rank_spawned ts
    pids: Dict[int, int]                    # rank -> pid (-1: MindSpore's scheduler)
    logs: Dict[int, str]                    # rank -> log text
    resumed_seen: Dict[int, float] = field(default_factory=dict)  # rank -> when "resumed from" appeared

    def max_step(self) -> int:
        """The highest completed step any rank logged (the example logs every step here)."""
        return max((int(s) for text in self.logs.values() for s in STEP_LINE.findall(text)), default=0)

    def resumed(self) -> Dict[int, Tuple[str, int]]:
        """rank -> (checkpoint path, step) from the ``resumed from`` lines."""
        out = {}
        for rank, text in self.logs.items():
            found = RESUMED.findall(text)
            if found:
                out[rank] = (found[0][0], int(found[0][1]))
        return out

    def final_hash(self) -> Optional[str]:
        found = FINAL_HASH.findall(self.logs.get(0, ""))
        return found[0] if found else None


class ChaosJob:
    """A job's directories and its launches.

    Args:
        tmp: where run/, logs/, ckpt/ and the launchers' output go.
        nproc: ranks per node.
        script: the training example each rank runs (``python <script> --ckpt-dir <ckpt> <train_args>``).
        train_args: its arguments after ``--ckpt-dir``.
        launcher_opts: ``launcher run`` options shared by every launch (e.g. ``--dp 4``).
    """

    def __init__(self, tmp: Path, nproc: int, script: str, train_args: Sequence[str],
                 launcher_opts: Sequence[str]):
        self.tmp = tmp
        self.nproc = nproc
        self.script = script
        self.train_args = list(train_args)
        self.launcher_opts = list(launcher_opts)
        self.run_dir = tmp / "run"
        self.log_dir = tmp / "logs"
        self.ckpt_dir = tmp / "ckpt"
        self.launches: List[Launch] = []
        tmp.mkdir(parents=True, exist_ok=True)

    def adopt_dirs(self, snapshot: Path) -> None:
        """Start from a copy of another job's run dir and checkpoint dir (``snapshot/run``,
        ``snapshot/ckpt``); the control socket a SIGKILLed launcher leaves behind is not copied:
        the next launcher replaces it anyway."""
        shutil.copytree(snapshot / "run", self.run_dir, ignore=_not_a_socket)
        shutil.copytree(snapshot / "ckpt", self.ckpt_dir)

    # -- launching ---------------------------------------------------------------------------
    def start(self, extra_train_args: Sequence[str] = (), extra_opts: Sequence[str] = (),
              nproc: Optional[int] = None) -> Launch:
        """Start ``launcher run`` in the background, output to a file (never a pipe that fills);
        ``nproc`` overrides the job's ranks per node for this launch (a resume on another world)."""
        index = len(self.launches)
        nproc = nproc or self.nproc
        launcher = Launcher(self.tmp, cwd=REPO, name=f"launcher.{index}.", merge_output=True)
        launcher.start(["--nproc-per-node", str(nproc), "--checkpoint-dir", self.ckpt_dir, "--console-ranks", "none",
                        "--master-port", str(free_port()), *self.launcher_opts, *extra_opts],
                       command=[sys.executable, self.script, "--ckpt-dir", self.ckpt_dir, *self.train_args,
                                *extra_train_args])
        launch = Launch(index, nproc, launcher, launcher.started)
        self.launches.append(launch)
        launch.watcher = threading.Thread(target=self._watch, args=(launch,), daemon=True,
                                          name=f"chaos-watch-{index}")
        launch.watcher.start()
        return launch

    def _watch(self, launch: Launch) -> None:
        """Note when each rank of each attempt first printed ``resumed from`` (until the launch ends)."""
        session = None
        done = set()
        while True:
            running = launch.proc.poll() is None
            session = session or self.session_dir(launch)
            if session is not None:
                for attempt_dir in session.glob("attempt_*"):
                    attempt = int(attempt_dir.name.split("_")[1])
                    for rank in range(launch.nproc):
                        if (attempt, rank) in done:
                            continue
                        try:
                            text = (attempt_dir / f"rank_{rank}.log").read_text(errors="replace")
                        except OSError:
                            continue
                        if "resumed from" in text or "starting from scratch" in text:
                            done.add((attempt, rank))
                            if "resumed from" in text:
                                launch.resumed_seen[(attempt, rank)] = time.time()
            if not running:
                return
            time.sleep(WATCH_INTERVAL)

    def wait(self, launch: Launch, timeout: float = 90) -> int:
        try:
            code = launch.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"launch {launch.index} did not end within {timeout} s:\n"
                                 f"{self.output(launch)[-3000:]}")
        launch.ended_at = time.time()
        launch.watcher.join(10)
        return code

    def kill_all(self) -> None:
        """Last resort cleanup: SIGKILL every launcher still running (its ranks die with it)."""
        for launch in self.launches:
            if launch.proc.poll() is None:
                launch.proc.kill()
                launch.proc.wait()

    def output(self, launch: Launch) -> str:
        return launch.launcher.output

    def sigkill(self, launch: Launch) -> int:
        """SIGKILL the launcher itself; returns its (negative) return code."""
        launch.killed_at = time.time()
        launch.proc.send_signal(signal.SIGKILL)
        code = launch.proc.wait(30)
        launch.ended_at = time.time()
        launch.watcher.join(10)
        return code

    def sigkill_rank(self, launch: Launch, rank: int) -> int:
        """SIGKILL one rank of the launch's newest attempt from outside (an OOM kill, a lost
        process); returns its pid, the one the launcher recorded, checked to be its child."""
        import psutil

        spawned = [e for e in self.events(launch) if e["event"] == "rank_spawned"]
        newest = max(e["attempt"] for e in spawned)
        pid = next(e["pid"] for e in spawned if e["attempt"] == newest and e["rank"] == rank)
        proc = psutil.Process(pid)  # psutil refuses to signal a pid reused after this point
        assert proc.ppid() == launch.pid, f"pid {pid} is not a child of launcher {launch.pid}"
        proc.send_signal(signal.SIGKILL)
        return pid

    def prestop(self, timeout: float = 60) -> subprocess.CompletedProcess:
        """``launcher prestop`` on this job's run dir (the container's preStop hook)."""
        return cli("prestop", "--run-dir", self.run_dir, timeout=timeout, cwd=REPO)

    # -- what the launcher recorded ------------------------------------------------------------
    def events(self, launch: Optional[Launch] = None) -> List[dict]:
        return events_in(self.run_dir) if launch is None else events_in(self.run_dir, launcher_pid=launch.pid)

    def session_dir(self, launch: Launch) -> Optional[Path]:
        starts = [e for e in self.events(launch) if e["event"] == "start"]
        return Path(starts[0]["log_dir"]) if starts else None

    def current_logs(self, launch: Launch) -> Dict[int, str]:
        """rank -> log text of the launch's newest attempt so far."""
        session = self.session_dir(launch)
        if session is None or not session.is_dir():
            return {}
        attempts = sorted(session.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
        if not attempts:
            return {}
        logs = {}
        for rank in range(launch.nproc):
            path = attempts[-1] / f"rank_{rank}.log"
            logs[rank] = path.read_text(errors="replace") if path.exists() else ""
        return logs

    def wait_for_step(self, launch: Launch, step: int, timeout: float = 60,
                      ranks: Optional[Sequence[int]] = None) -> None:
        """Wait until every rank of the launch's current attempt (or each of ``ranks``: the ones
        that log their steps) logged ``step`` (or beyond)."""
        ranks = range(launch.nproc) if ranks is None else ranks

        def reached() -> bool:
            logs = self.current_logs(launch)
            return len(logs) == launch.nproc and all(
                max((int(s) for s in STEP_LINE.findall(logs[r])), default=-1) >= step for r in ranks)

        if not wait_until(lambda: reached() or launch.proc.poll() is not None, timeout, 0.01) or not reached():
            self.kill_all()
            raise AssertionError(f"ranks never reached step {step} (launcher exit {launch.proc.poll()}):\n"
                                 f"{self.output(launch)[-3000:]}")

    def attempts(self, launch: Launch) -> List[Attempt]:
        """The launch's attempts in order, with their logs and resume times."""
        events = self.events(launch)
        session = self.session_dir(launch)
        spawned: Dict[int, Dict[int, int]] = {}
        first_ts: Dict[int, float] = {}
        for e in events:
            if e["event"] == "rank_spawned":
                spawned.setdefault(e["attempt"], {})[e["rank"]] = e["pid"]
                first_ts.setdefault(e["attempt"], e["ts"])
        out = []
        for number in sorted(spawned):
            logs = {}
            for rank in range(launch.nproc):
                path = session / f"attempt_{number}" / f"rank_{rank}.log" if session else None
                logs[rank] = path.read_text(errors="replace") if path and path.exists() else ""
            seen = {rank: t for (a, rank), t in launch.resumed_seen.items() if a == number}
            out.append(Attempt(launch.index, number, first_ts[number], spawned[number], logs, seen))
        return out

    def all_attempts(self) -> List[Attempt]:
        return [a for launch in self.launches for a in self.attempts(launch)]

    def recorded_pids(self) -> List[int]:
        """Every launcher and rank pid of this job's launches (events.jsonl and state.json; events of
        launchers that ran before a copied run dir was adopted are left out: their pids may be reused)."""
        ours = {launch.pid for launch in self.launches}
        pids = set(ours)
        for e in self.events():
            if e["event"] == "rank_spawned" and e.get("pid") and e.get("launcher_pid") in ours:
                pids.add(e["pid"])
        try:
            import json

            state = json.loads((self.run_dir / "state.json").read_text())
            if state.get("launcher_pid") in ours:
                pids.update(r["pid"] for r in state.get("ranks", []))
        except (OSError, ValueError):
            pass
        return sorted(pids)

    def survivors(self, timeout: float = 10) -> List[int]:
        """Recorded pids still alive after ``timeout`` (the caller asserts this is empty)."""
        pids = self.recorded_pids()
        wait_until(lambda: not any(pid_alive(p) for p in pids), timeout, 0.05)
        return [p for p in pids if pid_alive(p)]


# -- measurements and checks shared by the frameworks -------------------------------------------
def measure(record, progress: int, after: Attempt, fault_time: float, reference: Optional[str], code: int,
            gap: float = 0.0):
    """Fill the record: ``progress`` is the highest step completed before the fault, ``after`` the
    attempt that resumed (and finished), ``gap`` the time between a stopped launcher's exit and the
    next launcher's start (an operator's choice, not part of the recovery)."""
    record.progress = progress
    steps = {step for _, step in after.resumed().values()}
    if len(after.resumed()) == len(after.logs) and len(steps) == 1:
        record.resumed_at = steps.pop()
        record.steps_lost = record.progress - record.resumed_at
    record.respawn_s = after.spawned_at - fault_time - gap
    if len(after.resumed_seen) == len(after.logs):
        record.recover_s = max(after.resumed_seen.values()) - fault_time - gap
    # Without a reference hash (the DCP example prints none) the caller decides after its checks.
    record.recovered = code == 0 and reference is not None and after.final_hash() == reference


def check_launch_events(job: ChaosJob, launch, exit_code=None, after_unclean=False):
    """One restore_plan before every attempt_start; job_end/stop with the launcher's exit code;
    a launch on the run dir of a SIGKILLed launcher starts with ``unclean_previous_run``."""
    names = [e["event"] for e in job.events(launch)]
    if after_unclean:
        assert names[0] == "unclean_previous_run", names
        names = names[1:]
    assert names[0] == "start", names
    for i, name in enumerate(names):
        if name == "attempt_start":
            assert names[i - 1] == "restore_plan", names
    assert names.count("restore_plan") == names.count("attempt_start") >= 1, names
    if exit_code is None:  # SIGKILLed: nothing after the kill
        assert "job_end" not in names and "stop" not in names, names
    else:
        ends = [e for e in job.events(launch) if e["event"] == "job_end"]
        assert len(ends) == 1 and ends[0]["exit_code"] == exit_code, ends


def check_no_survivors(job: ChaosJob):
    left = job.survivors()
    assert not left, f"recorded processes still alive: {left}"


def check_gasp_events(job: ChaosJob, launch, pre):
    """prestop answered with every rank's 143; the gasp is in events.jsonl. Returns the gasp's ts.
    (MindSpore's scheduler, rank -1, is killed once the workers are gone.)"""
    assert pre.returncode == 0, pre.stdout + pre.stderr
    assert pre.stdout.count("exited with code 143") == job.nproc, pre.stdout
    events = job.events(launch)
    names = [e["event"] for e in events]
    assert "control_request" in names and names.count("gasp") == 1 and names.count("gasp_done") == 1, names
    gasp = next(e for e in events if e["event"] == "gasp")
    assert gasp["source"] == "prestop" and gasp["save"] and gasp["signal"] == "SIGTERM", gasp
    done = next(e for e in events if e["event"] == "gasp_done")
    assert [(r["rank"], r["exit_code"], r["killed_after_timeout"]) for r in done["ranks"] if r["rank"] >= 0] \
        == [(r, 143, False) for r in range(job.nproc)], done
    # MindSpore's scheduler (rank -1) is not asked to save: once the workers are gone its group is
    # killed, never at the gasp's deadline.
    assert all((r["exit_code"] == 143 if r["rank"] >= 0 else r["signal"] == "SIGKILL") and not r["killed_after_timeout"]
               for r in done["ranks"]), done
    return gasp["ts"]


def median(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
