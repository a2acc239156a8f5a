"""A stop is always a stop with the gasp, even when the launcher itself fails (issue #27.1).

Before the one reader, a bad coordination record raised OverflowError or RecursionError in the
supervisor's loop: the launcher died and its ranks were killed without the save signal. The readers
no longer raise, but the next bug must not cost the ranks their save either. Here a bug is injected
(``sitecustomize``: the launcher's ``_on_spawned`` raises once every rank is up): each rank must get
SIGTERM (its ``.term`` record) and nothing of the job may be left.
"""

import sys
import textwrap

from tests.helpers.launch import Launcher

RANKS = 2

INJECT = """
import os, time
from launcher.run import session

original = session.Session._on_spawned


def failing(self, attempt, pids):
    original(self, attempt, pids)
    ready = os.environ["INJECT_READY_FILE"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # every rank is up and has its SIGTERM handler
        if os.path.exists(ready) and len(open(ready).read().splitlines()) >= {ranks}:
            break
        time.sleep(0.01)
    raise RuntimeError("injected launcher bug")


session.Session._on_spawned = failing
"""


def test_a_launcher_bug_still_gives_the_ranks_the_gasp(tmp_path, monkeypatch):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(INJECT.format(ranks=RANKS)))
    job = Launcher(tmp_path / "job")
    monkeypatch.setenv("PYTHONPATH", f"{hooks}:{':'.join(p for p in sys.path if p)}")
    monkeypatch.setenv("INJECT_READY_FILE", str(job.ready))
    code = job.run(["--nproc-per-node", str(RANKS), "--gasp-timeout", "20"], ["--term-delay", "0.2"], timeout=60)
    assert code != 0 and "injected launcher bug" in job.stderr, job.stderr
    assert "SIGTERM to 2 rank(s), 20 s to save" in job.stderr, job.stderr
    terms = job.ready_lines(".term")
    assert sorted(int(line[0]) for line in terms) == list(range(RANKS)), job.stderr
    assert [e["source"] for e in job.events("gasp")] == ["launcher-error"]
