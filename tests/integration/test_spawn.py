"""How a rank's process is started (launcher.supervision.spawn): through ``setpriv --pdeathsig KILL``
(vfork, no Python in the child) where that starts the same process as the ``preexec_fn`` path, and
through the ``preexec_fn`` path everywhere else, with the same errors as before."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.jobspec.rankenv import WorkerSpec
from launcher.supervision.procgroup import LocalProcessGroup, RankExited
from launcher.supervision.spawn import Spawner, execs_directly
from tests.helpers.procs import pid_alive, wait_until

PROBE = str(Path(__file__).resolve().parents[1] / "workers" / "start_probe.py")
SETPRIV = Spawner().usable()
needs_setpriv = pytest.mark.skipif(not SETPRIV, reason="no setpriv with --pdeathsig on this machine")


def _script(path: Path, text: str, mode: int = 0o755) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_which_programs_exec_directly(tmp_path):
    env = {"PATH": f"{tmp_path / 'bin'}:{os.defpath}"}
    (tmp_path / "bin").mkdir()
    assert execs_directly(os.path.realpath(sys.executable), env)  # an ELF binary
    assert execs_directly(_script(tmp_path / "bin" / "good", "#!/bin/sh\nexit 0\n"), env)
    assert execs_directly("good", env)  # found on the environment's PATH
    assert not execs_directly(_script(tmp_path / "plain", "exit 0\n"), env)  # execvp would hand it to sh
    assert not execs_directly(_script(tmp_path / "gone", "#!/nonexistent/sh\n"), env)  # ENOENT from exec
    assert not execs_directly(_script(tmp_path / "relative", "#!sh\n"), env)
    assert not execs_directly(_script(tmp_path / "notexec", "#!/bin/sh\n", 0o644), env)
    assert not execs_directly(str(tmp_path / "missing"), env)
    assert not execs_directly("no-such-program-here", env)
    assert not execs_directly(str(tmp_path / "bin"), env)  # a directory


@pytest.mark.parametrize("make", [lambda d: str(d / "missing"), lambda d: _script(d / "plain", "exit 0\n"),
                                  lambda d: _script(d / "gone", "#!/nonexistent/sh\n")],
                         ids=["missing", "no-shebang", "no-interpreter"])
@pytest.mark.parametrize("setpriv", [None, ""], ids=["preexec", "setpriv"])
def test_a_program_that_cannot_exec_raises_as_before(tmp_path, make, setpriv):
    """Popen's OSError, whichever way the launcher starts ranks (setpriv would exit 127 or run sh)."""
    program = make(tmp_path)
    with pytest.raises(OSError) as plain:
        subprocess.Popen([program], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with pytest.raises(OSError) as ours:
        Spawner(setpriv).popen([program], dict(os.environ), {"stdout": subprocess.DEVNULL}, None)
    assert (type(ours.value), ours.value.errno) == (type(plain.value), plain.value.errno)


def test_a_setpriv_without_pdeathsig_is_not_used():
    spawner = Spawner("/bin/false")  # exits 1, as setpriv before util-linux 2.33 does on --pdeathsig
    assert not spawner.usable()


def _probe_ranks(tmp_path: Path, spawner: Spawner, name: str) -> dict:
    out = tmp_path / name
    out.mkdir()
    group = LocalProcessGroup(lambda spec, attempt: str(tmp_path / f"{name}-r{spec.rank}.log"), lambda spec: False,
                              spawner=spawner)
    specs = [WorkerSpec(r, r, r, "worker", (sys.executable, PROBE, "--out", str(out)), {"RANK": str(r)})
             for r in (0, 1)]
    try:
        group.start(specs, 0)
        events = [group.wait_event(20) for _ in specs]
        assert sorted((e.rank, e.info.returncode) for e in events if isinstance(e, RankExited)) == [(0, 0), (1, 0)]
    finally:
        group.ensure_gone(5)
        group.close()
    return {r: json.loads((out / f"0-{r}.json").read_text()) for r in (0, 1)}


def _normalise(value, tmp_path: Path, name: str):
    text = json.dumps(value, sort_keys=True).replace(str(tmp_path / name), "<out>")
    text = text.replace(f"{tmp_path}/{name}-r", "<log>")
    text = re.sub(r"(LAUNCHER_JOB_TOKEN[=\"': ]+)[0-9a-f]+\.[\w-]+", r"\1<token>", text)
    text = re.sub(r"pipe:\[\d+\]", "pipe", text)
    text = re.sub(r" at 0x[0-9a-f]+", "", text)
    return json.loads(text)


@needs_setpriv
def test_a_rank_started_through_setpriv_is_the_rank_preexec_fn_starts(tmp_path):
    """Environment (Python's, libc's, /proc's), argv, signal dispositions and mask, session, process
    group, parent-death signal, cwd, umask, stdio, open fds, threads: all the same."""
    fast, plain = Spawner(), Spawner(None)
    assert fast.usable() and fast._execs_directly(sys.executable, os.environ)  # the setpriv path is taken
    a, b = _probe_ranks(tmp_path, fast, "fast"), _probe_ranks(tmp_path, plain, "plain")
    for rank in (0, 1):
        x, y = _normalise(a[rank], tmp_path, "fast"), _normalise(b[rank], tmp_path, "plain")
        assert x.keys() == y.keys()
        for field in sorted(x):
            assert x[field] == y[field], f"rank {rank}: {field} differs"
        assert x["pdeathsig"] == signal.SIGKILL and x["session_leader"] and x["threads"] == 1


@pytest.mark.parametrize("setpriv", [None, ""], ids=["preexec", "setpriv"])
def test_a_rank_dies_with_its_launcher(tmp_path, setpriv):
    """The parent-death signal, and nothing else (no orphan guard here): SIGKILL the parent, the rank goes."""
    if setpriv == "" and not SETPRIV:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    pid_file = tmp_path / "pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        from launcher.supervision.spawn import Spawner
        proc = Spawner({setpriv!r}).popen([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                                          {{}}, None)
        open({str(pid_file)!r}, "w").write(str(proc.pid))
        time.sleep(60)
        """)], cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), 20)
        rank = int(pid_file.read_text())
        assert pid_alive(rank)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: not pid_alive(rank), 10)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait(10)
