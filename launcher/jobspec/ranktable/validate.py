"""Full validation of a rank table: every problem, each with its JSON path.

The structure is checked against the JSON Schema of the table's version (``schemas/ranktable-<v>
.schema.json``); the rules a schema cannot express come from the same walk the parser uses
(:func:`launcher.jobspec.ranktable.walk.semantic_problems`), so both always agree on what is wrong.

Validate fast, explain slowly: the schema is first compiled to Python code by fastjsonschema
(pass/fail, about 30 ms for a 512 x 16 table with the schema's ``$ref``s inlined, where jsonschema's
interpreter takes about a second); only a table that fails is walked again by jsonschema, whose
errors give the messages. fastjsonschema knows drafts 4, 6 and 7, not the schemas' 2020-12, so it
compiles them as draft 7: the keywords they use (type, const, required, properties, items as one
schema, minItems, minLength, pattern, minimum, ``$ref`` alone in its object) mean the same in both,
which :func:`draft7_compatible` checks.
Both libraries are imported only here, and only when a table is validated.
"""

import copy
import re
import reprlib
from functools import lru_cache
from typing import Any, Iterable, List, Mapping, Union

from launcher.jobspec.ranktable.walk import semantic_problems, version_problem
from launcher.common.resources import load_schema

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_MESSAGE = 200

_brief = reprlib.Repr()
_brief.maxstring = 40
_brief.maxother = 40
_brief.maxlist = _brief.maxdict = 3
_brief.maxlevel = 2


def validate_rank_table(data: Any) -> List[str]:
    """Every problem with ``data``, one string each: ``<JSON path>: <message>``.

    Args:
        data: A decoded rank table (any JSON value).

    Returns:
        The problems in a stable order (paths compared with their indices as numbers); empty when
        the table is valid and ``completed``.
    """
    if not isinstance(data, Mapping):
        return [f"$: expected a JSON object, got {'null' if data is None else type(data).__name__}"]
    problem = version_problem(data)
    if problem:
        return [problem]
    document = dict(data)  # jsonschema accepts only dict as a JSON object
    problems = set() if _passes(data["version"], document) else {
        f"{json_path(e.absolute_path)}: {_message(e)}" for e in _validator(data["version"]).iter_errors(document)}
    problems.update(semantic_problems(data))
    return sorted(problems, key=_natural_key)


def _passes(version: str, document: dict) -> bool:
    import fastjsonschema

    try:
        _compiled(version)(document)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


#: Keywords whose draft-7 meaning equals their 2020-12 meaning (``items`` only as a single schema).
DRAFT7_SAFE = frozenset({"$schema", "$id", "$ref", "$defs", "title", "description", "type", "const", "enum",
                         "required", "properties", "items", "minItems", "minLength", "pattern", "minimum"})


def draft7_compatible(schema: Any) -> bool:
    """True when ``schema`` (2020-12) validates the same as a draft-7 schema: only ``DRAFT7_SAFE``
    keywords, ``items`` never a list, and ``$ref`` never beside other keywords (draft 7 ignores them)."""
    if isinstance(schema, list):
        return all(draft7_compatible(item) for item in schema)
    if not isinstance(schema, Mapping):
        return True
    if "$ref" in schema and len(schema) > 1 or isinstance(schema.get("items"), list):
        return False
    for key, value in schema.items():
        if key in ("properties", "$defs"):
            if not all(draft7_compatible(sub) for sub in value.values()):
                return False
        elif key not in DRAFT7_SAFE or not draft7_compatible(value):
            return False
    return True


@lru_cache(maxsize=None)
def _compiled(version: str) -> Any:
    import fastjsonschema

    # A copy: fastjsonschema rewrites the ``$ref``s of the schema it is given in place, and
    # load_schema's result is shared (jsonschema reads it too).
    schema = copy.deepcopy(load_schema(f"ranktable-{version}.schema.json"))
    schema = inline_refs(schema, schema.get("$defs", {}))  # keeps $defs as they are
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"  # see the module docstring
    return fastjsonschema.compile(schema, use_default=False)


_LOCAL_DEF = "#/$defs/"
_VALUES = ("const", "enum", "$defs")  # values, not schemas: never rewritten


def inline_refs(schema: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """``schema`` with each ``{"$ref": "#/$defs/<name>"}`` replaced by that definition.

    The same validation (a ``$ref`` stands alone in its object: :func:`draft7_compatible`), but
    fastjsonschema compiles a ``$ref`` to a function call that builds its error path eagerly, a
    string format per device: inlined, a 512 x 16 table validates in about half the time. A
    definition nested deeper than 8 references is left as a ``$ref`` (the schemas have no cycles).
    """
    if isinstance(schema, list):
        return [inline_refs(item, defs, depth) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_LOCAL_DEF) and len(schema) == 1 and depth < 8 \
            and ref[len(_LOCAL_DEF):] in defs:
        return inline_refs(defs[ref[len(_LOCAL_DEF):]], defs, depth + 1)
    return {key: value if key in _VALUES else inline_refs(value, defs, depth) for key, value in schema.items()}


@lru_cache(maxsize=None)
def _validator(version: str) -> Any:
    import jsonschema

    schema = load_schema(f"ranktable-{version}.schema.json")
    return jsonschema.validators.validator_for(schema)(schema)


def json_path(parts: Iterable[Union[str, int]]) -> str:
    """JSONPath of a location given as keys and indices, e.g. ``$.server_list[1].device[0]``."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _IDENTIFIER.match(part):
            path += f".{part}"
        else:
            path += f"[{part!r}]"
    return path


def _message(error: Any) -> str:
    if error.validator == "type":
        expected = error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        return f"{_brief.repr(error.instance)} is not of type {' or '.join(repr(t) for t in names)}"
    message = error.message
    # Messages repeat the offending value; a whole server_list must not become one huge line.
    return message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE - 3] + "..."


def _natural_key(text: str) -> List[Any]:
    # "[10]" sorts after "[9]".
    # re.split with a group alternates text and digit runs: odd positions are the numbers.
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]
