"""Warm standby ranks (``--preload``) with real processes: a rank born from a standby cannot tell.

Each test runs the same two-rank job cold and with ``--preload``; rank 1 fails on attempt 0 once the
standbys are ready (the test's trigger file), and attempt 1 is compared: the probe's dumps field by
field (tests/workers/start_probe.py), the exit status, the rank's log. Then what must fall back to a
cold start does, and the dying gasp reaches a standby-born rank.
"""

import json
import os
import re
import signal
import stat
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import Launcher, cli, events_in
from tests.helpers.procs import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests" / "workers" / "start_probe.py")
IMPORTER = str(REPO / "tests" / "workers" / "importer.py")


class Job(Launcher):
    """One ``launcher run`` of the probe in ``root``, started by the shared harness; ``preload`` None
    runs it cold (``--preload none``), ``"auto"`` with the default; ``module``: as ``python -m
    tests.workers.start_probe``; ``options``: more launcher options; ``worker``: another script
    than the probe."""

    def __init__(self, root: Path, preload, port: int, *probe_args: str, env=None, nproc: int = 2,
                 module: bool = False, options=(), worker=PROBE):
        super().__init__(root, env=env, cwd=REPO)
        self.root = root
        root.mkdir()
        self.out = root / "out"
        self.out.mkdir()
        self.trigger = root / "go"
        command = [sys.executable, *(["-m", "tests.workers.start_probe"] if module else [worker]),
                   "--out", str(self.out), "--fail-when", str(self.trigger), *probe_args]
        self.start(["--nproc-per-node", nproc, "--max-restarts", "1", "--run-id", "probe-job", "--master-port", port,
                    *(["--preload", preload or "none"] if preload != "auto" else []), *options], command=command)

    def go_when_ready(self, standbys: int) -> None:
        """Trigger the failure once ``standbys`` standbys answered ready (or at once for a cold job)."""
        assert wait_until(lambda: len(self.events("standby_ready")) >= standbys or self.proc.poll() is not None, 60)
        self.trigger.touch()

    def finish(self, timeout: float = 60) -> int:
        return self.wait(timeout)

    def dump(self, attempt: int, rank: int) -> dict:
        return json.loads((self.out / f"{attempt}-{rank}.json").read_text())

    def log(self, attempt: int, rank: int) -> str:
        return next((self.root / "logs").glob(f"*/attempt_{attempt}/rank_{rank}.log")).read_text()


def _normalise(value, root: Path):
    """Strip what differs between any two runs: the job's directory, token leaf, pipe inodes, addresses."""
    text = json.dumps(value, sort_keys=True).replace(str(root), "<job>")
    text = re.sub(r"\d{8}-\d{6}-\d+", "<session>", text)
    text = re.sub(r"(LAUNCHER_JOB_TOKEN[=\"': ]+)[0-9a-f]+\.[\w-]+", r"\1<token>", text)
    text = re.sub(r"pipe:\[\d+\]", "pipe", text)
    text = re.sub(r" at 0x[0-9a-f]+", "", text)
    return json.loads(text)


#: Fields that legitimately differ: /proc/self/environ is the kernel's copy of the environment the
#: process was exec'd with (the standby's start; docs/warm-standby.md), the token's presence is checked.
KNOWN = {"proc_environ"}


def _run_pair(tmp_path: Path, mode: str, preload: str = "json", module: bool = False, env=None):
    port = free_port()
    jobs = {}
    for name, modules in (("cold", None), ("warm", preload)):
        job = Job(tmp_path / name, modules, port, "--fail-rank", "1", "--mode", mode, "--fail-attempt", "1",
                  module=module, env=env)
        job.go_when_ready(2 if modules else 0)
        jobs[name] = (job, job.finish())
    return jobs


@pytest.mark.parametrize("module, cgroup", [(False, "auto"), (True, "auto"), (False, "off")],
                         ids=["script", "module", "no-cgroup"])
def test_standby_born_rank_sees_exactly_what_a_cold_one_sees(tmp_path, module, cgroup):
    """Without a cgroup the attempt ends sweep /proc for the job's token: the standbys must survive it."""
    jobs = _run_pair(tmp_path, "ok", module=module, env={**os.environ, "LAUNCHER_CGROUP": cgroup})
    (cold, cold_code), (warm, warm_code) = jobs["cold"], jobs["warm"]
    assert cold_code == warm_code == 0, warm.root.joinpath("stderr.txt").read_text()
    started = warm.events("standby_start")
    assert [e["ranks"] for e in started] == [[0, 1]]  # attempt 1 came from the standbys
    assert not cold.events("standby_start") and not cold.events("standby_ready")
    for rank in (0, 1):
        a, b = (_normalise(job.dump(1, rank), job.root) for job in (cold, warm))
        for field in sorted((set(a) | set(b)) - KNOWN):
            assert a.get(field) == b.get(field), f"rank {rank}: {field} differs"
        assert b["token_in_proc_environ"] and b["session_leader"] and b["group_leader"]
        assert b["pdeathsig"] == signal.SIGKILL and b["threads"] == 1
    ready = warm.events("standby_ready")
    assert all(e["rss_bytes"] > 0 and e["modules"] == ["json"] for e in ready)


@pytest.mark.parametrize("mode", ["exit3", "exitmsg", "raise", "interrupt", "kill"])
def test_exit_status_and_output_as_a_cold_rank(tmp_path, mode):
    jobs = _run_pair(tmp_path, mode)
    (cold, cold_code), (warm, warm_code) = jobs["cold"], jobs["warm"]
    assert [e["ranks"] for e in warm.events("standby_start")] == [[0, 1]]
    assert cold_code == warm_code != 0
    exits = [[e["exit_code"] for e in job.events("rank_exited") if e["attempt"] == 1 and e["rank"] == 1]
             for job in (cold, warm)]  # rank 0 ends on its own or by the stop, whichever comes first
    assert exits[0] == exits[1]
    assert cold.log(1, 1) == warm.log(1, 1)  # the same traceback / message, line for line


def _write_module(tmp_path: Path, name: str, body: str) -> dict:
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    (lib / f"{name}.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(lib)}


@pytest.mark.parametrize("module, body, reason", [
    ("threader", "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
     "started 1 thread"),
    ("broken", "raise ImportError('no device here')\n", "importing failed: ImportError: no device here"),
])
def test_refused_standby_falls_back_to_cold_starts(tmp_path, module, body, reason):
    env = _write_module(tmp_path, module, body)
    job = Job(tmp_path / "job", module, free_port(), "--fail-rank", "1", "--mode", "exit3", env=env)
    assert wait_until(lambda: job.events("standby_refused") or job.proc.poll() is not None, 60)
    job.trigger.touch()
    assert job.finish() == 0
    refused = job.events("standby_refused")
    assert len(refused) == 1 and reason in refused[0]["reason"]
    assert "warm standby refused" in (job.root / "stderr.txt").read_text()
    assert not job.events("standby_ready")
    assert [sorted(e["cold"]) for e in job.events("standby_start")] == [["0", "1"]]
    assert (job.out / "1-0.json").exists() and (job.out / "1-1.json").exists()  # both restarted cold


def test_dead_standby_means_a_cold_start_of_that_rank_only(tmp_path):
    job = Job(tmp_path / "job", "json", free_port(), "--fail-rank", "1", "--mode", "exit3")
    assert wait_until(lambda: len(job.events("standby_ready")) >= 2 or job.proc.poll() is not None, 60)
    victim = next(e for e in job.events("standby_ready") if e["rank"] == 0)
    os.kill(victim["pid"], signal.SIGKILL)
    assert wait_until(lambda: job.events("standby_died") or job.proc.poll() is not None, 30)
    job.trigger.touch()
    assert job.finish() == 0
    [started] = job.events("standby_start")
    assert started["ranks"] == [1] and list(started["cold"]) == ["0"]
    assert "the warm standby of rank 0 died" in (job.root / "stderr.txt").read_text()


def test_dying_gasp_reaches_a_standby_born_rank(tmp_path):
    job = Job(tmp_path / "job", "json", free_port(), "--fail-rank", "1", "--mode", "exit3",
              "--wait-term")
    job.go_when_ready(2)
    assert wait_until(lambda: all((job.out / f"1-{r}.term.ready").exists() for r in (0, 1))
                      or job.proc.poll() is not None, 60)
    assert [e["ranks"] for e in job.events("standby_start")] == [[0, 1]]
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish() == 143
    assert all((job.out / f"1-{r}.term").read_text() == "term\n" for r in (0, 1))
    assert sorted(e["exit_code"] for e in job.events("rank_exited") if e["attempt"] == 1) == [143, 143]


def test_standby_above_the_memory_cap_is_refused(tmp_path):
    job = Job(tmp_path / "job", "json", free_port(), "--fail-rank", "1", "--mode", "exit3",
              options=["--preload-max-rss", "1"])  # 1 MiB: no interpreter fits
    assert wait_until(lambda: job.events("standby_refused") or job.proc.poll() is not None, 60)
    job.trigger.touch()
    assert job.finish() == 0
    [refused] = job.events("standby_refused")
    assert "above --preload-max-rss 1 MiB" in refused["reason"]
    assert [sorted(e["cold"]) for e in job.events("standby_start")] == [["0", "1"]]


@pytest.mark.parametrize("options", [["--preload", "json"], []], ids=["named", "default"])
def test_preload_ignored_for_a_command_that_is_not_python(tmp_path, options):
    """Named modules: one warning; the default says nothing (there is nothing to learn)."""
    run_dir = tmp_path / "run"
    result = cli("run", "--nproc-per-node", 1, "--run-dir", run_dir, *options, "--", "true", cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("--preload json ignored: the command is not a Python interpreter") == len(options) // 2
    assert "WARNING" not in result.stderr or options
    assert not [e for e in events_in(run_dir) if e["event"].startswith("standby")]


def test_recover_in_place_respawns_the_failed_rank_from_its_standby(tmp_path):
    """recover-in-place (MindSpore with MS_ENABLE_TFT; the probe stands in for the rank): only rank 1
    is respawned, and from its warm standby, while rank 0 is never restarted."""
    env = {**os.environ, "MS_ENABLE_TFT": "{ARF:1}"}
    job = Job(tmp_path / "job", "json", free_port(), "--fail-rank", "1", "--mode", "exit3", env=env,
              options=["--framework", "mindspore", "--recover-strategy", "recover-in-place"])
    # rank 1's own standby: the scheduler (rank -1) has one too, and idle-class standbys get ready in any order
    assert wait_until(lambda: any(e["rank"] == 1 for e in job.events("standby_ready"))
                      or job.proc.poll() is not None, 60)
    job.trigger.touch()
    assert job.finish() == 0, (job.root / "stderr.txt").read_text()
    assert [(e["scope"], e["after_rank"]) for e in job.events("restart")] == [("rank", 1)]
    assert not job.events("stop_group")
    [started] = job.events("standby_start")
    assert started["attempt"] == 1 and started["ranks"] == [1] and not started["cold"]
    assert (job.out / "1-1.json").exists() and not (job.out / "1-0.json").exists()
    assert "rank(s) 1 started from warm standbys" in (job.root / "stderr.txt").read_text()


# -- --preload auto (the default): the standbys import what the ranks imported ---------------------
def _importer_outputs(job: Job, attempt: int):
    return [json.loads((job.out / f"{attempt}-{rank}.json").read_text())["preloaded"] for rank in (0, 1)]


def test_a_default_run_of_a_torch_script_keeps_standbys_and_preload_none_does_not(tmp_path):
    """The ranks import torch; by default the launcher learns it and both ranks of the restart are
    standbys that had imported it; with ``--preload none`` there is no standby and nothing is recorded."""
    jobs = {}
    for preload in ("auto", None):
        job = jobs[preload] = Job(tmp_path / str(preload), preload, free_port(), "--now", "torch", worker=IMPORTER)
        wanted = (lambda: len(job.events("standby_ready")) >= 2) if preload else (
            lambda: all((job.out / f"0-{rank}.json").exists() for rank in (0, 1)))
        assert wait_until(lambda: wanted() or job.proc.poll() is not None, 300)
        job.trigger.touch()
        assert job.finish(300) == 0, (job.root / "stderr.txt").read_text()
    auto, none = jobs["auto"], jobs[None]
    assert [e["ranks"] for e in auto.events("standby_start")] == [[0, 1]]
    assert all("torch" in e["modules"] for e in auto.events("standby_ready"))
    assert _importer_outputs(auto, 1) == [["torch"], ["torch"]]
    assert "rank(s) 0, 1 started from warm standbys" in (auto.root / "stderr.txt").read_text()
    assert not [e for e in none.events() if e["event"].startswith("standby")]
    assert _importer_outputs(none, 1) == [[], []]
    assert not list((none.root / "logs").glob("*/standby"))


def _blas_pool_env() -> dict:
    """Two OpenBLAS threads (numpy's pool: one worker beside the caller), as a MindSpore rank gets
    with ``OMP_NUM_THREADS`` unset on a machine of 2 CPUs or more: msrun sets none."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("OpenBLAS starts no worker thread with one CPU")
    pytest.importorskip("numpy")
    return {**os.environ, "OPENBLAS_NUM_THREADS": "2"}


def test_numpys_blas_pool_does_not_refuse_the_standby(tmp_path):
    """``import numpy`` starts OpenBLAS's worker pool, sized by the variables and CPU set the standby
    shares with its rank: the default keeps numpy in the standbys, and the restarted ranks have the
    threads a cold rank has (before this, a MindSpore job got no standby: mindspore imports numpy)."""
    job = Job(tmp_path / "job", "auto", free_port(), "--now", "numpy", env=_blas_pool_env(), worker=IMPORTER)
    assert wait_until(lambda: len({e["rank"] for e in job.events("standby_ready") if "numpy" in e["modules"]}) == 2
                      or job.proc.poll() is not None, 120)
    job.trigger.touch()
    assert job.finish() == 0, (job.root / "stderr.txt").read_text()
    assert not job.events("standby_refused")
    assert [e["ranks"] for e in job.events("standby_start")] == [[0, 1]]
    assert _importer_outputs(job, 1) == [["numpy"]] * 2
    threads = [[json.loads((job.out / f"{attempt}-{rank}.json").read_text())["threads"] for rank in (0, 1)]
               for attempt in (0, 1)]
    assert threads[0] == threads[1] == [2, 2]  # attempt 0 cold, attempt 1 from the standbys


def test_a_thread_beside_the_blas_pool_still_refuses(tmp_path):
    pool = _blas_pool_env()
    env = {**_write_module(tmp_path, "npthreader", "import numpy, threading, time\n"
                           "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"),
           "OPENBLAS_NUM_THREADS": pool["OPENBLAS_NUM_THREADS"]}
    job = Job(tmp_path / "job", "npthreader", free_port(), "--fail-rank", "1", "--mode", "exit3", env=env)
    assert wait_until(lambda: job.events("standby_refused") or job.proc.poll() is not None, 60)
    job.trigger.touch()
    assert job.finish() == 0
    [refused] = job.events("standby_refused")
    assert "importing npthreader started 1 thread(s)" in refused["reason"]


def _site_packages(tmp_path: Path, device: str) -> dict:
    """An installed-looking ``fakeheavy`` (with a submodule imported later) and ``fakedevice``, which
    opens the character device ``device`` when imported, as torch_npu opens /dev/davinci*."""
    site = tmp_path / "lib" / "site-packages"
    (site / "fakeheavy").mkdir(parents=True)
    (site / "fakeheavy" / "__init__.py").write_text("VALUE = 1\n")
    (site / "fakeheavy" / "lazy.py").write_text("VALUE = 2\n")
    (site / "fakedevice.py").write_text(f"import os\nFD = os.open({device!r}, os.O_RDWR)\n")
    return {**os.environ, "PYTHONPATH": str(site)}


def test_auto_learns_lazy_imports_and_leaves_out_a_module_that_opens_a_device(tmp_path):
    device = tmp_path / "accel0"
    try:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers: harmless to open
    except PermissionError:
        pytest.skip("cannot create a device node here")
    env = _site_packages(tmp_path, str(device))
    job = Job(tmp_path / "job", "auto", free_port(), "--now", "fakeheavy,fakedevice", "--later", "fakeheavy.lazy",
              env=env, worker=IMPORTER)
    assert wait_until(lambda: any("fakeheavy.lazy" in e["modules"] for e in job.events("standby_ready")
                                  if e["rank"] == 1) or job.proc.poll() is not None, 120)
    assert wait_until(lambda: len({e["rank"] for e in job.events("standby_ready")
                                   if "fakeheavy.lazy" in e["modules"]}) == 2 or job.proc.poll() is not None, 60)
    job.trigger.touch()
    assert job.finish() == 0, (job.root / "stderr.txt").read_text()
    [refused] = job.events("standby_refused")
    assert refused["module"] == "fakedevice" and f"opened {device}" in refused["reason"]
    stderr = (job.root / "stderr.txt").read_text()
    assert stderr.count("warm standbys leave out fakedevice") == 1
    assert [e["ranks"] for e in job.events("standby_start")] == [[0, 1]]
    assert _importer_outputs(job, 1) == [["fakeheavy", "fakeheavy.lazy"]] * 2


def test_a_restart_hands_ready_standbys_over_first_without_entering_the_attempts_cgroup(tmp_path, monkeypatch):
    """Moving the launcher into the attempt's cgroup costs 10-20 ms each way: a rank whose standby is
    ready never needs it (the standby has a cgroup of its own), so those ranks go first, and only the
    cold ones are started inside it."""
    from launcher.jobspec.rankenv import WorkerSpec
    from launcher.supervision.jobtree import JobTree
    from launcher.supervision.procgroup import LocalProcessGroup
    from launcher.supervision.standby import StandbyPool
    from tests.helpers.procs import TOKEN

    script = tmp_path / "rank.py"
    script.write_text("import sys\nsys.exit(0)\n")
    specs = [WorkerSpec(r, r, r, "worker", (sys.executable, str(script)), {"RANK": str(r)}) for r in (0, 1)]
    pool = StandbyPool(("json",), 0, str(tmp_path / "standby"), lambda name, **fields: None)
    group = LocalProcessGroup(lambda spec, attempt: str(tmp_path / f"a{attempt}" / f"r{spec.rank}.log"),
                              lambda spec: False, tree=JobTree(TOKEN, None), standby=pool)
    try:
        pool.prepare(specs[:1])  # rank 0 only
        assert wait_until(lambda: group.wait_event(0.05) is None and pool.ready_ranks() == {0}, 60)
        entered, inside = [], group._tree.inside
        monkeypatch.setattr(group._tree, "inside", lambda name: entered.append((name, sorted(group.pids()))) or
                            inside(name))
        group.start(specs, 1)
        assert entered == [("a1", [0])]  # rank 0 was handed over before the launcher entered, for rank 1
        group.start([WorkerSpec(0, 0, 0, "worker", (sys.executable, str(script)), {"RANK": "0"})], 2)
        assert entered == [("a1", [0])] + [("a2", [])]  # no standby ready (the next one comes later): cold
    finally:
        group.ensure_gone(5, final=True)
        group.close()


STORE_HOST = str(REPO / "tests" / "workers" / "store_host.py")


def _store_job(tmp_path, *args):
    """The store-host job of 3 ranks, its restart from standbys; (listen time, other ranks' starts)."""
    job = Job(tmp_path / "job", "json", free_port(), *args, nproc=3, worker=STORE_HOST)
    job.go_when_ready(3)
    assert job.finish() == 0, job.stderr
    assert sorted(e["ranks"] for e in job.events("standby_start")) == [[0, 1, 2]]
    lines = [line.split() for line in (job.out / "starts").read_text().splitlines()]
    listened = float(next(t for rank, what, t in lines if what == "listen"))
    others = [float(t) for rank, what, t in lines if what == "start" and rank != "0"]
    assert len(others) == 2, lines
    return job, listened, others


def test_rank_0_from_its_standby_listens_before_the_others_are_handed_over(tmp_path):
    """Rank 0 hosts the rendezvous (torch's TCPStore at MASTER_PORT: it listened in attempt 0) and
    takes 50 ms to listen after its hand-over: the other ranks' standbys are handed over only once it
    does, so their connection is not refused (torch's client would back off 0.5-1.5 s)."""
    _job, listened, others = _store_job(tmp_path)
    assert min(others) >= listened


def test_a_rank_0_that_hosted_nothing_before_is_not_waited_for(tmp_path):
    """Rank 0 did not listen in attempt 0 (no store there, as with most non-torch scripts): the
    hand-over does not wait for it, so the others start before it listens 50 ms later."""
    _job, listened, others = _store_job(tmp_path, "--no-store-first")
    assert max(others) < listened


def test_a_rendezvous_host_that_listens_late_is_waited_for_only_briefly(tmp_path):
    """Rank 0 listens 1 s after its hand-over: the others are handed over after the wait's bound
    (0.1 s), not after that second, and the launcher says so once."""
    job, listened, others = _store_job(tmp_path, "--host-delay", "1.0")
    assert max(others) < listened - 0.5
    assert job.stderr.count("did not listen on port") == 1, job.stderr
