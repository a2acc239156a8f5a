"""Validating rank tables: schemas per version, semantic rules, JSON paths, the malformed corpus."""

import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.errors import UsageError
from launcher.jobspec.ranktable import RankTableError, generate_rank_table, load_rank_table, validate_rank_table
from launcher.jobspec.ranktable.validate import (_compiled, _passes, _validator, draft7_compatible, inline_refs,
                                                 json_path)
from launcher.common.resources import load_schema
from tests.helpers.paths import DATA as TEST_DATA

DATA = TEST_DATA / "ranktables"
BAD = DATA / "bad"
EXPECTED = json.loads((BAD / "expected.json").read_text())
PATH_PREFIX = re.compile(r"^\$(\.[A-Za-z_]\w*|\[\d+\])*: ")


@pytest.mark.parametrize("version", ["1.0", "1.2", "2.0"])
def test_schemas_are_valid_json_schemas(version):
    schema = load_schema(f"ranktable-{version}.schema.json")
    jsonschema.validators.validator_for(schema).check_schema(schema)


@pytest.mark.parametrize("path", sorted((DATA / "good").glob("*.json")), ids=lambda p: p.name)
def test_good_tables_have_no_problems(path):
    assert validate_rank_table(json.loads(path.read_text())) == []


def test_corpus_is_complete():
    assert sorted(EXPECTED) == sorted(p.name for p in BAD.glob("*.json") if p.name != "expected.json")


def _matches(problems, fragments):
    """One problem per expected fragment, in order: nothing missing, nothing extra."""
    return len(problems) == len(fragments) and all(f in p for p, f in zip(problems, fragments))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_table_reports_exactly_its_problems_with_json_paths(name):
    problems = validate_rank_table(json.loads((BAD / name).read_text()))
    assert _matches(problems, EXPECTED[name]), problems
    assert all(PATH_PREFIX.match(p) for p in problems), problems


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_table_fails_to_load_with_a_usage_error(name):
    with pytest.raises(UsageError) as info:
        load_rank_table(BAD / name)
    assert isinstance(info.value, RankTableError) and info.value.exit_code == 2
    assert str(BAD / name) in info.value.message
    assert _matches(info.value.problems, EXPECTED[name]), info.value.problems


def test_every_problem_is_reported_in_natural_order():
    data = generate_rank_table([(f"h{i}", 1) for i in range(12)])
    for index in (10, 2):
        data["server_list"][index]["device"][0]["device_id"] = "x"
    data["server_count"] = "5"
    assert validate_rank_table(data) == [
        "$.server_count: says 5 but server_list has 12 servers",
        "$.server_list[2].device[0].device_id: 'x' does not match '^[0-9]+$'",
        "$.server_list[10].device[0].device_id: 'x' does not match '^[0-9]+$'",
    ]


def test_not_ready_table_is_a_problem():
    data = generate_rank_table([("a", 1)], status="initializing")
    assert validate_rank_table(data) == [
        '$.status: the table is not ready: status "initializing" (expected "completed")']


def test_unknown_version_stops_validation():
    assert validate_rank_table({"version": "0.9", "server_list": 3}) == [
        "$.version: unsupported rank table version '0.9' (supported: 1.0, 1.2, 2.0)"]


def test_non_object_document():
    assert validate_rank_table(None) == ["$: expected a JSON object, got null"]


def test_large_values_are_abbreviated():
    data = generate_rank_table([(f"h{i}", 8) for i in range(50)])
    data["server_list"] = {"servers": data["server_list"]}
    (problem,) = validate_rank_table(data)
    assert problem.startswith("$.server_list: {'servers': [{") and problem.endswith("is not of type 'array'")
    assert len(problem) < 120


def test_long_messages_are_cut():
    data = generate_rank_table([("a", 1)])
    data["server_list"][0]["server_id"] = ""
    data["server_list"][0]["device"][0]["device_id"] = "x" * 300
    problems = validate_rank_table(data)
    assert all(len(p) < 260 for p in problems)
    assert any(p.endswith("...") for p in problems)


def test_duplicate_server_ids_are_allowed_for_pods_on_one_node():
    """Two pods on one node share server_id (the node IP) and differ by container_ip."""
    data = generate_rank_table([("10.0.0.1", 2), ("10.0.0.2", 2)])
    data["server_list"][1]["server_id"] = "10.0.0.1"
    data["server_list"][0]["container_ip"] = "172.16.0.1"
    data["server_list"][1]["container_ip"] = "172.16.0.2"
    assert validate_rank_table(data) == []


def test_problems_after_a_skipped_entry_are_still_found():
    data = generate_rank_table([("a", 2), ("b", 2)])
    data["server_list"][0]["device"][0]["rank_id"] = 0  # wrong type: reported by the schema
    data["server_list"][1]["device"][1]["device_id"] = "0"  # duplicate: found by the semantic walk
    problems = validate_rank_table(data)
    assert "$.server_list[0].device[0].rank_id: 0 is not of type 'string'" in problems
    assert any(p.startswith("$.server_list[1].device[1].device_id: duplicate device_id 0") for p in problems)


@pytest.mark.parametrize("parts, expected", [
    ((), "$"),
    (("server_list", 1, "device", 0, "rank_id"), "$.server_list[1].device[0].rank_id"),
    (("odd key", 2), "$['odd key'][2]"),
])
def test_json_path(parts, expected):
    assert json_path(parts) == expected


@pytest.mark.parametrize("version", ["1.0", "1.2", "2.0"])
def test_schemas_mean_the_same_compiled_as_draft_7(version):
    """The compiled validator reads the 2020-12 schemas as draft 7: only keywords of equal meaning."""
    assert draft7_compatible(load_schema(f"ranktable-{version}.schema.json"))


@pytest.mark.parametrize("schema", [
    {"properties": {"a": {"$ref": "#/$defs/x", "minLength": 1}}},  # draft 7 ignores $ref's siblings
    {"items": [{"type": "string"}]},  # a list of schemas: draft 7 tuple items, gone in 2020-12
    {"prefixItems": [{"type": "string"}]},
    {"$defs": {"x": {"unevaluatedProperties": False}}},
])
def test_schemas_with_draft_specific_keywords_are_not_draft_7_compatible(schema):
    assert not draft7_compatible(schema)


def test_inline_refs_replaces_local_references_and_leaves_values_alone():
    defs = {"uint": {"type": "string", "pattern": "^[0-9]+$"},
            "device": {"type": "object", "properties": {"rank_id": {"$ref": "#/$defs/uint"}}}}
    schema = {"type": "array", "items": {"$ref": "#/$defs/device"},
              "const": {"$ref": "#/$defs/uint"}, "$defs": defs}
    out = inline_refs(schema, defs)
    assert out["items"] == {"type": "object", "properties": {"rank_id": defs["uint"]}}  # nested too
    assert out["const"] == {"$ref": "#/$defs/uint"}  # a value, not a schema
    assert out["$defs"] is defs
    assert inline_refs({"$ref": "#/$defs/missing"}, defs) == {"$ref": "#/$defs/missing"}
    looping = {"a": {"$ref": "#/$defs/a"}}
    assert "$ref" in str(inline_refs({"$ref": "#/$defs/a"}, looping))  # a cycle stops, left as a $ref


@pytest.mark.parametrize("version", ["1.0", "1.2", "2.0"])
def test_the_compiled_schemas_have_no_references_left_and_the_shared_schema_is_untouched(version):
    """Inlined, fastjsonschema makes no call per device (each built its error path eagerly). It
    rewrites the references of the schema it compiles in place: never those of the shared one."""
    before = json.dumps(load_schema(f"ranktable-{version}.schema.json"), sort_keys=True)
    _compiled.cache_clear()
    _compiled(version)
    schema = load_schema(f"ranktable-{version}.schema.json")
    assert json.dumps(schema, sort_keys=True) == before
    assert "#/$defs/" in before and "https://" not in before.split('"$ref"', 1)[1][:40]
    assert "$ref" not in json.dumps({k: v for k, v in inline_refs(schema, schema["$defs"]).items() if k != "$defs"})


_GOOD = sorted((DATA / "good").glob("*.json"))
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                  st.sampled_from(["", "0", "01", "x", "1.2.3.4", "completed", "1.0"]),
                  st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.sampled_from(["a", "rank_id"]),
                                                                           st.text(max_size=2), max_size=2))


def _locations(value, path=()):
    """Every (container, key) pair in a decoded JSON document."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield value, key
        yield from _locations(child, path + (key,))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_GOOD), st.lists(st.tuples(st.integers(0, 10 ** 6), st.booleans(), _JUNK), max_size=4))
def test_compiled_validator_agrees_with_jsonschema(path, edits):
    """Differential: on mutated tables the fast pass/fail equals "jsonschema found no error"."""
    data = json.loads(path.read_text())
    for where, delete, junk in edits:
        spots = list(_locations(data))
        if not spots:  # everything deleted
            break
        container, key = spots[where % len(spots)]
        if delete and isinstance(container, dict):
            del container[key]
        else:
            container[key] = junk
    version = data.get("version")
    if version not in ("1.0", "1.2", "2.0"):
        return
    slow_ok = not any(_validator(version).iter_errors(data))
    assert _passes(version, data) == slow_ok
