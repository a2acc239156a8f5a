"""The leader's view (``launcher.cluster.etcdview``): what it carries, when it must go out at once,
and how a follower reads a generation from it; leadership taken over when the leader's lease goes.
Against the fake etcd of test_etcdstore; the real server: tests/integration/test_multinode_etcd.py
and ``python -m bench.simnodes``."""

import json

from hypothesis import given, strategies as st

from launcher.cluster import etcdview
from launcher.cluster.etcdstore import _parse
from tests.unit.cluster.test_etcdstore import NAMES, etcd, join  # noqa: F401 (etcd: the fixture)

P = "/launcher/job/inc_0/"


@given(st.sets(st.integers(min_value=0, max_value=20000)))
def test_a_bitmap_gives_back_its_set(servers):
    assert etcdview.unbits(etcdview.bits(servers)) == servers


def test_unreadable_bitmaps_and_views_are_empty():
    assert etcdview.unbits("zz") == frozenset() and etcdview.unbits(None) == frozenset()
    assert etcdview.decode(b"not json") == {} and etcdview.decode(b'{"gens": 3}') == {}
    assert etcdview.generation({"gens": {"0": "x"}}, 0) == ({}, frozenset(), frozenset())


def _record(**fields) -> bytes:
    return json.dumps({"server": 1, "name": "server 1", **fields}).encode()


def test_the_view_holds_joins_losses_records_and_the_two_newest_generations_marks():
    snapshot = {P + "join.0": b"{}", P + "join.1": b"{}", P + "join.2": b"{}", P + "member.0": b"{}",
                P + "member.1": b"{}", P + "view.leader": b"{}",
                P + "gen_0/stopped.0": b"{}", P + "gen_1/stopped.1": b"{}", P + "gen_2/done.0": b"{}",
                P + "gen_1/failed.1.json": _record(rank=3, ranks=[3]), P + "gen_1/running.1": b"{}",
                P + "gen_-1/master.json": _record(addr="10.0.0.2", port=29500),
                P + "gen_2/abort": b"garbage"}
    view = etcdview.compose(P, 3, snapshot, _parse)
    assert etcdview.unbits(view["joined"]) == {0, 1, 2} and etcdview.unbits(view["lost"]) == {2}
    assert set(view["gens"]) == {"-1", "0", "1", "2"}
    assert "stopped" not in view["gens"]["0"]  # marks of the two newest generations only
    records, stopped, done = etcdview.generation(view, 1)
    assert records["failed.1.json"]["ranks"] == [3] and stopped == {1} and done == frozenset()
    assert etcdview.generation(view, 2)[0] == {} and etcdview.generation(view, 2)[2] == {0}  # garbage left out
    assert etcdview.generation(view, -1)[0]["master.json"]["addr"] == "10.0.0.2"


def test_what_goes_out_at_once():
    base = {"joined": "7", "lost": "0", "count": 3, "gens": {"0": {"records": {}, "stopped": "1", "done": "0"}}}
    assert etcdview.urgent(base, None)
    progress = {**base, "gens": {"0": {"records": {}, "stopped": "3", "done": "0"}}}
    assert not etcdview.urgent(progress, base)  # one more stopped: progress only
    assert not etcdview.urgent({**base, "joined": "3", "gens": {}}, {**base, "joined": "1", "gens": {}})  # 2 of 3
    assert etcdview.urgent(base, {**base, "joined": "3"})  # every server joined
    assert etcdview.urgent({**base, "gens": {"0": {"records": {}, "stopped": "5", "done": "2"}}},
                           progress)  # every server stopped or finished generation 0
    assert etcdview.urgent({**base, "lost": "2"}, base)
    assert etcdview.urgent({**base, "gens": {"0": {"records": {"abort": {}}, "stopped": "1"}}}, base)


def test_a_barriers_progress_goes_out_less_often_the_more_followers_it_goes_to():
    base = {"joined": "7", "lost": "0", "count": 3, "gens": {"0": {"records": {}, "stopped": "1", "done": "0"}}}
    marks = {**base, "gens": {"0": {"records": {}, "stopped": "3", "done": "0"}}}
    assert etcdview.progress_interval(marks, base, 10) == etcdview.VIEW_INTERVAL
    assert etcdview.progress_interval(marks, base, 1000) == 2.0  # one fan-out every 2 s to 999 followers
    # servers joining: an elastic start counts them, at the short interval whatever the size
    assert etcdview.progress_interval({**marks, "joined": "f"}, base, 1000) == etcdview.VIEW_INTERVAL


def test_the_first_server_leads_and_a_follower_reads_the_generation_from_the_view(etcd):  # noqa: F811
    a, b, c = join(etcd, 0), join(etcd, 1), join(etcd, 2)
    assert a.leading and not b.leading and etcd.leases[P + "view.leader"] == a.lease
    c.write(0, "failed.2.json", {"ranks": [5], "rank": 5, "returncode": 1, "exit_code": 1, "exited_at": 1.0})
    c.write(0, "stopped.2", {})
    b.write(0, "stopped.1", {})
    for store in (b, c):
        store._writes.put(None)
        store._threads[2].join(5)
    etcd.expire(c.lease)  # c is gone
    a._refresh()
    a._publish_view()
    b._refresh()
    assert not any("gen_0/" in key for key in b._snapshot)  # the records reached b through the view
    state = b.read(0)
    assert state.failed_ranks() == (5,) and state.stopped == {1, 2} and state.lost == {2}
    assert b.not_joined() == []


def test_a_follower_takes_the_lead_when_the_leaders_lease_goes(etcd):  # noqa: F811
    a, b = join(etcd, 0), join(etcd, 1)
    assert not b.leading
    etcd.expire(a.lease)
    b._refresh()
    assert b.leading and etcd.leases[P + "view.leader"] == b.lease
    b._publish_view()
    assert etcdview.unbits(etcdview.decode(etcd.kv[P + "view"])["lost"]) == {0}
    assert b.read(0).lost == {0}


def test_a_follower_watches_only_the_view(etcd):  # noqa: F811
    asked = []
    watch = etcd.watch
    etcd.watch = lambda prefix, revision, idle, range_end=None: asked.append((prefix, range_end)) or watch(
        prefix, revision, idle, range_end)
    a, b = join(etcd, 0), join(etcd, 1)
    etcd.closing.wait(0.3)
    assert (P, None) in asked and (P + "view", P + "view/") in asked
    assert a.leading and not b.leading
