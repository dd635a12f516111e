"""What one request constrains its output to, as the engine receives it (no grammar engine imported here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import GenerateError

#: The JSON both grammar engines let a model write: these separators and no other whitespace. With free whitespace
#: (both engines' default) a weak model can write spaces and newlines until its budget ends ("length", never valid
#: JSON: the random tiny model did in hwrun serve's tool-choice tests), so a bounded schema gives bounded output.
SEPARATORS = (", ", ": ")

#: "json_object": any JSON object (OpenAI's JSON mode); "json_schema": JSON matching `schema`.
KINDS = ("json_object", "json_schema")


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on a request's text: `kind` is one of `KINDS`; `schema` is the JSON Schema as a JSON string
    (compact, keys in the order given: both grammar engines emit an object's properties in schema order, so sorting
    them would force a tool call to write "arguments" before "name") for "json_schema", None otherwise."""

    kind: str
    schema: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GenerateError(f"structured output kind {self.kind!r} is not one of {', '.join(KINDS)}.")
        if (self.kind == "json_schema") != (self.schema is not None):
            raise GenerateError(f"structured output {self.kind!r} takes a schema only for 'json_schema' "
                                f"(got schema={self.schema!r}).")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> StructuredOutput:
        """A "json_schema" constraint from a schema given as a dict or a JSON string."""
        value = json.loads(schema) if isinstance(schema, str) else schema
        if not isinstance(value, dict):
            raise GenerateError(f"a JSON schema must be a JSON object, not {type(value).__name__}.")
        return cls("json_schema", json.dumps(value, separators=(",", ":")))

    def schema_dict(self) -> dict[str, Any] | None:
        """The schema as a dict (None for "json_object")."""
        return None if self.schema is None else json.loads(self.schema)
