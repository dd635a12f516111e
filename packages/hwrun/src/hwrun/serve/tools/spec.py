"""The tool fields of a request (`tools`, `tool_choice`, `parallel_tool_calls`), JSON Schemas checked before
any work, and the constraints that make `tool_choice` `required` or a named function produce valid calls.

`required` constrains the answer to vLLM's shape, a JSON array of `{"name", "parameters"}` objects (at least one;
`anyOf` over the tools; at most one when `parallel_tool_calls` is false; no other keys: vLLM's schema allows them,
and a weak model then writes an extra key whose string never ends); a named function constrains it to that
function's `parameters` object. Either way the arguments parse against the function's schema by construction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...errors import RequestError

#: OpenAI's rule for function names.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: At most this many tools in one request (OpenAI's limit is 128).
MAX_TOOLS = 128
#: JSON Schema's type names.
SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
#: Keywords whose value is a schema, a list of schemas, or a map of schemas.
_ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
               "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, description and parameters schema (None: no parameters given)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None = None

    def as_template(self) -> dict[str, Any]:
        """The tool as chat templates take it (OpenAI's chat shape)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters if self.parameters is not None else EMPTY_PARAMETERS
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolSetup:
    """A request's tools: the tools, `choice` ("auto" | "none" | "required" | "function"), the function a named
    choice names, and the most calls a turn may make (1 when `parallel_tool_calls` is false)."""

    tools: tuple[Tool, ...]
    choice: str
    function: str | None = None
    max_calls: int | None = None

    @property
    def active(self) -> bool:
        """Whether the answer is read for tool calls (tools given and the choice is not `none`)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def constrained(self) -> bool:
        """Whether the answer is constrained to calls (`required` or a named function)."""
        return self.choice in ("required", "function")

    def constraint_schema(self) -> dict[str, Any]:
        """The JSON Schema that the answer is constrained to (`required` or a named function)."""
        if self.choice == "function":
            tool = next(t for t in self.tools if t.name == self.function)
            return tool.parameters if tool.parameters is not None else EMPTY_PARAMETERS
        defs: dict[str, Any] = {}
        variants = []
        for tool in self.tools:
            parameters = dict(tool.parameters) if tool.parameters is not None else dict(EMPTY_PARAMETERS)
            for name, value in (parameters.pop("$defs", None) or {}).items():
                if name in defs and defs[name] != value:
                    raise RequestError(f"tools define `$defs.{name}` twice with different schemas; tool_choice "
                                       "`required` puts every tool's $defs in one schema: rename one.",
                                       param="tools", code="invalid_value")
                defs[name] = value
            variants.append({"properties": {"name": {"type": "string", "enum": [tool.name]},
                                            "parameters": parameters},
                             "required": ["name", "parameters"], "additionalProperties": False})
        schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                  "items": {"type": "object", "anyOf": variants}}
        if self.max_calls is not None:
            schema["maxItems"] = self.max_calls
        if defs:
            schema["$defs"] = defs
        return schema


NO_TOOLS = ToolSetup((), "none")


def check_schema(schema: Any, where: str, depth: int = 0) -> None:
    """Refuse a JSON Schema that is not one (a 400 naming `where` and the rule): the shapes of JSON Schema's
    keywords, checked before any work (the grammar engine would fail later, inside the engine)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise _bad(where, f"must be a JSON Schema object, got {type(schema).__name__}")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for item in kinds:
        if item not in SCHEMA_TYPES:
            raise _bad(f"{where}.type", f"{item!r} is not a JSON Schema type ({', '.join(SCHEMA_TYPES)})")
    required = schema.get("required")
    if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        raise _bad(f"{where}.required", "must be a list of property names")
    enum = schema.get("enum")
    if enum is not None and (not isinstance(enum, list) or not enum):
        raise _bad(f"{where}.enum", "must be a non-empty list")
    ref = schema.get("$ref")
    if ref is not None and not isinstance(ref, str):
        raise _bad(f"{where}.$ref", "must be a string such as '#/$defs/Name'")
    for key in ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"):
        value = schema.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise _bad(f"{where}.{key}", "must be a non-negative integer")
    for key in _ONE_SCHEMA:
        if key in schema:
            check_schema(schema[key], f"{where}.{key}", depth + 1)
    for key in _SCHEMA_LISTS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list) or not value:
                raise _bad(f"{where}.{key}", "must be a non-empty list of schemas")
            for i, item in enumerate(value):
                check_schema(item, f"{where}.{key}[{i}]", depth + 1)
    for key in _SCHEMA_MAPS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise _bad(f"{where}.{key}", "must be an object mapping names to schemas")
            for name, item in value.items():
                check_schema(item, f"{where}.{key}.{name}", depth + 1)


def _bad(where: str, why: str) -> RequestError:
    return RequestError(f"`{where}` {why}.", param=where.split(".")[0], code="invalid_schema")


def parse_tools(tools: Any, *, flat: bool = False) -> tuple[Tool, ...]:
    """The `tools` list (chat's `{"type": "function", "function": {...}}`, or the Responses API's flat
    `{"type": "function", "name": ...}` when `flat`)."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise RequestError(f"`tools` must be a list of function tools, got {type(tools).__name__}.", param="tools",
                           code="invalid_type")
    if len(tools) > MAX_TOOLS:
        raise RequestError(f"`tools` has {len(tools)} tools; at most {MAX_TOOLS}.", param="tools",
                           code="invalid_value")
    out: list[Tool] = []
    for i, item in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise RequestError(f"`{where}` is a {kind!r} tool; hwrun serve runs function tools only "
                               "({\"type\": \"function\", ...}): built-in tools (web search, files, code) need "
                               "OpenAI's servers.", param=where, code="unsupported_tool")
        function = item if flat else item.get("function")
        fwhere = where if flat else f"{where}.function"
        if not isinstance(function, dict):
            raise RequestError(f"`{fwhere}` must be an object with a name (and description, parameters).",
                               param=fwhere, code="invalid_type")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise RequestError(f"`{fwhere}.name`={name!r} must be 1-64 letters, digits, _ or -.",
                               param=f"{fwhere}.name", code="invalid_value")
        if any(t.name == name for t in out):
            raise RequestError(f"`tools` names function {name!r} twice; names must be unique.", param="tools",
                               code="invalid_value")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"`{fwhere}.description` must be a string.", param=f"{fwhere}.description",
                               code="invalid_type")
        parameters = function.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise RequestError(f"`{fwhere}.parameters` must be a JSON Schema object.",
                                   param=f"{fwhere}.parameters", code="invalid_schema")
            check_schema(parameters, f"{fwhere}.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise RequestError(f"`{fwhere}.strict` must be true or false.", param=f"{fwhere}.strict",
                               code="invalid_type")
        out.append(Tool(name, description, parameters, strict))
    return tuple(out)


def parse_tool_setup(tools: tuple[Tool, ...], choice: Any, parallel: Any, *, flat: bool = False) -> ToolSetup:
    """`tool_choice` (default `auto` with tools, `none` without) and `parallel_tool_calls` checked against
    `tools`."""
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(f"`parallel_tool_calls`={parallel!r} must be true or false.", param="parallel_tool_calls",
                           code="invalid_type")
    max_calls = 1 if parallel is False else None
    if choice is None:
        return ToolSetup(tools, "auto" if tools else "none", max_calls=max_calls)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestError(f"`tool_choice`={choice!r} must be none, auto, required or "
                               "{\"type\": \"function\", ...} naming a function.", param="tool_choice",
                               code="invalid_value")
        if choice != "none" and not tools:
            raise RequestError(f"`tool_choice`={choice!r} needs `tools`; give the functions the model may call.",
                               param="tool_choice", code="invalid_value")
        return ToolSetup(tools, choice, max_calls=max_calls)
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice if flat else choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        shape = '{"type": "function", "name": ...}' if flat else '{"type": "function", "function": {"name": ...}}'
        raise RequestError(f"`tool_choice`={json.dumps(choice)[:200]} must be none, auto, required or {shape}.",
                           param="tool_choice", code="invalid_value")
    if not any(t.name == name for t in tools):
        raise RequestError(f"`tool_choice` names function {name!r}, which is not in `tools` "
                           f"({', '.join(t.name for t in tools) or 'none given'}).", param="tool_choice",
                           code="invalid_value")
    return ToolSetup(tools, "function", name, max_calls=max_calls)
