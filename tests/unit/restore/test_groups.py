"""Replica groups from a layout, a groups file and group_info.pb files, with safe fallbacks."""

import json
import shutil
from pathlib import Path

import pytest

from launcher.common.errors import UsageError
from launcher.restore.groupinfo import parallel_group_map_class
from launcher.restore.groups import (NO_GROUPS, ReplicaGroups, groups_from_layout, partition,
                                     resolve_groups, singletons)
from tests.helpers.paths import DATA

REAL = DATA / "restore" / "group_info_dp2_tp2"


def write_pb(root: Path, rank: int, ranks) -> None:
    message = parallel_group_map_class()()
    message.ckpt_restore_rank_list.dim.extend(ranks)
    (root / f"device{rank}").mkdir(parents=True, exist_ok=True)
    (root / f"device{rank}" / "group_info.pb").write_bytes(message.SerializeToString())


def test_layout_matches_vendor_example():
    # 24 ranks, tp=8: the vendor's RESTORE_RANKS_MAP example groups 0,8,16.
    groups = groups_from_layout(24, None, 8, None)
    assert groups.groups[0] == (0, 8, 16)
    assert groups.groups == tuple((t, t + 8, t + 16) for t in range(8))
    assert groups.source == "layout dp=3 tp=8 pp=1"


def test_layout_with_pipeline_stages():
    # rank = (pp_i * dp + dp_i) * tp + tp_i with dp=2, tp=2, pp=2.
    assert groups_from_layout(8, 2, 2, 2).groups == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_layout_pure_data_parallel():
    assert groups_from_layout(4, None, None, None).groups == ((0, 1, 2, 3),)


@pytest.mark.parametrize("dp,tp,pp", [(2, None, None), (3, 2, 1), (None, 3, None), (0, 4, 1)])
def test_layout_mismatch_is_a_usage_error(dp, tp, pp):
    with pytest.raises(UsageError, match="world size 8"):
        groups_from_layout(8, dp, tp, pp)


def test_two_sources_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="one replica-group source"):
        resolve_groups(4, groups_file=str(tmp_path / "g.json"), dp=2)


def test_no_source_means_singletons():
    groups = resolve_groups(3)
    assert groups.groups == ((0,), (1,), (2,))
    assert not groups.warnings


def test_partition_dedupes_and_sorts():
    result = partition(4, [[3, 1], [0, 2], [1, 3], [2, 0]], "x")
    assert result == ReplicaGroups(((0, 2), (1, 3)), "x", ())


def test_partition_uncovered_ranks_become_singletons():
    result = partition(5, [[0, 2]], "x")
    assert result.groups == ((0, 2), (1,), (3,), (4,))
    assert "ranks 1, 3, 4 are in no group" in result.warnings[0]


def test_partition_inconsistent_overlap_discards_source():
    result = partition(4, [[0, 1], [1, 2], [3]], "x")
    assert result.groups == singletons(4)
    assert result.source == f"{NO_GROUPS}; x unusable"
    assert "overlap inconsistently" in result.warnings[0] and "rank 1" in result.warnings[0]


def test_partition_out_of_range_discards_source():
    result = partition(4, [[0, 4], [1, 2, 3]], "x")
    assert result.groups == singletons(4)
    assert "outside 0..3" in result.warnings[0]


def test_groups_file_json_and_yaml(tmp_path):
    as_json = tmp_path / "g.json"
    as_json.write_text(json.dumps({"groups": [[0, 2], [1, 3]]}))
    as_yaml = tmp_path / "g.yaml"
    as_yaml.write_text("groups:\n  - [0, 2]\n  - [1, 3]\n")
    for path in (as_json, as_yaml):
        groups = resolve_groups(4, groups_file=str(path))
        assert groups.groups == ((0, 2), (1, 3)) and not groups.warnings


@pytest.mark.parametrize("content", ["groups: [[0, -1]]", "{groups: [[0, 1]], extra: 1}",
                                     "[[0, 1]]", "groups: [[0, 1]", "groups: [[]]"])
def test_bad_groups_file_falls_back(tmp_path, content):
    path = tmp_path / "g.yaml"
    path.write_text(content)
    groups = resolve_groups(2, groups_file=str(path))
    assert groups.groups == singletons(2)
    assert "invalid" in groups.warnings[0]


def test_missing_groups_file_falls_back(tmp_path):
    groups = resolve_groups(2, groups_file=str(tmp_path / "absent.json"))
    assert groups.groups == singletons(2) and groups.warnings


def test_real_group_info_files():
    groups = resolve_groups(4, group_info_root=str(REAL))
    assert groups.groups == ((0, 2), (1, 3))
    assert not groups.warnings


def test_truncated_file_loses_only_that_rank(tmp_path):
    root = tmp_path / "gi"
    shutil.copytree(REAL, root)
    data = (root / "device3" / "group_info.pb").read_bytes()
    (root / "device3" / "group_info.pb").write_bytes(data[:-3])
    groups = resolve_groups(4, group_info_root=str(root))
    # Rank 1's file still puts 3 in its group.
    assert groups.groups == ((0, 2), (1, 3))
    assert "device3" in groups.warnings[0] and "unusable" in groups.warnings[0]


def test_missing_files_leave_uncovered_ranks_alone(tmp_path):
    write_pb(tmp_path, 0, [0, 2])
    write_pb(tmp_path, 2, [0, 2])
    groups = resolve_groups(4, group_info_root=str(tmp_path))
    assert groups.groups == ((0, 2), (1,), (3,))
    assert any("no file for ranks 1, 3" in w for w in groups.warnings)


def test_list_without_own_rank_discards_all(tmp_path):
    # Every file claims {0, 2}: ranks 1 and 3 name a group they are not in (e.g. stale files).
    for rank in range(4):
        write_pb(tmp_path, rank, [0, 2])
    groups = resolve_groups(4, group_info_root=str(tmp_path))
    assert groups.groups == singletons(4)
    assert "leave out their own rank" in groups.warnings[0]


def test_inconsistent_group_info_discards_all(tmp_path):
    lists = {0: [0, 1], 1: [0, 1], 2: [1, 2], 3: [3]}
    for rank, ranks in lists.items():
        write_pb(tmp_path, rank, ranks)
    groups = resolve_groups(4, group_info_root=str(tmp_path))
    assert groups.groups == singletons(4)
    assert "overlap inconsistently" in groups.warnings[-1]


def test_group_info_ranks_beyond_world(tmp_path):
    write_pb(tmp_path, 0, [0, 8])
    write_pb(tmp_path, 1, [1])
    groups = resolve_groups(2, group_info_root=str(tmp_path))
    assert groups.groups == singletons(2)
    assert "outside 0..1" in groups.warnings[-1]
