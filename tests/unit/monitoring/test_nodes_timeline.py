"""``launcher report DIR1 DIR2``: one timeline for a multi-node job; node clocks aligned from the
coordinator's records; the first node to fail; how long each node waited."""

import json
import re

from launcher.commands.cli import main
from launcher.monitoring import nodes
from tests.unit.monitoring.test_goodput import ev
from tests.unit.monitoring.test_timeline import drawn, of


def node_run(server, index, skew, fails_at=None, peer_at=None, waited=0.0):
    """A 2-rank node of a 2-node job on a clock ``skew`` s off; generation 0 ends at t=50 (the barrier),
    generation 1 runs until t=100. ``fails_at``: its rank 2*index failed then; ``peer_at``: it learned
    of the other node's failure then."""
    ranks = [2 * index, 2 * index + 1]
    log = [ev(0.0, "start", server=server, argv=["python", "train.py"]),
           ev(0.1, "sync_join", server=index, server_count=2), ev(1.0, "sync_start", waited=0.5),
           ev(1.1, "attempt_start", attempt=0, ranks=ranks)]
    log += [ev(1.2, "rank_spawned", attempt=0, rank=r) for r in ranks]
    log += [ev(3.0, "rank_output", attempt=0, rank=r, at=3.0) for r in ranks]
    if fails_at is not None:
        log += [ev(fails_at + 0.1, "rank_exited", attempt=0, rank=ranks[0], state="failed", exit_code=9,
                   signal=None, exited_at=fails_at),
                ev(fails_at + 0.2, "sync_failure_announced", generation=0, ranks=[ranks[0]], rank=ranks[0],
                   exit_code=9)]
    if peer_at is not None:
        log += [ev(peer_at, "sync_peer_failure", generation=0, rank=0, exit_code=9), ev(peer_at, "stop_group")]
    log += [ev(48.0, "attempt_end", attempt=0, failed=True),
            ev(50.0, "sync_barrier", generation=0, waited=waited, failed_ranks=[0]),
            ev(50.5, "restart", attempt=1, scope="group"), ev(51.0, "attempt_start", attempt=1, ranks=ranks)]
    log += [ev(51.5, "rank_spawned", attempt=1, rank=r) for r in ranks]
    log += [ev(99.0, "attempt_end", attempt=1, failed=False), ev(100.0, "job_end", reason="succeeded")]
    return [dict(e, ts=e["ts"] + skew, **({"exited_at": e["exited_at"] + skew} if "exited_at" in e else {}))
            for e in log]


def two_nodes():
    # node B's clock is 100 s ahead; its rank 2 failed at t=20 (its clock: 120); node A learned at t=20.3
    return [("/a", node_run("nodeA", 0, 0.0, peer_at=20.3, waited=27.0)),
            ("/b", node_run("nodeB", 1, 100.0, fails_at=20.0, waited=25.5))]


def test_clocks_are_aligned_from_the_coordinators_records():
    a, b = nodes.load(two_nodes())
    assert (a.name, a.offset, b.name) == ("nodeA", 0.0, "nodeB")
    assert abs(b.offset + 100.0) < 1e-9 and b.spread < 1e-9
    [(generation, (at, first, announced))] = nodes.first_failures([a, b]).items()
    assert (generation, first.name, announced["rank"], round(at, 6)) == (0, "nodeB", 2, 20.0)
    assert nodes.waits([a, b]) == {0: {"nodeA": 27.0, "nodeB": 25.5}}


def test_one_page_with_a_lane_per_node():
    page = nodes.render(nodes.load(list(reversed(two_nodes()))))  # order of the dirs does not matter
    elements = drawn(page)
    assert [e["data-node"] for e in of(elements, "part") if e["data-part"] == "startup"] == ["nodeA", "nodeB"]
    rings = {(e["data-node"], e["data-first"]) for e in of(elements, "failure")}
    assert rings == {("nodeB", "1")}  # node A did not fail itself: it was stopped
    assert "generation 0: nodeB failed first (rank 2, exit code 9) at +20.00 s" in page
    assert "nodeB: clock shifted by -100.000 s" in page
    # aligned: both nodes' attempt-1 parts begin within the same pixel
    starts = {e["data-node"]: float(e["x"]) for e in of(elements, "part") if e["data-attempt"] == "1"
              and e["data-part"] == "restarting"}
    assert abs(starts["nodeA"] - starts["nodeB"]) < 1.0
    waited = dict(re.findall(r'data-node="(node.)" data-generation="0">([0-9.]+)<', page))
    assert waited == {"nodeA": "27.00", "nodeB": "25.50"}


def test_cli_takes_several_run_dirs(tmp_path, capsys):
    for name, events in two_nodes():
        run_dir = tmp_path / name.strip("/")
        run_dir.mkdir()
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "job.html"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "nodeB failed first" in out.read_text()


def test_coordinator_records_without_a_generation_are_left_out():
    """A ``sync_failure_announced`` or ``sync_barrier`` without a generation (not as the coordinator
    writes them) next to ones with it: the page leaves them out. It used to fail sorting None among the
    generations (a traceback for a file's content)."""
    (a_dir, a), (b_dir, b) = two_nodes()
    b = b + [ev(160.0, "sync_failure_announced", rank=3, exit_code=1), ev(161.0, "sync_barrier", waited=2.0)]
    a = a + [ev(60.0, "sync_barrier", generation=None, waited=1.0)]
    page = nodes.render(nodes.load([(a_dir, a), (b_dir, b)]))
    assert "generation 0: nodeB failed first (rank 2, exit code 9) at +20.00 s" in page
    assert "generation None" not in page and "failed first (rank 3" not in page
    assert nodes.waits(nodes.load([(a_dir, a), (b_dir, b)])) == {0: {"nodeA": 27.0, "nodeB": 25.5}}
