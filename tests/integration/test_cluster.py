"""Following the cluster with real processes: reset.json (written like a ConfigMap volume), a
rewritten rank table, and the TaskD manager across two simulated nodes.

TaskD is proprietary and not installable: these tests use the stand-in package under
``tests/stubs/taskd``, which implements the documented API surface and records its calls.
"""

import json
import os
import signal
import time

import pytest

from tests.helpers.configmap import ConfigMapDir
from tests.helpers.taskd_stub import STUBS, build_libtaskd
from tests.helpers.procs import free_port, wait_until
from tests.helpers.launch import Launcher, wait_all


def reset(ranks=None, retry=0, flushing=False, graceful=0):
    return json.dumps({"RankList": [{"RankId": r, "Status": s} for r, s in (ranks or {}).items()],
                       "UpdateTime": int(time.time()), "RetryTime": retry, "FaultFlushing": flushing,
                       "GracefulExit": graceful, "RestartFaultProcess": False})


@pytest.fixture
def configmap(tmp_path):
    return ConfigMapDir(tmp_path / "reset-config", {"reset.json": reset()})


def start(launcher, configmap, *extra):
    return launcher.start(["--nproc-per-node", "2", "--reset-json", configmap.path("reset.json"), *extra],
                          ["--poll-exit"])


def attempt_ready(launcher, attempt, count=2, timeout=30):
    assert wait_until(lambda: len([l for l in launcher.ready_lines() if l[1] == str(attempt)]) >= count, timeout), \
        launcher.stderr


def test_fault_then_recovered_restarts_then_graceful_exit(launcher, configmap):
    start(launcher, configmap)
    attempt_ready(launcher, 0)
    configmap.write("reset.json", reset({1: "unrecovered"}, retry=0))
    assert wait_until(lambda: launcher.events("cluster_hold"), 10), launcher.stderr
    assert [e["reason"] for e in launcher.events("stop_group")][0].startswith("reset.json")
    time.sleep(0.3)
    assert not [l for l in launcher.ready_lines() if l[1] == "1"]  # held: nothing restarted yet
    configmap.write("reset.json", reset({1: "recovered"}, retry=0))
    attempt_ready(launcher, 1)
    configmap.write("reset.json", reset({1: "recovered"}, retry=0, graceful=1))
    assert launcher.wait(20) == 0
    assert len(launcher.ready_lines(".exit")) == 2  # both ranks honoured the graceful-exit file
    restarts = launcher.events("restart")
    assert [(e["scope"], e["reason"]) for e in restarts] == [("cluster", "fault")]


def test_retry_time_bump_restarts_the_group(launcher, configmap):
    start(launcher, configmap, "--max-restarts", "0")
    attempt_ready(launcher, 0)
    configmap.write("reset.json", reset(retry=1))
    attempt_ready(launcher, 1)  # a cluster restart does not spend --max-restarts (0 here)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(20) == 143


def test_fault_flushing_holds_the_start(launcher, configmap):
    configmap.write("reset.json", reset(flushing=True))
    start(launcher, configmap)
    assert wait_until(lambda: launcher.events("cluster_hold"), 10), launcher.stderr
    time.sleep(0.3)
    assert launcher.ready_lines() == []
    configmap.write("reset.json", reset(flushing=False))
    attempt_ready(launcher, 0)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(20) == 143


def test_malformed_reset_json_is_ignored_with_a_warning(launcher, configmap):
    start(launcher, configmap)
    attempt_ready(launcher, 0)
    configmap.write("reset.json", '{"RankList": [{"RankId": "x"')
    configmap.write("reset.json", '{"RankList": 5}')
    assert wait_until(lambda: "reset.json" in launcher.stderr and "WARNING" in launcher.stderr, 10)
    assert not launcher.events("stop_group")  # the last good state is kept
    configmap.write("reset.json", reset(graceful=1))
    assert launcher.wait(20) == 0


def rank_table(servers):
    return {"status": "completed", "version": "1.0", "server_count": str(len(servers)),
            "server_list": [{"server_id": sid, "container_ip": sid,
                             "device": [{"device_id": str(d), "rank_id": str(r)} for d, r in enumerate(ranks)]}
                            for sid, ranks in servers]}


def test_rewritten_rank_table_is_reread_before_the_restart(launcher, tmp_path):
    table_dir = tmp_path / "rings"
    table_dir.mkdir()
    (table_dir / "hccl.json").write_text(json.dumps(rank_table([("10.0.0.1", [0, 1])])))
    (table_dir / "version").write_text("100")
    trigger = tmp_path / "fail-now"
    launcher.start(["--rank-table", str(table_dir / "hccl.json"), "--server-id", "10.0.0.1",
                    "--max-restarts", "1"], ["--fail-rank", "1", "--fail-when", str(trigger), "--run", "1.0"])
    attempt_ready(launcher, 0)
    (table_dir / "hccl.json").write_text(json.dumps(rank_table([("10.0.0.1", [0, 1, 2])])))
    (table_dir / "version").write_text("101")
    trigger.touch()  # the rank fails only after the cluster rewrote the table
    assert launcher.wait(30) == 0, launcher.stderr
    changed = launcher.events("rank_table_changed")
    assert changed and changed[0]["new_ranks"] == [0, 1, 2] and changed[0]["new_revision"] == "101"
    assert sorted(int(l[0]) for l in launcher.ready_lines() if l[1] == "1") == [0, 1, 2]


def test_taskd_manager_runs_once_on_the_rank0_node(tmp_path, monkeypatch):
    """Two `launcher run` processes share one rank table, each acting as one server."""
    build_libtaskd()
    port = free_port()
    stub_dir = tmp_path / "taskd"
    stub_dir.mkdir()
    table = tmp_path / "hccl.json"
    table.write_text(json.dumps(rank_table([("10.0.0.1", [0, 1]), ("10.0.0.2", [2, 3])])))
    for key, value in {"PYTHONPATH": f"{STUBS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                       "TASKD_STUB_DIR": str(stub_dir), "TASKD_STUB_PORT": str(port), "POD_IP": "127.0.0.1",
                       "MINDX_TASK_ID": "job-42", "TASKD_STUB_CRASH_AFTER": "0.5"}.items():
        monkeypatch.setenv(key, value)
    nodes = []
    for server in ("10.0.0.1", "10.0.0.2"):
        node = Launcher(tmp_path / server)
        node.start(["--rank-table", str(table), "--server-id", server, "--taskd", "on",
                    "--taskd-port", str(port)], ["--run", "3"])
        nodes.append(node)
    assert wait_all(nodes, 40) == [0, 0], [node.stderr for node in nodes]
    configs = sorted(stub_dir.glob("manager-config-*.json"))
    assert configs, "the manager never started"
    config = json.loads(configs[0].read_text())
    assert config == {"job_id": "job-42", "node_nums": 2, "proc_per_node": 2}
    names = [[e["event"] for e in node.events()] for node in nodes]
    assert names[0].index("taskd_sidecar_started") < names[0].index("attempt_start")  # before the ranks
    assert "taskd_sidecar_started" not in names[1]  # exactly one manager for the job
    assert "taskd_manager_restart" in names[0]  # the stand-in crashed after 0.5 s and came back
    assert len(configs) >= 2
    preloaded = [line.split() for line in (stub_dir / "preloaded").read_text().splitlines()]
    rank_pids = {int(l[2]) for node in nodes for l in node.ready_lines()}
    assert rank_pids <= {int(p) for p, *_ in preloaded}
    assert all(flag == "on" for p, flag in preloaded if int(p) in rank_pids)
