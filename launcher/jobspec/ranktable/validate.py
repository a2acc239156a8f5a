"""Full validation of a rank table: every problem, each with its JSON path.

The structure is checked against the JSON Schema of the table's version (``schemas/ranktable-<v>
.schema.json``); the rules a schema cannot express come from the same walk the parser uses
(:func:`launcher.jobspec.ranktable.walk.semantic_problems`), so both always agree on what is wrong.
jsonschema is imported only here, and only when a table is validated.
"""

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
    errors = _validator(data["version"]).iter_errors(document)
    problems = {f"{json_path(e.absolute_path)}: {_message(e)}" for e in errors}
    problems.update(semantic_problems(data))
    return sorted(problems, key=_natural_key)


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
