"""Rank table files: the sibling ``version`` file, BOM, and one clear error per unreadable file."""

import json
import os

import pytest

from launcher.jobspec.ranktable import RankTableError, load_rank_table
from tests.helpers.paths import DATA

GOOD = DATA / "ranktables" / "good"


def good(name):
    return json.loads((GOOD / name).read_text())


def test_load_reads_revision_and_source(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(good("v1.0-two-servers.json")))
    assert load_rank_table(path).revision is None
    (tmp_path / "version").write_text("1700000123\n")
    table = load_rank_table(str(path))
    assert (table.source, table.revision) == (str(path), "1700000123")


def test_load_accepts_utf8_bom(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(good("v1.0-two-servers.json")).encode())
    assert load_rank_table(path).world_size == 4


@pytest.mark.parametrize("content, expected", [
    (b'{"status": "completed",\n  "version": "1.0"\n  "server_list": []}',
     "is not valid JSON: line 3 column 3"),
    (b"", "is empty"),
    (b"  \n", "is empty"),
    (b'{"status": "\xff"}', "is not UTF-8"),
])
def test_malformed_file_names_file_and_position(tmp_path, content, expected):
    path = tmp_path / "hccl.json"
    path.write_bytes(content)
    with pytest.raises(RankTableError) as info:
        load_rank_table(path)
    assert str(path) in info.value.message and expected in info.value.message


def test_missing_file(tmp_path):
    with pytest.raises(RankTableError, match="not found"):
        load_rank_table(tmp_path / "nope.json")


def test_directory_is_not_a_rank_table(tmp_path):
    with pytest.raises(RankTableError, match="is a directory, not a regular file"):
        load_rank_table(tmp_path)


def test_unreadable_file(tmp_path):
    path = tmp_path / "hccl.json"
    path.symlink_to(path)  # a loop: open() fails with ELOOP
    with pytest.raises(RankTableError, match="cannot read rank table"):
        load_rank_table(path)


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.write_bytes(b"\xff\xfe1\x007\x00"), "is UTF-16 text"),
    (lambda p: p.write_bytes(b"17\x00\n00"), "is not one line of text"),
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.write_bytes(b"1" * 5000), "is larger than 4 KiB"),
])
def test_bad_version_file_names_the_version_file(tmp_path, make, problem):
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(good("v1.0-two-servers.json")))
    make(tmp_path / "version")
    with pytest.raises(RankTableError) as info:
        load_rank_table(path)
    assert info.value.message.startswith(f"rank table version file {tmp_path / 'version'} {problem}")
    assert not info.value.problems
