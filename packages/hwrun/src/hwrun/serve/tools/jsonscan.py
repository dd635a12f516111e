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


class ValueScanner:
    """`value_end` for text that grows: each `advance(text)` scans only what arrived since the last call (a tool
    call's arguments are read once per token: rescanning them would cost time quadratic in their length)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.pos = start
        self.kind: str | None = None  # "string" | "container" | "scalar" once the first character is seen
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.end: int | None = None

    def advance(self, text: str) -> int | None:
        """Index just past the value in `text` (which extends the text of earlier calls), or None: incomplete."""
        if self.end is not None:
            return self.end
        n, i = len(text), self.pos
        if self.kind is None:
            if i >= n:
                return None
            head = text[i]
            self.kind = "string" if head == '"' else "container" if head in "{[" else "scalar"
            if self.kind == "string":
                self.in_string, i = True, i + 1
        if self.kind == "scalar":
            while i < n and text[i] not in ",}] \t\n\r":
                i += 1
            self.pos = i
            if i < n:
                self.end = i
            return self.end
        while i < n:
            ch = text[i]
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    if self.kind == "string":
                        self.end = self.pos = i + 1
                        return self.end
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos = i + 1
                    return self.end
            i += 1
        self.pos = i
        return None


class ObjectScanner:
    """`scan_object` for text that grows: members' value spans and the object's end, scanning each character once
    (keys are re-read while incomplete; they are short)."""

    def __init__(self, start: int) -> None:
        self.pos = start + 1  # past the `{`
        self.phase = "first"  # first | key | colon | value | after
        self.key = ""
        self.values: dict[str, ValueScanner] = {}
        self.current: ValueScanner | None = None
        self.scan = ObjectScan()

    def advance(self, text: str) -> ObjectScan:
        """What is known of the object in `text` now."""
        scan, n = self.scan, len(text)
        while scan.end is None and not scan.bad:
            i = skip_ws(text, self.pos)
            if self.phase == "value" and self.current is not None:
                end = self.current.advance(text)
                scan.members[self.key] = (self.current.start, end)
                if end is None:
                    return scan
                self.pos, self.phase, self.current = end, "after", None
                continue
            if i >= n:
                return scan
            ch = text[i]
            if self.phase in ("first", "key"):
                if self.phase == "first" and ch == "}":
                    scan.end = i + 1
                elif ch != '"':
                    scan.bad = True
                else:
                    end = string_end(text, i)
                    if end is None:
                        return scan
                    try:
                        self.key = json.loads(text[i:end])
                    except ValueError:
                        scan.bad = True
                        return scan
                    self.pos, self.phase = end, "colon"
            elif self.phase == "colon":
                if ch != ":":
                    scan.bad = True
                else:
                    self.pos, self.phase = i + 1, "value_start"
            elif self.phase == "value_start":
                self.current = ValueScanner(i)
                self.phase = "value"
                self.pos = i
            elif self.phase == "after":
                if ch == ",":
                    self.pos, self.phase = i + 1, "key"
                elif ch == "}":
                    scan.end = i + 1
                else:
                    scan.bad = True
        return scan
