"""Side by side with the real torchrun and msrun: the same probe script, the same questions.

``tests/workers/env_probe.py`` dumps what each process got (environment, argv, cwd, whether each
printed line reaches the reader at once) and fails the way it is told. It runs under the installed
``torchrun --standalone --nproc-per-node 2`` and ``msrun --worker_num 2 --local_worker_num 2 --join
True``, and under ``launcher run --nproc-per-node 2``; the tests compare what the ranks get and what
the user sees: exit status, the ranks' lines on the console, the failure summary.

Every variable either tool gives a rank is classified below: equal, or different by design with the
reason. A variable the tool starts setting that is in neither list fails the test, so the tables
stay complete. Neither tool runs with ``PYTHONUNBUFFERED`` in its environment, so buffering is each
tool's own doing.
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
from tests.helpers.launch import launcher_command
from tests.helpers.procs import free_port

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests" / "workers" / "env_probe.py")
BIN = Path(sys.executable).parent
TORCHRUN = BIN / "torchrun"
MSRUN = BIN / "msrun"
NPROC = 2
OUT = "out"  # the probes' dump directory, relative to the tool's working directory

pytestmark = pytest.mark.slow

# ----------------------------------------------------------------------------- torchrun's variables
#: Variables a rank gets with the same value under torchrun and the launcher.
TORCHRUN_EQUAL = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
#: Variables set by both whose values differ by design, and why (each is checked for its property).
TORCHRUN_BY_DESIGN = {
    "MASTER_ADDR": "--standalone says localhost; the launcher's one-node table says 127.0.0.1: the same "
                   "loopback address without a name lookup",
    "MASTER_PORT": "--standalone picks a free port; the launcher uses --master-port (default 29500)",
    "TORCHELASTIC_RUN_ID": "torchrun draws a uuid4; the launcher uses --run-id, MINDX_TASK_ID or its own id",
    "TORCHELASTIC_USE_AGENT_STORE": "True under torchrun, whose agent hosts the TCPStore; the launcher "
                                    "runs no store, so it says False and rank 0 hosts it",
    "TORCHELASTIC_ERROR_FILE": "a file in torchrun's temp dir vs in the launcher's log dir; both one per "
                               "rank and attempt, in an existing directory",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "the signals the agent stops the job on: torchrun's SIGTERM,SIGINT,"
                                      "SIGHUP,SIGQUIT, the launcher's SIGTERM,SIGINT,SIGHUP",
}
#: Variables only torchrun's ranks see, and why the launcher does not set them.
TORCHRUN_ONLY: dict = {}

# ----------------------------------------------------------------------------- the launcher's additions
#: Variables the launcher gives a rank on top of the tool's, by design (README, "What each rank gets"):
#: the legacy Ascend contract, so one script runs under the MindX scripts and torchrun alike, and the
#: launcher's own. GROUP_INFO_FILE (only with --group-info-root) and MS_ENABLE_GRACEFUL_EXIT (only
#: with --graceful-exit) are deliberately absent: a plain job must not get them.
LAUNCHER_ADDS = ("RANK_ID", "RANK_SIZE", "DEVICE_ID", "ASCEND_DEVICE_ID", "DEVICE_NUM", "SERVER_ID", "SERVER_NUM",
                 "JOB_ID", "PYTHONUNBUFFERED", "LAUNCHER_RUN_DIR", "LAUNCHER_ATTEMPT", "LAUNCHER_PHYSICAL_DEVICE_ID",
                 "LAUNCHER_GRACEFUL_EXIT_FILE", "LAUNCHER_GASP_SAVE_ALLOWED",
                 # breakpoint() in a rank without the terminal: a hint, not a BdbQuit (README "Debugging a rank")
                 "PYTHONBREAKPOINT", "PYTHONPATH",
                 # finds the job's processes that left their process group (docs/process-tree.md)
                 "LAUNCHER_JOB_TOKEN",
                 # where the rank hooks record the modules the ranks import, for --preload auto
                 # (docs/warm-standby.md)
                 "LAUNCHER_IMPORTS_FILE")
#: On top of LAUNCHER_ADDS for MindSpore: the Ascend Operator's names for what msrun passes on its command
#: line, LOCAL_RANK, and torch's error file (set for every framework; harmless without torch).
LAUNCHER_ADDS_MS = ("LOCAL_RANK", "MS_LOCAL_WORKER", "MS_NODE_RANK", "MS_SERVER_NUM", "TORCHELASTIC_ERROR_FILE")


def launcher_extras(ours: dict, theirs: dict) -> set:
    """Variables the launcher's rank has that the tool's has not (neither from the common base)."""
    base = tool_env()
    return {k for k, v in ours.items() if k not in theirs and base.get(k) != v}


# ----------------------------------------------------------------------------- msrun's variables
#: Variables a worker gets with the same value under msrun and the launcher.
MSRUN_WORKER_EQUAL = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_NODE_ID",
                      "RANK_ID", "RANK_SIZE", "DEVICE_ID", "MS_TOPO_TIMEOUT")
#: Variables the scheduler gets with the same value under both (msrun's scheduler has RANK_ID 0).
MSRUN_SCHED_EQUAL = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "RANK_ID", "RANK_SIZE",
                     "MS_TOPO_TIMEOUT")
#: Variables msrun's processes see only because msrun itself imported mindspore, which sets them at
#: import (checked by ``test_msrun_only_variables_come_from_importing_mindspore``): a script that
#: imports mindspore sets them in its own process under any launcher.
MSRUN_IMPORT_SIDE_EFFECTS = ("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "LD_LIBRARY_PATH", "HCCL_CONNECT_TIMEOUT",
                             "OMP_NUM_THREADS")

#: Exit status per probe mode: (the tool's, the launcher's). torchrun and msrun exit 1 for any
#: failed rank; the launcher exits with the failing rank's code, 128+N for signal N (README, "Exit
#: codes"), so an operator sees the rank's own status.
EXIT_STATUS = {"ok": (0, 0), "exit3": (1, 3), "kill": (1, 128 + 9), "raise": (1, 1), "record-raise": (1, 1)}

PROBE_TEXT = r"probe rank (\w+) (?:started|done|failing with [\w-]+)"
#: A console line of the launcher: the prefix, then exactly one probe message (whole lines only).
PREFIXED_LINE = re.compile(rf"^\[(rank \d+|scheduler)\] ({PROBE_TEXT})$")
LAUNCHER_LINE = re.compile(r"^\[launcher(?: \w+)?\] \d\d:\d\d:\d\d (.*)$")


@dataclass
class Run:
    """One tool's run of the probe: exit status, console output and each process's dump."""

    returncode: int
    stdout: str
    stderr: str
    dumps: Dict[str, dict]
    cwd: str

    def probe_messages(self) -> List[str]:
        """Every probe message the user saw on either stream, sorted, wherever it sits in a line.

        torchrun's ranks write to one shared terminal: with ``python -u`` a print's text and its
        newline are two writes, so two ranks' lines can merge (``probe rank 0 startedprobe rank 1
        started`` was seen), which is why messages are found anywhere, not line by line.
        """
        return sorted(m.group(0) for m in re.finditer(PROBE_TEXT, self.stdout + self.stderr))

    def prefixed_messages(self) -> List[str]:
        """The probe messages on the launcher's stdout, each a whole line with its own rank's prefix."""
        found = []
        for line in self.stdout.splitlines():
            match = PREFIXED_LINE.match(line)
            assert match or "probe rank" not in line, f"{line!r}: not one whole prefixed line"
            if match:
                label, text, rank = match.groups()
                assert label == ("scheduler" if rank == "sched" else f"rank {rank}"), f"{line!r}: wrong prefix"
                found.append(text)
        return sorted(found)

    def launcher_lines(self) -> List[str]:
        """The launcher's own lines (stderr), without the ``[launcher LEVEL] HH:MM:SS `` prefix."""
        return [m.group(1) for m in map(LAUNCHER_LINE.match, self.stderr.splitlines()) if m]


def tool_env() -> Dict[str, str]:
    """The environment every tool starts with: the venv activated (msrun runs ``python`` from PATH),
    without PYTHONUNBUFFERED, and without anything either tool sets (another test in this process
    may have imported mindspore, which sets some of them)."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONUNBUFFERED" and k not in TORCHRUN_EQUAL + tuple(TORCHRUN_BY_DESIGN) + MSRUN_IMPORT_SIDE_EFFECTS
           and not k.startswith(("MS_", "LAUNCHER_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(BIN), env.get("PATH")]))
    return env


def run_probe(argv: Sequence[str], out: Path, timeout: float = 180) -> Run:
    """Run a tool over the probe in ``out``'s parent; collect every process's dump from ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(list(argv), cwd=str(out.parent), env=tool_env(), capture_output=True, text=True,
                          timeout=timeout)
    dumps = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return Run(proc.returncode, proc.stdout, proc.stderr, dumps, str(out.parent))


def probe_args(mode: str) -> List[str]:
    """The probe's command line; ``--out`` is relative, so every tool's ranks get the same argv."""
    return [PROBE, "--out", OUT, "--mode", mode, "--ranks", str(NPROC)]


def launcher_argv(tmp: Path, options: Sequence[str], command: Sequence[str]) -> List[str]:
    return launcher_command("run", "--nproc-per-node", str(NPROC), "--run-dir", str(tmp / "run"), "--log-dir",
                            str(tmp / "logs"), *options, "--", *command)


def cached_runs(tmp_path_factory, prefix: str, argv_for):
    """``get(tool, mode) -> Run``, each run once per module (the real tools cost seconds per start).

    ``argv_for(tool, mode, tmp)`` gives the command line; the run's files live in ``tmp``.
    """
    cache = {}

    def get(tool: str, mode: str) -> Run:
        if (tool, mode) not in cache:
            tmp = tmp_path_factory.mktemp(f"{prefix}{tool}-{mode}")
            cache[tool, mode] = run_probe(argv_for(tool, mode, tmp), tmp / OUT)
        return cache[tool, mode]

    return get


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory):
    """torchrun and ``launcher run`` over the probe, per mode."""
    def argv_for(tool: str, mode: str, tmp: Path) -> List[str]:
        if tool == "torchrun":
            return [str(TORCHRUN), "--standalone", "--nproc-per-node", str(NPROC), *probe_args(mode)]
        return launcher_argv(tmp, [], [sys.executable, *probe_args(mode)])

    return cached_runs(tmp_path_factory, "", argv_for)


# =============================================================================== torchrun

def test_torchrun_variables(torch_runs):
    """Every variable torchrun gives a rank: the same value under the launcher, or a known difference."""
    theirs, ours = torch_runs("torchrun", "ok"), torch_runs("launcher", "ok")
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr
    base = tool_env()
    for rank in map(str, range(NPROC)):
        t_env, o_env = theirs.dumps[rank]["env"], ours.dumps[rank]["env"]
        added = {k for k, v in t_env.items() if base.get(k) != v}
        unclassified = added - set(TORCHRUN_EQUAL) - set(TORCHRUN_BY_DESIGN) - set(TORCHRUN_ONLY)
        assert not unclassified, f"torchrun sets {sorted(unclassified)}: classify them"
        assert {k: o_env.get(k) for k in TORCHRUN_EQUAL} == {k: t_env.get(k) for k in TORCHRUN_EQUAL}
        for name in TORCHRUN_BY_DESIGN:
            assert name in t_env and name in o_env, name
        for name in TORCHRUN_ONLY:
            assert name in t_env and name not in o_env, name
        assert launcher_extras(o_env, t_env) <= set(LAUNCHER_ADDS), sorted(launcher_extras(o_env, t_env))
        for env in (t_env, o_env):
            assert socket.gethostbyname(env["MASTER_ADDR"]) == "127.0.0.1"
            assert 0 < int(env["MASTER_PORT"]) < 65536
            assert os.path.isdir(os.path.dirname(env["TORCHELASTIC_ERROR_FILE"]))
        assert (t_env["TORCHELASTIC_USE_AGENT_STORE"], o_env["TORCHELASTIC_USE_AGENT_STORE"]) == ("True", "False")
    for run in (theirs, ours):
        files = {run.dumps[str(r)]["env"]["TORCHELASTIC_ERROR_FILE"] for r in range(NPROC)}
        assert len(files) == NPROC, "one error file per rank"
        run_ids = {run.dumps[str(r)]["env"]["TORCHELASTIC_RUN_ID"] for r in range(NPROC)}
        assert len(run_ids) == 1, "one run id for the job"


def test_torchrun_process_view(torch_runs):
    """argv, cwd, and unbuffered output (torchrun runs ``python -u``; the launcher PYTHONUNBUFFERED=1)."""
    theirs, ours = torch_runs("torchrun", "ok"), torch_runs("launcher", "ok")
    for rank in map(str, range(NPROC)):
        t, o = theirs.dumps[rank], ours.dumps[rank]
        assert t["argv"] == o["argv"] == probe_args("ok")
        assert (t["cwd"], o["cwd"]) == (theirs.cwd, ours.cwd)
        assert t["stdout_flushes_lines"] is True
        assert o["stdout_flushes_lines"] is True, "a rank's print() must reach the console (and log) at once"


@pytest.mark.parametrize("mode", sorted(EXIT_STATUS))
def test_torchrun_exit_status_and_console(torch_runs, mode):
    """Same lines from the ranks on the console; exit status as documented for each tool."""
    theirs, ours = torch_runs("torchrun", mode), torch_runs("launcher", mode)
    assert (theirs.returncode, ours.returncode) == EXIT_STATUS[mode], ours.stderr
    # torchrun's ranks share its stdout/stderr; the launcher tees each rank's output to stdout with a
    # [rank N] prefix (by design: one ordered stream per rank, as in its log file).
    assert ours.prefixed_messages() == theirs.probe_messages()
    assert "probe rank 1 started" in theirs.probe_messages()


def torchrun_root_cause(run: Run) -> Dict[str, str]:
    """The fields of torchrun's "Root Cause (first observed failure)" block, traceback as lines."""
    block = run.stderr.split("Root Cause (first observed failure):", 1)[1].split("=" * 20, 1)[0]
    fields, key = {}, None
    for line in block.splitlines()[2:]:
        match = re.match(r"^  (\w+)\s*: (.*)$", line)
        if key == "traceback":  # the last field: the rest of the block, whatever it looks like
            fields[key] += "\n" + line
        elif match:
            key, value = match.groups()
            fields[key] = value
    return fields


def launcher_summary(run: Run) -> List[str]:
    lines = run.launcher_lines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job failed after"))
    return lines[start:]


def summary_traceback(summary: Sequence[str]) -> List[str]:
    """The traceback lines of the launcher's summary, indentation removed."""
    start = next(i for i, line in enumerate(summary) if line.startswith("traceback (from "))
    body = []
    for line in summary[start + 1:]:
        if not line.startswith("    "):
            break
        body.append(line.strip())
    return body


@pytest.mark.parametrize("mode, how", [("exit3", "exit code 3"), ("kill", "killed by SIGKILL")])
def test_failure_summary_names_the_rank_and_how(torch_runs, mode, how):
    theirs, ours = torch_runs("torchrun", mode), torch_runs("launcher", mode)
    cause = torchrun_root_cause(theirs)
    assert cause["rank"] == "1 (local_rank: 1)"
    assert cause["exitcode"].split()[0] == ("3" if mode == "exit3" else "-9")
    summary = launcher_summary(ours)
    assert f"first failure of the last attempt was rank 1 ({how})" in summary[0]


def test_failure_summary_shows_the_recorded_exception(torch_runs):
    """With torch's @record both summaries show the traceback from the rank's error file, line for line."""
    theirs, ours = torch_runs("torchrun", "record-raise"), torch_runs("launcher", "record-raise")
    cause = torchrun_root_cause(theirs)
    assert cause["error_file"].endswith("error.json")
    their_tb = [line.strip() for line in cause["traceback"].splitlines() if line.strip()]
    summary = launcher_summary(ours)
    assert "exception: ValueError: probe failure on rank 1" in summary
    assert any(line.startswith("traceback (from ") and line.endswith("rank_1_error.json):") for line in summary)
    assert summary_traceback(summary) == their_tb


def test_failure_summary_without_record_reads_the_log(torch_runs):
    """Without @record torchrun's summary only points at its docs; the launcher's shows the traceback
    the rank printed (the same lines torchrun's console shows)."""
    theirs, ours = torch_runs("torchrun", "raise"), torch_runs("launcher", "raise")
    assert "To enable traceback see" in torchrun_root_cause(theirs)["traceback"]
    printed = theirs.stderr.split("Traceback (most recent call last):", 1)[1]
    printed = ["Traceback (most recent call last):"] + [
        line.strip() for line in printed.split("ValueError: probe failure on rank 1", 1)[0].splitlines() if line.strip()
    ] + ["ValueError: probe failure on rank 1"]
    summary = launcher_summary(ours)
    assert "exception: ValueError: probe failure on rank 1" in summary
    assert summary_traceback(summary) == printed


def test_torchrun_command_line_works_unchanged(tmp_path, torch_runs):
    """A torchrun command line (underscored options, the script without ``python``) runs as is."""
    run = run_probe(launcher_command("run", "--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs"),
                                     "--standalone", "--nproc_per_node", str(NPROC), *probe_args("ok")),
                    tmp_path / OUT)
    assert run.returncode == 0, run.stderr
    theirs = torch_runs("torchrun", "ok")
    for rank in map(str, range(NPROC)):
        assert run.dumps[rank]["argv"] == theirs.dumps[rank]["argv"] == probe_args("ok")
        assert {k: run.dumps[rank]["env"].get(k) for k in TORCHRUN_EQUAL} == \
            {k: theirs.dumps[rank]["env"].get(k) for k in TORCHRUN_EQUAL}
    assert run.prefixed_messages() == theirs.probe_messages()


# =============================================================================== msrun

@pytest.fixture(scope="module")
def ms_runs(tmp_path_factory):
    """``{(tool, mode): Run}`` for msrun and ``launcher run --framework mindspore``, each run once."""
    if importlib.util.find_spec("mindspore") is None:  # not imported here: it changes os.environ
        pytest.skip("mindspore is not installed")
    ports = {}

    def argv_for(tool: str, mode: str, tmp: Path) -> List[str]:
        port = ports.setdefault(mode, str(free_port()))  # the same for both tools, run one after the other
        if tool == "msrun":
            return [str(MSRUN), "--worker_num", str(NPROC), "--local_worker_num", str(NPROC), "--master_port",
                    port, "--join", "True", "--log_dir", str(tmp / "mslogs"), *probe_args(mode)]
        return launcher_argv(tmp, ["--framework", "mindspore", "--master-port", port],
                             [sys.executable, *probe_args(mode)])

    return cached_runs(tmp_path_factory, "ms-", argv_for)


def test_msrun_variables(ms_runs):
    """Workers and the scheduler: msrun's variables with msrun's values."""
    theirs, ours = ms_runs("msrun", "ok"), ms_runs("launcher", "ok")
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr
    assert sorted(theirs.dumps) == sorted(ours.dumps) == ["0", "1", "sched"]
    base = tool_env()
    for name, equal in [("0", MSRUN_WORKER_EQUAL), ("1", MSRUN_WORKER_EQUAL), ("sched", MSRUN_SCHED_EQUAL)]:
        t_env, o_env = theirs.dumps[name]["env"], ours.dumps[name]["env"]
        added = {k for k, v in t_env.items() if base.get(k) != v}
        unclassified = added - set(equal) - set(MSRUN_IMPORT_SIDE_EFFECTS)
        assert not unclassified, f"msrun sets {sorted(unclassified)} for {name}: classify them"
        assert {k: o_env.get(k) for k in equal} == {k: t_env.get(k) for k in equal}, name
        extras = launcher_extras(o_env, t_env) - set(MSRUN_IMPORT_SIDE_EFFECTS)
        assert extras <= set(LAUNCHER_ADDS + LAUNCHER_ADDS_MS), (name, sorted(extras))
        assert theirs.dumps[name]["argv"] == ours.dumps[name]["argv"] == probe_args("ok")
        assert (theirs.dumps[name]["cwd"], ours.dumps[name]["cwd"]) == (theirs.cwd, ours.cwd)


def test_msrun_only_variables_come_from_importing_mindspore(tmp_path):
    """msrun's processes inherit what ``import mindspore`` set in msrun; check it is exactly that."""
    code = ("import json, os, subprocess, sys, mindspore\n"
            "print(subprocess.run([sys.executable, '-c', 'import json, os; print(json.dumps(dict(os.environ)))'],"
            " capture_output=True, text=True).stdout)")
    proc = subprocess.run([sys.executable, "-c", code], env=tool_env(), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=120)
    child = json.loads(proc.stdout)
    base = tool_env()
    assert sorted(k for k, v in child.items() if base.get(k) != v) == sorted(MSRUN_IMPORT_SIDE_EFFECTS)


def test_msrun_exit_status_and_console(ms_runs):
    """A worker exiting 3: msrun exits 1 and the launcher 3 (documented); the same worker lines shown."""
    theirs, ours = ms_runs("msrun", "exit3"), ms_runs("launcher", "exit3")
    assert (theirs.returncode, ours.returncode) == EXIT_STATUS["exit3"], ours.stderr
    # msrun tails the workers' log files to the console, not the scheduler's; the launcher shows the
    # scheduler's output too, as [scheduler] lines.
    workers = theirs.probe_messages()
    assert not [m for m in workers if m.startswith("probe rank sched")]
    assert [m for m in ours.prefixed_messages() if not m.startswith("probe rank sched")] == workers
    assert "probe rank 1 failing with exit3" in workers
    assert "first failure of the last attempt was rank 1 (exit code 3)" in launcher_summary(ours)[0]
