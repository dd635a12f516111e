"""The JSON Schema keywords structured output enforces, checked before any grammar engine sees the schema: a keyword
one of the engines would ignore (xgrammar compiles `uniqueItems`, `not`, `if`... without enforcing them) is refused,
so what is accepted, and guaranteed, is the same whichever engine runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import StructuredOutputError

#: Validation keywords neither engine enforces (or only one does): refused with the path where they occur.
UNSUPPORTED = frozenset({
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "additionalItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "patternProperties",
})
#: Regular-expression features the engines' automata cannot match (look-around, back-references).
_UNSUPPORTED_REGEX = re.compile(r"\(\?<?[=!]|\\[1-9]|\\k<")
SUPPORTED = ("type, properties, required, additionalProperties, items, prefixItems, enum, const, anyOf, oneOf, "
             "allOf, $ref/$defs, minLength/maxLength, pattern, format, minimum/maximum, minItems/maxItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties")


def check_schema(schema: Any, engine_check: Callable[[dict[str, Any]], str | None] | None = None) -> None:
    """Raise `StructuredOutputError` naming the first keyword of `schema` (with its JSON pointer) that structured output
    cannot enforce; `engine_check(subschema)` returns what one grammar engine cannot enforce there, or None."""
    for path, node in _walk(schema, "#"):
        problem = _problem(node) or (engine_check(node) if engine_check is not None else None)
        if problem:
            raise StructuredOutputError(f"the JSON schema at {path}: {problem}")


def _problem(node: dict[str, Any]) -> str | None:
    for key in sorted(UNSUPPORTED & node.keys()):
        return f"{key!r} cannot be enforced by structured output: remove it (supported: {SUPPORTED})."
    pattern = node.get("pattern")
    if isinstance(pattern, str) and _UNSUPPORTED_REGEX.search(pattern):
        return (f"pattern {pattern!r} uses look-around or a back-reference, which structured output cannot match: "
                "rewrite it without them.")
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if isinstance(node.get("required"), list) else []
    missing = [key for key in required if key not in properties]
    if missing and node.get("additionalProperties") is False:
        return (f"required {missing} are not in properties and additionalProperties is false, so no object can "
                "match: add them to properties.")
    return None


def _walk(schema: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema of `schema` that is an object, with its JSON pointer."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"the JSON schema at {path} must be an object or a boolean, not "
                                    f"{type(schema).__name__} ({schema!r:.60}).")
    yield path, schema
    for key in _SCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _walk(child, f"{path}/{key}/{_escape(name)}")
    for key in _SCHEMA_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from _walk(child, f"{path}/{key}/{index}")
    for key in _SCHEMA_ONE:
        if key in schema and not isinstance(schema[key], list):
            yield from _walk(schema[key], f"{path}/{key}")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
