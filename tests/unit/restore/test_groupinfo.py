"""group_info.pb reading: the runtime descriptor, real protoc-encoded bytes, and corrupt input."""


import pytest
from google.protobuf import descriptor_pb2

from launcher.restore import groupinfo
from launcher.restore.groupinfo import (ProtoSyntaxError, file_descriptor_proto,
                                        parallel_group_map_class, parse_restore_rank_list)
from tests.helpers.paths import DATA as TEST_DATA

DATA = TEST_DATA / "restore"
REAL = DATA / "group_info_dp2_tp2"


def real_bytes(rank: int) -> bytes:
    return (REAL / f"device{rank}" / "group_info.pb").read_bytes()


def test_descriptor_matches_protoc():
    protoc = descriptor_pb2.FileDescriptorSet()
    protoc.ParseFromString((DATA / "group_info.protoc.desc").read_bytes())
    ours = file_descriptor_proto()
    # Older protoc releases spell out syntax "proto2"; newer ones leave it unset. Same meaning.
    expected = protoc.file[0]
    if expected.syntax == "proto2":
        expected.ClearField("syntax")
    assert ours == expected


@pytest.mark.parametrize("rank,expected", [(0, (0, 2)), (1, (1, 3)), (2, (0, 2)), (3, (1, 3))])
def test_real_protoc_encoded_files(rank, expected):
    assert parse_restore_rank_list(real_bytes(rank)) == expected


def test_every_truncation_of_a_real_file_is_rejected():
    data = real_bytes(1)
    for length in range(len(data)):
        with pytest.raises(ValueError):
            parse_restore_rank_list(data[:length])


@pytest.mark.parametrize("data", [b"", b"\xff\xff\xff", b"not a protobuf at all"])
def test_garbage_is_rejected(data):
    with pytest.raises(ValueError):
        parse_restore_rank_list(data)


def test_missing_or_empty_restore_list_is_rejected():
    cls = parallel_group_map_class()
    only_items = cls()
    item = only_items.parallel_group_item.add(group_name="g")
    item.parallel_group_ranks.dim.extend([0, 1])
    with pytest.raises(ValueError, match="truncated"):
        parse_restore_rank_list(only_items.SerializePartialToString())
    empty_list = cls()
    empty_list.ckpt_restore_rank_list.SetInParent()
    with pytest.raises(ValueError, match="empty"):
        parse_restore_rank_list(empty_list.SerializeToString())


def test_unknown_fields_from_newer_mindspore_are_skipped():
    # Field 7, varint 1: something a newer node_strategy.proto might add.
    assert parse_restore_rank_list(real_bytes(0) + b"\x38\x01") == (0, 2)


def test_roundtrip_with_built_class():
    message = parallel_group_map_class()()
    message.ckpt_restore_rank_list.dim.extend([3, 11, 19])
    assert parse_restore_rank_list(message.SerializeToString()) == (3, 11, 19)


@pytest.mark.parametrize("text,error", [
    ('syntax = "proto3";', "only proto2"),
    ("enum Kind { A = 0; }", "unsupported top-level"),
    ("message M { map<string, int32> m = 1; }", "unexpected character"),
    ("message M { int32 x = 1; }", "unsupported field label"),
    ("message M { required int32 x = 1;", "unexpected end"),
])
def test_parser_rejects_what_it_does_not_understand(text, error):
    with pytest.raises(ProtoSyntaxError, match=error):
        groupinfo._Parser(groupinfo._tokens(text)).parse("x.proto")
