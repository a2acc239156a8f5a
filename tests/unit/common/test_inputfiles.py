"""The one reader of input files: regular files only, bounded size and nesting, strict UTF-8, one line."""

import json
import os
import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common import inputfiles
from launcher.common.inputfiles import (INCOMPLETE, LIMIT_CONFIG, LIMIT_REPORT, MALFORMED, MAX_DEPTH, MAX_NUMBER,
                                        InputFileError,
                                        loads_json, nests_too_deep, read_bytes, read_json, read_line)
from launcher.common.inputfiles import LIMIT_RECORD, read_record
from launcher.common.inputrecords import INT, INTS, NUMBER, OR_NONE, TEXT, JsonLines, typed
from launcher.common.inputyaml import read_yaml
from tests.helpers.paths import DATA

CORPUS = DATA / "malformed"
CORPUS_FILES = sorted(p.name for p in CORPUS.iterdir() if p.name != "README.md")


def special_files(tmp_path):
    """The corpus cases that cannot be committed: ``name -> path``, made now."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(inputfiles.LIMIT_RANK_TABLE + 1)  # sparse: costs no disk
    directory = tmp_path / "dir"
    directory.mkdir()
    return {"fifo": fifo, "dev-zero": zero, "symlink-loop": loop, "oversize": big, "directory": directory}


def one_line_error(call):
    """Run ``call``; it must fail with an InputFileError or OSError whose text is one line."""
    with pytest.raises((InputFileError, OSError)) as info:
        call()
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    return info.value


# -- files that are not regular files ------------------------------------------------------------
@pytest.mark.parametrize("name, problem", [
    ("fifo", "is a FIFO (named pipe), not a regular file"),
    ("dev-zero", "is a character device, not a regular file"),
    ("directory", "is a directory, not a regular file"),
    ("oversize", "is larger than 16 MiB, the limit for a rank table"),
])
def test_special_files_are_refused_at_once(tmp_path, name, problem):
    path = special_files(tmp_path)[name]
    # A FIFO without a writer blocked open() forever; the thread shows it no longer does.
    done = threading.Event()
    errors = []

    def read():
        try:
            read_json(str(path), "rank table", inputfiles.LIMIT_RANK_TABLE)
        except InputFileError as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(30), "the read hung"
    assert str(errors[0]) == f"rank table {path} {problem}" and errors[0].reason == MALFORMED


def test_symlink_loop_is_an_os_error(tmp_path):
    error = one_line_error(lambda: read_bytes(str(special_files(tmp_path)["symlink-loop"]), "x", 10))
    assert not isinstance(error, InputFileError)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(str(tmp_path / "absent"), "x", 10)


def test_size_limit_is_exact(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bytes(str(path), "f", 10) == b"x" * 10
    with pytest.raises(InputFileError, match="is larger than 0 KiB"):
        read_bytes(str(path), "f", 9)


def test_files_without_a_size_are_read_within_the_limit():
    """/proc files say size 0; their content is still read, and still bounded."""
    assert b"Name:" in read_bytes("/proc/self/status", "status", LIMIT_CONFIG)
    with pytest.raises(InputFileError, match="is larger than"):
        read_bytes("/proc/self/status", "status", 16)


def test_symlinks_are_followed(tmp_path):
    """ConfigMap volumes are made of symlinks: a link to a regular file is fine."""
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to("real.json")
    assert read_json(str(tmp_path / "link.json"), "x", 100) == {"a": 1}


# -- content ------------------------------------------------------------------------------------
EXPECTED_JSON = {
    "utf16-bom.json": "is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8",
    "utf16-be-bom.json": "is UTF-16 text",
    "utf32-bom.json": "is UTF-32 text",
    "latin1.json": "is not UTF-8 (byte 0xe9 at offset 15, line 1: invalid continuation byte)",
    "deep-arrays.json": f"nests arrays or objects deeper than {MAX_DEPTH} levels",
    "deep-objects.json": "nests arrays or objects deeper",
    "deep-unclosed.json": "nests arrays or objects deeper",
    "deep-behind-string.json": "nests arrays or objects deeper",
    "long-integer.json": "has an integer of more than 4300 digits at line 1",
    "long-integer-in-list.json": "has an integer of more than 4300 digits at line 1",
    "nul-byte.json": "is not valid JSON: line 1 column 14: Invalid control character at",
    "binary.json": "is not UTF-8",
    "yaml-alias-bomb.yaml": "is not valid JSON",
    "yaml-deep-indent.yaml": "is not valid JSON",
    "yaml-long-integer.yaml": "is not valid JSON",
    "yaml-bad-date.yaml": "is not valid JSON",
    "truncated.json": "is not valid JSON: line 1 column 73: Unterminated string",
    "empty.json": "is empty",
    "blank.json": "is empty",
}
INCOMPLETE_CASES = {"truncated.json", "empty.json", "blank.json", "nul-byte.json", "yaml-alias-bomb.yaml",
                    "yaml-deep-indent.yaml", "yaml-long-integer.yaml", "yaml-bad-date.yaml"}


def test_expectations_cover_the_corpus():
    assert sorted(EXPECTED_JSON) == CORPUS_FILES


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_as_json(name):
    path = str(CORPUS / name)
    error = one_line_error(lambda: read_json(path, "reset.json", LIMIT_REPORT))
    assert str(error).startswith(f"reset.json {path} {EXPECTED_JSON[name]}")
    # Only what a writer still at work can explain is worth waiting for.
    assert error.reason == (INCOMPLETE if name in INCOMPLETE_CASES else MALFORMED)


EXPECTED_YAML = {
    "utf16-bom.json": "is UTF-16 text",
    "utf16-be-bom.json": "is UTF-16 text",
    "utf32-bom.json": "is UTF-32 text",
    "latin1.json": "is not UTF-8",
    "deep-arrays.json": f"nests deeper than {MAX_DEPTH} levels (line 1)",
    "deep-objects.json": f"nests deeper than {MAX_DEPTH} levels (line 1)",
    "deep-unclosed.json": "nests deeper than",
    "deep-behind-string.json": "nests deeper than",
    "long-integer.json": "has an integer of more than 4300 digits at line 1",
    "long-integer-in-list.json": "has an integer of more than 4300 digits at line 1",
    "nul-byte.json": "is not valid YAML: unacceptable character #x0000",
    "binary.json": "is not UTF-8",
    "yaml-alias-bomb.yaml": "uses an alias (line 2); aliases are not supported",
    "yaml-deep-indent.yaml": f"nests deeper than {MAX_DEPTH} levels (line {MAX_DEPTH})",
    "yaml-long-integer.yaml": "has an integer of more than 4300 digits at line 1",
    "yaml-bad-date.yaml": "holds a value that cannot be converted (month must be in 1..12)",
    "truncated.json": "is not valid YAML: while scanning a quoted scalar",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_YAML))
def test_corpus_as_yaml(name):
    path = str(CORPUS / name)
    error = one_line_error(lambda: read_yaml(path, "config file", LIMIT_CONFIG))
    assert str(error).startswith(f"config file {path} {EXPECTED_YAML[name]}")


def test_empty_yaml_is_none():
    assert read_yaml(str(CORPUS / "empty.json"), "config file", LIMIT_CONFIG) is None


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "f.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": [1]}')
    assert read_json(str(path), "x", 100) == {"a": [1]}
    assert read_yaml(str(path), "x", 100) == {"a": [1]}


def test_nesting_up_to_the_limit_is_accepted(tmp_path):
    deepest = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads_json(deepest.encode(), "p", "x") == json.loads(deepest)
    path = tmp_path / "deep.yaml"
    path.write_text(deepest)
    assert read_yaml(str(path), "x", 1000) == json.loads(deepest)
    with pytest.raises(InputFileError, match="deeper"):
        loads_json(("[" + deepest + "]").encode(), "p", "x")


@pytest.mark.parametrize("content, problem", [
    (b"1.5\n", None),
    (b"  1700000000 \n", None),
    (b"", None),
    (b"17000\x0000", "is not one line of text (it holds '\\x00')"),
    (b"1700\n0000", "is not one line of text (it holds '\\n')"),
    (b"\xff\xfe1\x007\x00", "is UTF-16 text"),
])
def test_read_line(tmp_path, content, problem):
    path = tmp_path / "version"
    path.write_bytes(content)
    if problem is None:
        assert read_line(str(path), "version file") == (content.strip().decode() or None)
    else:
        with pytest.raises(InputFileError, match=re.escape(problem)):
            read_line(str(path), "version file")


# -- properties ---------------------------------------------------------------------------------
SCALARS = st.none() | st.booleans() | st.integers(-MAX_NUMBER, MAX_NUMBER) \
    | st.floats(-MAX_NUMBER, MAX_NUMBER, allow_nan=False) | st.text(alphabet=st.sampled_from(
    list('[]{}"\\ax\n\u00e9\u4e2d')), max_size=8)
VALUES = st.recursive(SCALARS, lambda children: st.lists(children, max_size=3)
                      | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), children, max_size=3),
                      max_leaves=12)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


def wrapped(value, levels: int, kinds: str):
    for i in range(levels):
        value = [value] if kinds[i % len(kinds)] == "a" else {"k]": value}
    return value


@settings(max_examples=200, deadline=None)
@given(VALUES, st.integers(0, MAX_DEPTH + 20), st.sampled_from(["a", "o", "ao"]), st.booleans())
def test_nesting_check_agrees_with_the_real_depth(value, levels, kinds, indent):
    """Brackets and escaped quotes inside strings never fool the check, in either direction."""
    doc = wrapped(value, levels, kinds)
    text = json.dumps(doc, indent=1 if indent else None, ensure_ascii=False).encode()
    assert nests_too_deep(text) == (depth(doc) > MAX_DEPTH)
    if depth(doc) <= MAX_DEPTH:
        assert loads_json(text, "p", "x") == doc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(alphabet='[]{}":,0123456789 \\"\n\u00e9a', max_size=300).map(str.encode))
def test_any_bytes_give_a_value_or_one_line(data):
    try:
        loads_json(data, "p", "x")
    except InputFileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("x p ")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='[]{}-:&*!|>?, \n\tax1\u00e9"\'#%@`', max_size=200))
def test_any_yaml_gives_a_value_or_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        read_yaml(str(path), "config file", LIMIT_CONFIG)
    except InputFileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"config file {path} ")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=50))
def test_utf8_text_round_trips(text):
    assert inputfiles.decode_text(text.encode("utf-8"), "p", "x") == text


# -- numbers, symlinks, records, JSON lines (issue #27) --------------------------------------------
@pytest.mark.parametrize("text", ["1e999", "-1e999", "[NaN]", '{"a": Infinity}', "-Infinity", "9223372036854775809",
                                  "-9223372036854775809", "1e19", '{"x": "e99", "n": 1e300}',
                                  "12345678901.5e9", "[1E+0019]"])
def test_numbers_out_of_range_are_refused(text):
    """1e999 was ``inf`` to json.loads and OverflowError to every ``int()`` after it."""
    with pytest.raises(InputFileError, match=r"holds a number out of range \(.*\): numbers must be finite"):
        loads_json(text.encode(), "p", "record")


@pytest.mark.parametrize("text, value", [("9223372036854775808", MAX_NUMBER), ("-9223372036854775808", -MAX_NUMBER),
                                         ("1.5e18", 1.5e18), ("1e-300", 1e-300), ('{"h": "e12345678901234567890"}',
                                                                                  {"h": "e12345678901234567890"})])
def test_numbers_in_range_and_look_alikes_in_strings_are_kept(text, value):
    assert loads_json(text.encode(), "p", "record") == value


@pytest.mark.parametrize("text", ["a: .inf", "a: 1.0e+999", "a: .nan", "a: 99999999999999999999"])
def test_yaml_numbers_out_of_range_are_refused(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputFileError, match="number out of range"):
        read_yaml(str(path), "config file", LIMIT_CONFIG)


def test_read_record_refuses_symlinks_and_reads_relative_to_a_dir_fd(tmp_path):
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to("real.json")
    with pytest.raises(InputFileError, match="is a symlink, refused here"):
        read_record(str(tmp_path / "link.json"), "state file")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_record("real.json", "state file", dir_fd=fd) == {"a": 1}
    finally:
        os.close(fd)
    (tmp_path / "big.json").write_bytes(b" " * (LIMIT_RECORD + 1))
    with pytest.raises(InputFileError, match="is larger than 1 MiB"):
        read_record(str(tmp_path / "big.json"), "state file")


def test_json_lines_skip_what_is_not_an_object_and_long_lines_while_reading(tmp_path):
    path = tmp_path / "events.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"a": 1}\n[1, 2]\n\xff\xfe\n' + b"[" * 1000 + b"\n" + b'{"n": 1e999}\n')
        fh.write(b'{"pad": "' + b"x" * 5000 + b'"}\n')  # over the line limit below
        fh.write(b'{"b": 2}\n{"torn": ')
    lines = JsonLines(str(path), "events file", line_limit=1024, block=300)
    assert lines.objects() == [{"a": 1}, {"b": 2}]
    assert lines.skipped == 6


def test_json_lines_refuse_fifos_and_symlinks_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="FIFO"):
        JsonLines(str(tmp_path / "fifo"), "events file").objects()
    with pytest.raises(InputFileError, match="symlink"):
        JsonLines(str(tmp_path / "zero"), "events file").objects()
    assert JsonLines(str(tmp_path / "absent"), "events file").objects() == []


@pytest.mark.parametrize("record, problem", [
    ({"rank": 1, "ranks": [1, 2], "ts": 1.5, "name": "x"}, None),
    ({"rank": True}, "its 'rank' is bool, not int"),
    ({"rank": None}, "its 'rank' is NoneType, not int"),
    ({"ranks": [1, "2"]}, "its 'ranks' is not a list of integers"),
    ({"ts": "1"}, "its 'ts' is str, not int or float"),
    ({"note": None}, None),
])
def test_typed(record, problem):
    assert typed(record, {"rank": INT, "ranks": INTS, "ts": NUMBER, "name": TEXT, "note": TEXT + OR_NONE}) == problem


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2 ** 70, 2 ** 70))
def test_the_number_bound_is_exact(number):
    """The fast hint never lets a number out of range through, whatever its spelling."""
    for text in {json.dumps(number), repr(number).replace("e+", "e"), f"{number:.6e}" if isinstance(number, float)
                 else str(number)}:
        if abs(number) <= MAX_NUMBER and "e" not in text.lower():
            assert loads_json(text.encode(), "p", "x") == json.loads(text)
        elif abs(json.loads(text)) > MAX_NUMBER:
            with pytest.raises(InputFileError, match="out of range"):
                loads_json(text.encode(), "p", "x")
