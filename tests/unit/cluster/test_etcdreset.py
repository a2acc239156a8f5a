"""Telling etcd's lost data from an expired lease, and what is put back (``launcher.cluster.etcdreset``):
pure functions, and ``put_back`` against a recording client. The store's threads around them are in
test_etcdstore.py, the real server in tests/integration/test_multinode_etcd.py."""

from typing import Dict, List, Sequence, Tuple

from hypothesis import given
from hypothesis import strategies as st

from launcher.cluster.etcdreset import Seen, lost_data, put_back, resets, restorable

P = "/launcher/job/inc_0/"
KEYS = {f"{P}join.0": b"j0", f"{P}member.0": b"{}", f"{P}join.1": b"j1"}


def test_no_sign_of_lost_data_means_the_lease_expired():
    assert lost_data(Seen(5, "7", 0), P, 0, 9, "7", KEYS) is None


def test_each_sign_of_lost_data():
    seen = Seen(5, "7", 0)
    assert lost_data(seen, P, 0, 9, "8", KEYS) == "etcd lost its data: cluster id 7 -> 8"
    assert lost_data(seen, P, 0, 3, "7", KEYS) == "etcd lost its data: revision 3 after 5"
    assert lost_data(seen, P, 2, 9, "7", KEYS) == "etcd lost its data: this server's join record is gone"
    restored = {**KEYS, f"{P}reset.1": b"{}"}
    assert lost_data(seen, P, 0, 9, "7", restored).startswith("another node found etcd's data lost")
    assert lost_data(Seen(5, "7", 1), P, 0, 9, "7", restored) is None  # a reset it knows of already
    assert lost_data(Seen(5, None, 0), P, 0, 9, "8", KEYS) is None  # no cluster id known: not a change


def test_what_is_put_back():
    keys = {**KEYS, f"{P}closed": b"c", f"{P}reset.1": b"r", f"{P}gen_0/stopped.0": b"s",
            f"{P}gen_0/next.json": b"n0", f"{P}gen_1/next.json": b"n1", f"{P}gen_2/running.1": b"r1",
            f"{P}gen_2/failed.0.json": b"f", "/launcher/job/inc_1/join.0": b"other incarnation"}
    assert sorted(k[len(P):] for k in restorable(P, keys)) == [
        "closed", "gen_1/next.json", "gen_2/failed.0.json", "gen_2/running.1", "join.0", "join.1", "reset.1"]


NAMES = st.sampled_from(["join.0", "join.1", "member.0", "member.1", "closed", "reset.2", "gen_0/stopped.1",
                         "gen_3/done.0", "gen_1/next.json", "gen_3/abort", "gen_10/failed.1.json"])


@given(st.sets(NAMES))
def test_put_back_never_a_leased_key_always_the_incarnations_and_the_newest_generations(names):
    keys = {P + name: name.encode() for name in names}
    kept = restorable(P, keys)
    assert all(keys[k] == v for k, v in kept.items())
    assert not any(k.startswith(P + "member.") for k in kept)
    assert {k for k in keys if "/" not in k[len(P):] and not k[len(P):].startswith("member.")} <= set(kept)
    newest = max((int(k[len(P) + 4:].split("/")[0]) for k in keys if k.startswith(P + "gen_")), default=None)
    assert {k for k in keys if k.startswith(f"{P}gen_{newest}/")} <= set(kept)


class Recorder:
    """Records the calls; ``create`` fails for the keys in ``existing``."""

    def __init__(self, existing: Sequence[str] = ()):
        self.calls: List[Tuple] = []
        self.existing = set(existing)

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self.calls.append(("put", key, lease))

    def create(self, key: str, value: bytes, lease: int = 0, also: Sequence = ()) -> bool:
        self.calls.append(("create", key, lease, tuple(k for k, _, _ in also)))
        return key not in self.existing

    def grant(self, ttl: int) -> int:
        self.calls.append(("grant", ttl))
        return 100 + len(self.calls)


def test_put_back_writes_the_reset_first_and_each_member_with_its_join():
    before: Dict[str, bytes] = {**KEYS, f"{P}join.2": b"j2", f"{P}member.2": b"{}", f"{P}gen_0/stopped.2": b"s"}
    client = Recorder(existing=[f"{P}member.2"])  # server 2 moved its key to its own lease already
    lease = put_back(client, P, 0, before, ttl=5, reset=3, marker=b"m", joined=b"new")
    assert client.calls == [
        ("create", f"{P}reset.3", 0, ()),
        ("grant", 5), ("put", f"{P}member.0", lease), ("create", f"{P}join.0", 0, ()),
        ("grant", 5), ("create", f"{P}member.2", 105, (f"{P}join.2",)),  # on a lease nobody renews
        ("create", f"{P}join.1", 0, ()), ("create", f"{P}join.2", 0, ()),  # server 1 was lost before
        ("create", f"{P}gen_0/stopped.2", 0, ())]
    assert resets(P, {f"{P}reset.3": b"", f"{P}reset.12": b"", f"{P}gen_0/reset.40": b""}) == 12
