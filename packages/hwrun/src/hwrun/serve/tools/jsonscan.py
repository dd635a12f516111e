"""A scanner for JSON text that is still arriving: where a value, a string, an object's members end, or `None`
while the text is incomplete (the tool-call parsers stream a call's name and argument text as they form)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"


def skip_ws(text: str, i: int) -> int:
    """The first index at or after `i` that is not JSON whitespace."""
    n = len(text)
    while i < n and text[i] in WHITESPACE:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """Index just past the JSON string opening at `text[i]` (a `"`); None while it is not closed."""
    j, n = i + 1, len(text)
    while j < n:
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        else:
            j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """Index just past the JSON value starting at `text[i]`; None while incomplete. A scalar (number, true, ...)
    at the very end of the text counts as incomplete (more digits may come)."""
    n = len(text)
    if i >= n:
        return None
    ch = text[i]
    if ch == '"':
        return string_end(text, i)
    if ch in "{[":
        depth, j = 0, i
        while j < n:
            ch = text[j]
            if ch == '"':
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < n and text[j] not in ",}] \t\n\r":
        j += 1
    return j if j < n else None


@dataclass
class ObjectScan:
    """What is known of a JSON object so far: each member's key and value span (`end` None while the value is
    incomplete), where the object ends (None: not yet), and whether the text already broke JSON's rules."""

    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None
    bad: bool = False


def scan_object(text: str, i: int) -> ObjectScan:
    """Scan the object opening at `text[i]` (a `{`)."""
    scan = ObjectScan()
    n = len(text)
    j = skip_ws(text, i + 1)
    if j < n and text[j] == "}":
        scan.end = j + 1
        return scan
    while True:
        j = skip_ws(text, j)
        if j >= n:
            return scan
        if text[j] != '"':
            scan.bad = True
            return scan
        key_end = string_end(text, j)
        if key_end is None:
            return scan
        try:
            key = json.loads(text[j:key_end])
        except ValueError:
            scan.bad = True
            return scan
        j = skip_ws(text, key_end)
        if j >= n:
            return scan
        if text[j] != ":":
            scan.bad = True
            return scan
        j = skip_ws(text, j + 1)
        if j >= n:
            return scan
        end = value_end(text, j)
        scan.members[key] = (j, end)
        if end is None:
            return scan
        j = skip_ws(text, end)
        if j >= n:
            return scan
        if text[j] == ",":
            j += 1
        elif text[j] == "}":
            scan.end = j + 1
            return scan
        else:
            scan.bad = True
            return scan
