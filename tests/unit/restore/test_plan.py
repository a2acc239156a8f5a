"""RestorePlan: per-rank environment, JSON record and the human table."""

import json

import pytest

from launcher.common import envnames
from launcher.restore.plan import KIND_BREAKPOINT, KIND_NONE, KIND_PERIODIC, RestorePlan


def make(kind, sources, files, groups=((0, 2), (1, 3)), faults=((1, ("fault-npus",)),),
         warnings=()):
    return RestorePlan(world_size=4, kind=kind, reason="because", epoch=2, step=40, groups=groups,
                       groups_source="layout dp=2 tp=2 pp=1",
                       fault_ranks=tuple(r for r, _ in faults), fault_origins=faults,
                       sources=sources, files=files, warnings=warnings)


BREAKPOINT = make(KIND_BREAKPOINT, (0, 3, 0, 3),
                  ((0, "/c/rank_0/net-2_40_breakpoint.ckpt"), (3, "/c/rank_3/net-2_40_breakpoint.ckpt")))
PERIODIC = make(KIND_PERIODIC, (0, 3, 2, 3),
                tuple((r, f"/c/rank_{r}/net-2_40.ckpt") for r in (0, 2, 3)))
NONE = make(KIND_NONE, (), (), faults=(), warnings=("checkpoints: something odd",))


def test_breakpoint_env():
    assert BREAKPOINT.env_for(1) == {
        envnames.RESTORE_RANKS: "0,3",
        envnames.RESTORE_RANKS_MAP: '{"0,2":0,"1,3":3}',
        envnames.LAUNCHER_RESUME_SOURCE_RANK: "3",
        envnames.LAUNCHER_RESUME_CHECKPOINT: "/c/rank_3/net-2_40_breakpoint.ckpt",
        envnames.LAUNCHER_RESUME_STEP: "40",
        envnames.LAUNCHER_RESUME_KIND: "breakpoint",
    }
    assert json.loads(BREAKPOINT.env_for(0)[envnames.RESTORE_RANKS_MAP]) == {"0,2": 0, "1,3": 3}


def test_periodic_env():
    env = PERIODIC.env_for(1)
    assert env[envnames.RESTORE_RANKS] == "-1"
    assert env[envnames.RESTORE_RANKS_MAP] == "{}"
    assert env[envnames.LAUNCHER_RESUME_SOURCE_RANK] == "3"
    assert env[envnames.LAUNCHER_RESUME_KIND] == "periodic"
    assert PERIODIC.env_for(2)[envnames.LAUNCHER_RESUME_CHECKPOINT] == "/c/rank_2/net-2_40.ckpt"


def test_none_env_is_empty():
    assert all(NONE.env_for(r) == {} for r in range(4))


@pytest.mark.parametrize("rank", [-1, 4])
def test_env_for_out_of_range(rank):
    with pytest.raises(ValueError):
        BREAKPOINT.env_for(rank)


def test_to_json_is_serialisable_and_complete():
    record = json.loads(json.dumps(BREAKPOINT.to_json()))
    assert record["kind"] == "breakpoint" and record["restore_ranks"] == [0, 3]
    assert record["restore_ranks_map"] == {"0,2": 0, "1,3": 3}
    assert record["sources"] == [0, 3, 0, 3]
    assert record["checkpoints"]["3"].endswith("breakpoint.ckpt")
    assert record["fault_origins"] == {"1": ["fault-npus"]}
    assert record["version"] == 1 and record["full_env_maps"] is True
    assert json.loads(json.dumps(NONE.to_json()))["restore_ranks"] == []


def test_table_breakpoint():
    table = BREAKPOINT.format_table()
    assert table.splitlines()[0] == "Restore plan: breakpoint restore from epoch 2 step 40"
    assert "RESTORE_RANKS=0,3" in table
    assert "fault ranks: 1 (fault-npus)" in table
    rows = [line.split() for line in table.splitlines() if line.startswith(("0,2", "1,3"))]
    assert rows == [["0,2", "-", "0", "net-2_40_breakpoint.ckpt"],
                    ["1,3", "1", "3", "net-2_40_breakpoint.ckpt"]]


def test_table_periodic_shows_borrowed_files():
    rows = [line.split(None, 2) for line in PERIODIC.format_table().splitlines()
            if line.startswith(("0,2", "1,3"))]
    assert rows[0][2].startswith("own")
    assert rows[1][2].startswith("1<-3")


def test_table_none_lists_warnings():
    table = NONE.format_table()
    assert "nothing to resume from" in table
    assert "RESTORE_RANKS" not in table
    assert "  - checkpoints: something odd" in table
