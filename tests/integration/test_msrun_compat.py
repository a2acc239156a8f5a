"""An msrun command line works after changing the program name: the real msrun (MindSpore 2.10) and
``launcher run`` with msrun's own options, on the same probe and the same MindSpore script.

The probe (``tests/workers/env_probe.py``) dumps what each process got; the variables msrun gives are
compared as in test_side_by_side.py, now reached through msrun's spellings (``--worker_num``,
``--cluster_time_out``, ``--rank_table_file``, ...), which imply ``--framework mindspore``. A MindSpore
script started without them fails in ``init()``; the launcher then says what to add.
"""

import importlib.util
from pathlib import Path
from typing import List

import pytest

from tests.helpers.launch import launcher_command

from tests.integration.test_side_by_side import (MSRUN, MSRUN_SCHED_EQUAL, MSRUN_WORKER_EQUAL, OUT, free_port,
                                                 launcher_summary, probe_args, run_probe)

pytestmark = pytest.mark.slow

INIT_SCRIPT = """\
import os
from mindspore.communication import init, get_rank, get_group_size
init()
print(f"rank {get_rank()} of {get_group_size()}", flush=True)
"""


@pytest.fixture(scope="module", autouse=True)
def _needs_msrun():
    if importlib.util.find_spec("mindspore") is None or not MSRUN.exists():
        pytest.skip("mindspore / msrun is not installed")


def msrun_options(tmp: Path, port: str) -> List[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    table = tmp / "hccl.json"
    table.write_text("{}")
    return ["--worker_num", "2", "--local_worker_num", "2", "--master_port", port, "--join", "True", "--log_dir",
            str(tmp / "mslogs"), "--cluster_time_out", "60", "--rank_table_file", str(table)]


def launcher_run(tmp: Path, *options: str) -> List[str]:
    return launcher_command("run", "--run-dir", str(tmp / "run"), *options)


def test_msrun_command_line_gives_the_ranks_what_msrun_gives(tmp_path):
    port = str(free_port())
    theirs = run_probe([str(MSRUN), *msrun_options(tmp_path / "t", port), *probe_args("ok")], tmp_path / "t" / OUT)
    ours = run_probe(launcher_run(tmp_path / "o", *msrun_options(tmp_path / "o", port), *probe_args("ok")),
                     tmp_path / "o" / OUT)
    assert theirs.returncode == ours.returncode == 0, ours.stderr
    assert sorted(theirs.dumps) == sorted(ours.dumps) == ["0", "1", "sched"]
    for name, equal in [("0", MSRUN_WORKER_EQUAL), ("1", MSRUN_WORKER_EQUAL), ("sched", MSRUN_SCHED_EQUAL)]:
        t_env, o_env = theirs.dumps[name]["env"], ours.dumps[name]["env"]
        assert {k: o_env.get(k) for k in equal} == {k: t_env.get(k) for k in equal}, name
        assert t_env["MS_TOPO_TIMEOUT"] == o_env["MS_TOPO_TIMEOUT"] == "60"
        assert o_env["RANK_TABLE_FILE"].endswith("hccl.json") and t_env["RANK_TABLE_FILE"].endswith("hccl.json")
        assert theirs.dumps[name]["argv"] == ours.dumps[name]["argv"] == probe_args("ok")
    # msrun's --log_dir holds worker_<r>.log; the launcher's the same output under its own layout
    assert sorted(p.name for p in (tmp_path / "t" / "mslogs").glob("worker_*.log")) == ["worker_0.log",
                                                                                        "worker_1.log"]
    assert len(list((tmp_path / "o" / "mslogs").rglob("rank_*.log"))) == 2
    assert "msrun's options: --framework mindspore" in ours.stderr


def test_a_mindspore_script_without_msrun_options_says_what_to_add(tmp_path):
    """Without MindSpore's variables ``init()`` raises "... without using 'mpirun'"; with msrun's options
    the same script runs, as under msrun."""
    work = tmp_path / OUT
    work.mkdir()
    script = tmp_path / "net.py"
    script.write_text(INIT_SCRIPT)
    bare = run_probe(launcher_run(tmp_path, "--nproc-per-node", "1", str(script)), work)
    assert bare.returncode == 1
    assert "add --framework mindspore (msrun's options, e.g. --worker_num, imply it)" in "\n".join(
        launcher_summary(bare))
    ours = run_probe(launcher_run(tmp_path, "--worker_num=1", "--local_worker_num=1", str(script)), work)
    theirs = run_probe([str(MSRUN), "--worker_num=1", "--local_worker_num=1", "--master_port", str(free_port()),
                        "--join=True", "--log_dir", str(tmp_path / "mslogs"), str(script)], work)
    assert ours.returncode == theirs.returncode == 0, ours.stderr
    assert "[rank 0] rank 0 of 1" in ours.stdout.splitlines()
    assert "rank 0 of 1" in theirs.stdout + (tmp_path / "mslogs" / "worker_0.log").read_text()
