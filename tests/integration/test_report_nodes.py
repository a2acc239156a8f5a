"""``launcher report NODE0_RUN_DIR NODE1_RUN_DIR`` on a real 2-node job (two launchers on this machine,
coordinated through ``--sync-dir``): one page, a lane per node, node B named as the first to fail, and
every node's wait at the restart barrier (issue #31 item 4)."""

import re

from tests.helpers.launch import Launcher, cli, wait_all
from tests.integration.test_multinode import free_port, table_options, write_table
from tests.unit.monitoring.test_timeline import drawn


def test_one_report_for_a_two_node_job(tmp_path):
    trigger = tmp_path / "fail-now"
    options = table_options(write_table(tmp_path / "hccl.json"), free_port())
    nodes = [Launcher(tmp_path / f"node{index}") for index in range(len(options))]
    for node, opts in zip(nodes, options):
        node.start(["--run-id", "report-job", *opts, "--max-restarts", "1", "--sync-dir", str(tmp_path / "sync"),
                    "--sync-timeout", "60"],
                   ["--fail-rank", "3", "--exit-code", "9", "--fail-when", str(trigger), "--print-lines", "1",
                    "--run-per-attempt", "120,1"])
    for node in nodes:
        node.wait_ready(2)
    trigger.touch()
    codes = wait_all(nodes, 120)
    assert codes == [0, 0], [n.stderr[-2000:] for n in nodes]
    out = tmp_path / "job.html"
    done = cli("report", nodes[1].run_dir, nodes[0].run_dir, "-o", out)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    elements = drawn(page)
    lanes = [e["data-node"] for e in elements if e["data-kind"] == "part" and e["data-part"] == "startup"]
    assert lanes == ["127.0.0.1", "127.0.0.2"], lanes
    assert re.search(r"generation 0: 127\.0\.0\.2 failed first \(rank 3, exit code 9\)", page), page
    first = [(e["data-node"], e["data-first"]) for e in elements if e["data-kind"] == "failure"]
    assert first == [("127.0.0.2", "1")]
    # one machine, one clock: the alignment finds (almost) no offset
    shift = float(re.search(r"127\.0\.0\.2: clock shifted by ([-+][0-9.]+) s", page).group(1))
    assert abs(shift) < 0.5, shift
    waited = dict(re.findall(r'data-node="([0-9.]+)" data-generation="0">([0-9.]+)<', page))
    barrier = {n: e["waited"] for n, node in zip(("127.0.0.1", "127.0.0.2"), nodes)
               for e in node.events("sync_barrier", generation=0)}
    assert waited == {n: f"{w:.2f}" for n, w in barrier.items()}
