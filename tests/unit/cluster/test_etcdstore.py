"""The coordination records in etcd (``launcher.cluster.etcdstore``) against a fake client in memory:
joining an incarnation, membership (who is lost), this node's queued records, shutting down, and
etcd losing its data against this server's lease expiring. The real server is in
tests/integration/test_multinode_etcd.py."""

import json
import threading
import time
from typing import Dict, List, Sequence, Tuple

import pytest

from launcher.cluster.etcdclient import EtcdError
from launcher.cluster.etcdstore import WATCH_IDLE, EtcdStore

NAMES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


class FakeEtcd:
    """The calls ``EtcdStore`` makes, on a dict; leases are ids whose keys ``expire`` deletes; every
    write moves the revision on, and ``wipe`` is etcd restarted on an empty data dir."""

    def __init__(self):
        self.endpoints = [("127.0.0.1", 2379)]
        self.cluster_id = "7"
        self.kv: Dict[str, bytes] = {}
        self.leases: Dict[str, int] = {}
        self.live: set = set()
        self.revision = 1
        self.next_lease = 100
        self.revoked: List[int] = []
        self.down = False
        self.closing = threading.Event()
        self.stores: List[EtcdStore] = []
        self.ranges = 0

    def close(self):
        """The kept connections: none here."""

    def _check(self):
        if self.down:
            raise EtcdError("127.0.0.1:2379: Connection refused")

    def range(self, prefix: str, range_end: str = None) -> Tuple[int, Dict[str, bytes]]:
        self._check()
        self.ranges += 1
        inside = (lambda k: prefix <= k < range_end) if range_end is not None else (lambda k: k.startswith(prefix))
        return self.revision, {k: v for k, v in self.kv.items() if inside(k)}

    def get(self, key: str):
        self._check()
        return self.kv.get(key)

    def count(self, prefix: str) -> int:
        self._check()
        return sum(1 for k in self.kv if k.startswith(prefix))

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self._check()
        self.revision += 1
        self.kv[key] = value
        self.leases.pop(key, None)
        if lease:
            self.leases[key] = lease

    def create(self, key: str, value: bytes, lease: int = 0, also: Sequence = ()) -> bool:
        self._check()
        if key in self.kv:
            return False
        for put in [(key, value, lease), *also]:
            self.put(*put)
        return True

    def grant(self, ttl: int) -> int:
        self._check()
        self.next_lease += 1
        self.live.add(self.next_lease)
        return self.next_lease

    def keepalive(self, lease: int) -> int:
        self._check()
        return 5 if lease in self.live else 0

    def revoke(self, lease: int) -> None:
        self._check()
        self.revoked.append(lease)
        self.expire(lease)

    def expire(self, lease: int) -> None:
        self.live.discard(lease)
        for key in [k for k, held in self.leases.items() if held == lease]:
            del self.kv[key], self.leases[key]

    def wipe(self) -> None:
        """etcd restarted on an empty data dir: no key, no lease, the revision back at 1."""
        self.kv.clear()
        self.leases.clear()
        self.live.clear()
        self.revision = 1

    def watch(self, prefix: str, start_revision: int, idle: float, range_end: str = None):
        self.closing.wait(idle)
        return iter(())


@pytest.fixture
def etcd():
    """The fake; every store joined to it is shut down at the end, so no thread outlives its test."""
    fake = FakeEtcd()
    yield fake
    fake.down = False
    for store in fake.stores:
        store.shutdown(timeout=1.0)
    fake.closing.set()
    for store in fake.stores:
        for thread in store._threads:
            thread.join(5)
            assert not thread.is_alive(), f"{thread.name} outlived its test"


def records(etcd: FakeEtcd, prefix: str) -> List[str]:
    """The keys under ``prefix`` but the leader's view and its key (published by a thread)."""
    return sorted(k[len(prefix):] for k in etcd.kv if k.startswith(prefix) and not k[len(prefix):].startswith("view"))


def join(etcd: FakeEtcd, index: int, run_id: str = "job", count: int = 3, emit=None) -> EtcdStore:
    """A store on the fake; a TTL of 60 s keeps its keep-alive thread out of the test (the test
    calls what that thread would)."""
    store = EtcdStore.join(etcd, run_id, index, NAMES[:count], ttl=60, emit=emit)
    etcd.stores.append(store)
    return store


def test_nodes_join_one_incarnation_and_a_closed_one_is_not_joined(etcd):
    a, b = join(etcd, 0), join(etcd, 1)
    assert a.prefix == b.prefix == "/launcher/job/inc_0/"
    assert a.path == "etcd://127.0.0.1:2379/launcher/job/inc_0/"
    assert json.loads(etcd.kv["/launcher/job/inc_0/join.1"])["name"] == "server 1 (10.0.0.2)"
    assert etcd.leases["/launcher/job/inc_0/member.1"] == b.lease
    again = join(etcd, 0)  # this server's previous start is in inc_0
    assert again.prefix == "/launcher/job/inc_1/"
    etcd.kv["/launcher/job/inc_1/closed"] = b"{}"
    assert join(etcd, 2).prefix == "/launcher/job/inc_2/"
    assert join(etcd, 0, run_id="other").prefix == "/launcher/other/inc_0/"


def test_servers_not_joined_yet(etcd):
    a = join(etcd, 0)
    assert a.not_joined() == [1, 2]
    join(etcd, 2)
    a._snapshot = etcd.range(a.prefix)[1]
    assert a.not_joined() == [1]


def test_join_records_carry_the_address_each_server_gave(etcd):
    """What regroup moves the master to when its server is lost (elastic)."""
    a = EtcdStore.join(etcd, "job", 0, NAMES, ttl=5, address="127.0.0.1")
    b = EtcdStore.join(etcd, "job", 1, NAMES, ttl=5, address="127.0.0.2")
    etcd.stores.extend([a, b, join(etcd, 2)])  # node 2 gave none
    assert json.loads(etcd.kv["/launcher/job/inc_0/join.1"])["address"] == "127.0.0.2"
    a._snapshot = etcd.range(a.prefix)[1]
    assert a.addresses() == {0: "127.0.0.1", 1: "127.0.0.2"}


def test_a_joined_server_without_its_lease_is_lost_unless_it_finished(etcd):
    a, b, c = join(etcd, 0), join(etcd, 1), join(etcd, 2)
    a._snapshot = etcd.range(a.prefix)[1]
    assert a.read(0).lost == frozenset()
    etcd.expire(b.lease)
    etcd.expire(c.lease)
    c.write(0, "done.2", {})
    c.shutdown()  # writes what it queued, then revokes
    a._snapshot = etcd.range(a.prefix)[1]
    state = a.read(0)
    assert state.lost == {1} and state.done == {2}
    etcd.expire(a.lease)
    assert 0 not in a.read(0).lost  # never itself (a lease being granted again)


def test_records_of_a_generation_and_this_nodes_queued_writes(etcd):
    a, b = join(etcd, 0), join(etcd, 1)
    b.write(0, "failed.1.json", {"ranks": [3], "rank": 3, "returncode": -9, "exit_code": 137, "exited_at": 5.0})
    b.shutdown()
    etcd.down = True  # a's own records are visible to it before etcd has them
    a.write(0, "stopped.0", {})
    a._snapshot = {k: v for k, v in etcd.kv.items() if k.startswith(a.prefix)}
    state = a.read(0)
    assert state.failed_ranks() == (3,) and state.stopped == {0}
    assert state.failures()[0].label == "rank 3 on server 1 (10.0.0.2)"
    assert a.read(1).failed == {} and a.gen_path(1) == f"{a.path}gen_1/"


def test_an_existing_abort_wins_and_garbage_is_ignored(etcd):
    a, b = join(etcd, 0), join(etcd, 1)
    b.write(0, "abort", {"exit_code": 4, "reason": "budget"}, exclusive=True)
    b.shutdown()
    a.write(0, "abort", {"exit_code": 1, "reason": "mine"}, exclusive=True)
    a.shutdown()
    etcd.kv[a.prefix + "gen_0/failed.2.json"] = b"not json"
    etcd.kv[a.prefix + "gen_0/unrelated"] = b"{}"
    a._snapshot = etcd.range(a.prefix)[1]
    state = a.read(0)
    assert state.abort["reason"] == "budget" and state.failed == {}


def test_an_exclusive_proposal_is_read_once_etcd_holds_the_winning_one(etcd):
    """next.json / start.json: the first writer wins, so a node must not act on its own queued proposal."""
    a = join(etcd, 0)
    etcd.down = True
    a.write(0, "next.json", {"servers": [0, 1]}, exclusive=True)
    assert a.read(0).next is None
    etcd.kv[a.prefix + "gen_0/next.json"] = json.dumps({"servers": [0, 2]}).encode()  # another node's, first
    a._snapshot = {k: v for k, v in etcd.kv.items() if k.startswith(a.prefix)}
    assert a.read(0).next["servers"] == [0, 2]


def test_a_server_arriving_after_generation_0_was_decided_joins_the_running_job(etcd):
    """--nnodes 2:3 started on servers 0 and 1 (gen_0/start.json): server 2, which never joined,
    joins generation 0 running (its note and stopped.2), to start with the others at generation 1."""
    a = EtcdStore.join(etcd, "job", 0, NAMES, ttl=5, elastic=True)
    etcd.stores.append(a)
    etcd.kv[a.prefix + "gen_0/start.json"] = json.dumps({"servers": [0, 1]}).encode()
    late = EtcdStore.join(etcd, "job", 2, NAMES, ttl=5, elastic=True)
    etcd.stores.append(late)
    assert late.running == 0 and late.prefix == a.prefix
    assert json.loads(etcd.kv[a.prefix + "gen_0/failed.2.json"])["note"] == "joining"
    assert a.prefix + "gen_0/stopped.2" in etcd.kv


def test_join_fails_when_etcd_never_answers(etcd):
    etcd.down = True
    with pytest.raises(EtcdError, match="Connection refused"):
        EtcdStore.join(etcd, "job", 0, NAMES, ttl=5, wait=0.3)


def test_a_renewal_that_failed_is_tried_again_within_half_a_second(etcd):
    """TTL 3 s: a renewal every second; one that timed out is sent again after RENEW_AGAIN, not a
    full second later (two late answers in a row would cost the lease), the next after twice that
    (at most TTL/3: no storm of renewals against a slow etcd)."""
    renewals = []
    keepalive = etcd.keepalive

    def renew(lease):
        renewals.append(time.monotonic())
        if len(renewals) <= 2:
            raise EtcdError("127.0.0.1:2379: timed out")
        return keepalive(lease)

    etcd.keepalive = renew
    store = EtcdStore.join(etcd, "job", 0, NAMES, ttl=3)
    etcd.stores.append(store)
    deadline = time.monotonic() + 6
    while len(renewals) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    gaps = [b - a for a, b in zip(renewals, renewals[1:])]
    assert len(gaps) >= 3
    assert gaps[0] < 0.8 and 0.8 < gaps[1] < 1.3 and gaps[2] > 0.8  # 0.5 s, then 1 s (TTL/3), then every second


def test_a_slow_join_does_not_cost_the_lease_before_its_first_renewal(etcd):
    """etcd counts a lease's TTL from its grant. When the join's calls after the grant take longer
    than TTL - TTL/3 (1,000 launchers joining one etcd at once), the first renewal must come at once
    when the threads start, not TTL/3 later: past the TTL, etcd has dropped the lease and the
    launcher is expelled from the job it just joined (the elastic phase of bench.simnodes at 1,000
    nodes lost hundreds of nodes so). The fake expires a lease not renewed within its TTL."""
    ttl, slow = 3, 2.2
    renewed: Dict[int, float] = {}
    grant, keepalive, create = etcd.grant, etcd.keepalive, etcd.create

    def granted(seconds):
        lease = grant(seconds)
        renewed[lease] = time.monotonic()
        return lease

    def renew(lease):
        if time.monotonic() - renewed.get(lease, 0.0) > ttl:
            etcd.expire(lease)
        renewed[lease] = time.monotonic()
        return keepalive(lease)

    def slow_create(key, value, lease=0, also=()):
        if key.endswith("view.leader"):  # the last call of the join (the campaign) answers late
            time.sleep(slow)
        return create(key, value, lease, also)

    etcd.grant, etcd.keepalive, etcd.create = granted, renew, slow_create
    store = EtcdStore.join(etcd, "job", 0, NAMES, ttl=ttl)
    etcd.stores.append(store)
    time.sleep(ttl / 3 + 0.3)  # past the TTL counted from the grant, had the first renewal waited TTL/3
    assert store.expelled is None
    assert store.lease in etcd.live and f"{store.prefix}member.0" in etcd.kv


@pytest.mark.parametrize("late", [False, True], ids=["starting", "joining the running job"])
def test_the_lease_is_granted_just_before_the_join_and_renewed_while_the_first_read_runs(etcd, late):
    """Of the join's calls, only the transaction that creates ``member.<i>`` comes between the grant
    and the lease thread's start: the reads that find the incarnation come before the grant, and the
    first read of the records (``_begin``) runs with the lease thread already renewing."""
    calls: List[str] = []
    renewing: List[int] = []  # lease threads alive at each campaign

    def traced(name, call):
        def traced_call(*args, **kwargs):
            if name != "keepalive" or "keepalive" not in calls:  # the first renewal only
                calls.append(name)
            if name == "create" and args[0].endswith("view.leader"):  # _begin's campaign
                renewing.append(sum(t.name == "etcd-lease" and t.is_alive() for t in threading.enumerate()))
            return call(*args, **kwargs)
        return traced_call

    for name in ("range", "get", "count", "put", "create", "grant", "keepalive"):
        setattr(etcd, name, traced(name, getattr(etcd, name)))
    if late:
        first = EtcdStore.join(etcd, "job", 0, NAMES, ttl=60, elastic=True)
        etcd.stores.append(first)
        etcd.kv[first.prefix + "gen_0/start.json"] = json.dumps({"servers": [0, 1]}).encode()
    calls.clear()
    renewing.clear()
    store = EtcdStore.join(etcd, "job", 2, NAMES, ttl=60, elastic=True)
    etcd.stores.append(store)
    assert calls[calls.index("grant") + 1] == "create"  # the join's transaction
    assert store.running == (0 if late else None)
    assert renewing[0] == 1 + late  # this store's lease thread (and the first store's) ran at its campaign


def test_a_lease_lost_during_the_first_read_expels_and_is_no_reset(etcd):
    """The lease thread runs while the join's first read does: a lease etcd drops meanwhile expels
    this server. Nothing was seen yet to tell lost data by, so a reset the incarnation had before
    this join (``reset.1``) must not read as a new one, which would put every record back."""
    first = join(etcd, 0)
    etcd.put(first.prefix + "reset.1", b"{}")
    campaigned, create = threading.Event(), etcd.create

    def slow_create(key, value, lease=0, also=()):
        if key.endswith("view.leader") and not campaigned.is_set():  # the joiner's campaign
            campaigned.set()
            etcd.expire(max(etcd.live))  # its lease, the newest, is gone before its first read ends
            time.sleep(1.5)  # past its first renewal (TTL/3 = 1 s)
        return create(key, value, lease, also)

    etcd.create = slow_create
    store = EtcdStore.join(etcd, "job", 1, NAMES, ttl=3)
    etcd.stores.append(store)
    assert store.expelled and "lease expired" in store.expelled
    assert [k for k in etcd.kv if "/reset." in k] == [first.prefix + "reset.1"]


def test_silent_watches_are_reopened_at_moments_of_their_own(etcd):
    """Every follower opens its watch on the same view: each waits 5-7.5 s drawn at random before it
    re-reads, so that 1,000 of them do not all hit etcd in the same instant every 5 s."""
    idles = []
    watch = etcd.watch
    etcd.watch = lambda prefix, revision, idle, range_end=None: idles.append(idle) or watch(
        prefix, revision, 0.01, range_end)
    for index in range(3):
        join(etcd, index)
    deadline = time.monotonic() + 5
    while len(idles) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(idles) >= 12 and all(WATCH_IDLE <= idle <= 1.5 * WATCH_IDLE for idle in idles)
    assert len(set(idles)) == len(idles)


def test_a_watch_closed_at_once_is_not_a_busy_loop(etcd):
    """A server that ends every watch stream at once (compaction, a proxy): the follower paces its
    re-reads instead of spinning on range requests."""
    etcd.closing.set()  # the fake's watch now returns at once
    join(etcd, 0)
    done = threading.Event()
    done.wait(0.5)
    assert etcd.ranges < 20, f"{etcd.ranges} range requests in 0.5 s"


# -- etcd restarted without its data, against this server's lease expiring -----------------------
def test_etcd_that_lost_its_data_gets_the_records_back_and_nobody_is_lost(etcd):
    """etcd comes back empty: the first launcher to notice (its lease is unknown, its join record is
    gone) puts back what it knew; every member stays a member, the generation's records are back."""
    seen = []
    a = join(etcd, 0, emit=lambda event, **fields: seen.append((event, fields)))
    b, c = join(etcd, 1), join(etcd, 2)
    b.write(0, "failed.1.json", {"ranks": [3], "rank": 3, "returncode": 7, "exit_code": 7})
    b._writes.put(None)
    b._threads[2].join(5)  # b's record is in etcd
    for store in (a, b, c):
        store._refresh()
    old_lease = a.lease
    etcd.wipe()
    a._refresh(gone=old_lease)
    assert a.lease != old_lease and etcd.leases[a.prefix + "member.0"] == a.lease
    assert {f"{a.prefix}{name}" for name in ("reset.1", "join.0", "join.1", "join.2", "member.1", "member.2",
                                             "gen_0/failed.1.json")} <= set(etcd.kv)
    state = a.read(0)
    assert state.lost == frozenset() and state.failed_ranks() == (3,)
    assert [(event, fields["reset"]) for event, fields in seen] == [("coordinator_reset", 1)]
    assert seen[0][1]["reason"].startswith("etcd lost its data: revision 1 after ")
    a._refresh(gone=old_lease)  # a keep-alive answered for the old lease: no second reset, no expulsion
    assert a.expelled is None and len(set(records(etcd, a.prefix)) - {"member.0"}) == 7
    assert etcd.leases[a.prefix + "view.leader"] == a.lease  # the leader's key is taken again, not put back


def test_a_launcher_finds_the_records_put_back_by_another(etcd):
    """The reset record tells the second launcher that its lease is gone because etcd lost its data
    (its join record is back already): it takes its member key onto a lease of its own."""
    a, b = join(etcd, 0), join(etcd, 1)
    for store in (a, b):
        store._refresh()
    etcd.wipe()
    a._refresh(gone=a.lease)
    proxy = etcd.leases[b.prefix + "member.1"]
    b._refresh(gone=b.lease)
    assert b.expelled is None and etcd.leases[b.prefix + "member.1"] == b.lease != proxy
    assert b._notices[0][1]["reason"] == "another node found etcd's data lost and put the records back (reset 1)"
    assert records(etcd, b.prefix) == ["join.0", "join.1", "member.0", "member.1", "reset.1"]
    assert etcd.leases[a.prefix + "view.leader"] == a.lease


def test_a_member_that_died_while_etcd_was_away_is_lost_once_the_lease_of_the_put_back_key_ends(etcd):
    a, b = join(etcd, 0), join(etcd, 1)
    for store in (a, b):
        store._refresh()
    etcd.wipe()
    a._refresh(gone=a.lease)
    assert a.read(0).lost == frozenset()
    etcd.expire(etcd.leases[a.prefix + "member.1"])  # nobody renews the put-back key: b is gone
    a._refresh()
    assert a.read(0).lost == {1}


def test_a_lease_that_expired_while_etcd_kept_the_data_keeps_the_server_out(etcd):
    """Not lost data (same revision line, join record there, no reset record): the others count
    this server as lost; it reads itself as lost and writes nothing more, not even ``closed``."""
    a, b = join(etcd, 0), join(etcd, 1)
    b._refresh()
    etcd.expire(b.lease)
    b._refresh(gone=b.lease)
    assert [event for event, _ in b._notices] == ["coordinator_lease_expired"]
    assert b.expelled and b.read(0).lost == {1}
    assert b.write(0, "abort", {"exit_code": 1, "reason": "lost"}, exclusive=True) is False
    b.close("failed")
    b.shutdown()
    assert records(etcd, b.prefix) == ["join.0", "join.1", "member.0"]
    assert b.lease not in etcd.revoked  # etcd dropped it already
    a._refresh()
    assert a.read(0).lost == {1}


def test_a_changed_cluster_id_is_lost_data(etcd):
    a = join(etcd, 0)
    etcd.cluster_id = "8"  # a cluster rebuilt with other peers or another token
    a._refresh()
    assert a._notices[0][1]["reason"] == "etcd lost its data: cluster id 7 -> 8"
    assert a.prefix + "reset.1" in etcd.kv


def test_unusable_values_are_none_with_one_warning(caplog):
    """``etcdctl put .../failed.1.json '{"ranks": [1e999]}'`` (OverflowError on main) or ``[[[...``
    (RecursionError): left out, one warning per key and problem."""
    from launcher.cluster.etcdstore import _parse

    for _ in range(2):
        assert _parse(b'{"ranks": [1e999]}', "/launcher/r/inc_0/gen_0/failed.1.json") is None
        assert _parse(b"[" * 100000, "/launcher/r/inc_0/gen_0/failed.0.json") is None
        assert _parse(b'{"servers": [0, "1"]}', "/launcher/r/inc_0/gen_0/next.json") is None
    assert _parse(b'{"servers": [0, 1]}', "/launcher/r/inc_0/gen_0/next.json")["servers"] == [0, 1]
    assert _parse(None, "/launcher/r/inc_0/gen_0/abort") is None
    assert len([r for r in caplog.records if "ignoring it" in r.getMessage()]) == 3


def test_values_over_the_record_limit_are_refused(caplog):
    from launcher.cluster.etcdstore import _parse
    from launcher.common.inputfiles import LIMIT_RECORD

    big = b'{"reason": "' + b"x" * LIMIT_RECORD + b'"}'
    assert _parse(big, "/launcher/r/inc_0/gen_0/abort") is None
    assert any("is larger than 1 MiB" in r.getMessage() for r in caplog.records)


def test_a_join_whose_answer_timed_out_stays_in_its_incarnation(etcd):
    """etcd committed the join but its answer timed out (every node of a large job joining at once):
    the retry finds this call's own join record and keeps it, instead of starting inc_1 alone."""
    first, create = [True], etcd.create

    def slow_create(key, value, lease=0, also=()):
        done = create(key, value, lease, also)
        if first and key.endswith("join.1"):
            first.clear()
            raise EtcdError("127.0.0.1:2379: timed out")
        return done

    a = join(etcd, 0)
    etcd.create = slow_create
    b = join(etcd, 1)
    assert b.prefix == a.prefix and not first
    assert etcd.leases[b.prefix + "member.1"] == b.lease and b.lease in etcd.live
