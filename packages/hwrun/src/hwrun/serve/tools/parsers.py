"""Tool calls read out of a model's text as it streams: `push(text)` gives the content to send and the
`delta.tool_calls` pieces (index, id, then the function name, then argument fragments), `finish()` the rest.

One parser reads a whole answer (`push` it all, then `finish`) or a stream (pieces): the same code, so the
streamed pieces join into exactly the non-streamed answer. Formats (vLLM's parser names):
- `hermes` (Hermes, Qwen 2.5/3, ...): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
  with content around them;
- `llama3_json` (Llama 3.1-3.3): the answer is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`; several separated by `;`); an answer that does not start with `{` is content;
- `mistral`: content, then `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}` objects (or, in newer
  tokenizers, `[TOOL_CALLS]name[ARGS]{...}` per call);
- constrained output (`tool_choice` `required`: a JSON array of `{"name", "parameters"}`, vLLM's shape; a named
  function: the arguments object alone), produced by the grammar, turned directly into calls.

A call's arguments are the model's own JSON text (not re-serialized). A call whose JSON turns out invalid is not
a call: a whole answer keeps its text as content; a stream has already sent its pieces (as OpenAI's do).
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .jsonscan import WHITESPACE, ObjectScanner, ValueScanner, skip_ws, value_end

#: The tool-call formats hwrun reads (`--tool-parser`), by vLLM's names.
PARSERS = ("hermes", "llama3_json", "mistral")


@dataclass
class CallDelta:
    """One piece of a streamed tool call: the first piece of a call has its `id` and `name`, later ones argument
    text (OpenAI's `delta.tool_calls[]`)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        """The `delta.tool_calls[]` item."""
        item: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {}
        if self.id is not None:
            item["id"], item["type"] = self.id, "function"
        if self.name is not None:
            function["name"] = self.name
        function["arguments"] = self.arguments
        item["function"] = function
        return item


@dataclass(frozen=True)
class ToolCall:
    """A whole tool call: `arguments` is JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        """The `message.tool_calls[]` item."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def openai_call_id() -> str:
    """An id in OpenAI's style (`call_` and 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


def mistral_call_id() -> str:
    """Nine letters and digits: Mistral's chat templates refuse any other `tool_call_id`."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


class _Call:
    """One call being read: its name once known (or given), the argument text sent so far."""

    def __init__(self, raw_prefix: str, name: str | None = None) -> None:
        self.index: int | None = None  # set when its first piece goes out
        self.id = ""
        self.name = name
        self.arguments = ""
        self.raw_prefix = raw_prefix  # the marker before its JSON (content again if the call proves invalid)
        self.raw = ""
        self.valid = False
        self.scanner: ObjectScanner | ValueScanner | None = None  # reads its JSON once, as it grows

    def progress(self, text: str, start: int | None, end: int | None) -> str:
        """The argument text beyond what was sent, for the value spanning `text[start:end]` (end None: growing).
        An object or array streams as it grows (only the new characters are sliced); a string (arguments sent as
        a JSON string) or a scalar goes whole."""
        if start is None or start >= len(text):
            return ""
        head = text[start]
        if head in "{[":
            new = text[start + len(self.arguments):end if end is not None else len(text)]
            self.arguments += new
            return new
        if end is None or self.arguments:
            return ""
        available = text[start:end]
        if head == '"':
            try:
                available = json.loads(available)
            except ValueError:
                pass
        self.arguments = available
        return available

    def close(self) -> None:
        """The call's JSON is complete: it is a call when its name is a string and its arguments a JSON object."""
        if not self.arguments:
            self.arguments = "{}"
        try:
            args = json.loads(self.arguments)
        except ValueError:
            args = None
        self.valid = isinstance(self.name, str) and bool(self.name) and isinstance(args, dict)


class ToolParser:
    """Base of the parsers: keeps the content sent, the calls and their pieces. `max_calls` (1 when
    `parallel_tool_calls` is false) drops calls beyond it (neither sent nor kept)."""

    name = "base"

    def __init__(self, *, make_id: Callable[[], str] = openai_call_id, max_calls: int | None = None) -> None:
        self.make_id = make_id
        self.max_calls = max_calls
        self.content = ""  # content sent
        self.calls: list[_Call] = []  # calls whose first piece went out
        self.finished = False

    # -- what subclasses call
    def _emit_call(self, call: _Call, text: str, args_start: int | None, args_end: int | None,
                   out: list[CallDelta]) -> None:
        """Send `call`'s name once known, then its new argument text."""
        if call.name is None:
            return
        if call.index is None:
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                call.index = -1  # dropped: past the calls allowed
                return
            call.index, call.id = len(self.calls), self.make_id()
            self.calls.append(call)
            out.append(CallDelta(call.index, call.id, call.name, ""))
        if call.index < 0:
            return
        new = call.progress(text, args_start, args_end)
        if new:
            out.append(CallDelta(call.index, arguments=new))

    def _end_call(self, call: _Call, raw: str, out: list[CallDelta]) -> None:
        """`call`'s JSON is complete (`raw`: its text): send the `{}` of a call without arguments, judge it."""
        if call.index is None and call.name is not None:
            self._emit_call(call, "", None, None, out)
        if call.index is not None and call.index >= 0 and not call.arguments:
            call.arguments = "{}"
            out.append(CallDelta(call.index, arguments="{}"))
        call.raw = raw
        call.close()

    def _call_object(self, call: _Call, text: str, start: int, args_keys: tuple[str, ...],
                     out: list[CallDelta]) -> tuple[int | None, bool]:
        """Progress of a `{"name": ..., "<args key>": ...}` object opening at `text[start]`: (its end or None,
        whether the text broke JSON's rules)."""
        if not isinstance(call.scanner, ObjectScanner):
            call.scanner = ObjectScanner(start)
        scan = call.scanner.advance(text)
        if call.name is None and "name" in scan.members:
            s, e = scan.members["name"]
            if e is not None:
                try:
                    name = json.loads(text[s:e])
                except ValueError:
                    name = None
                call.name = name if isinstance(name, str) and name else None
                if call.name is None:
                    return None, True
        span = next((scan.members[k] for k in args_keys if k in scan.members), (None, None))
        self._emit_call(call, text, span[0], span[1], out)
        return scan.end, scan.bad

    # -- the interface
    def push(self, text: str) -> tuple[str, list[CallDelta]]:
        """(content to send, tool-call pieces) for the next `text` of the answer."""
        raise NotImplementedError

    def finish(self) -> tuple[str, list[CallDelta]]:
        """What is still held at the end of the answer."""
        raise NotImplementedError

    def _content(self, text: str) -> str:
        self.content += text
        return text

    # -- the whole answer
    @property
    def tool_calls(self) -> list[ToolCall]:
        """The valid calls (after `finish`)."""
        return [ToolCall(c.id, c.name or "", c.arguments) for c in self.calls if c.valid]

    @property
    def whole_content(self) -> str:
        """The content of a whole answer: what was sent as content, and the text of calls that proved invalid."""
        return self.content + "".join(c.raw_prefix + c.raw for c in self.calls if not c.valid)


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that starts `marker` (held back: it may become the marker)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class HermesParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks among content."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    ARGS = ("arguments", "parameters")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.buf = ""
        self.call: _Call | None = None  # the call being read (after OPEN)
        self.after_call = False  # whitespace right after a call is dropped (between calls, or at the end)

    def push(self, text: str) -> tuple[str, list[CallDelta]]:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, list[CallDelta]]:
        content, out = self._run(final=True)
        if self.call is not None:  # the answer ended inside a call
            call, self.call = self.call, None
            self._end_unclosed(call, out)
        tail, self.buf = self.buf, ""
        self.finished = True
        return content + self._content(tail), out

    def _end_unclosed(self, call: _Call, out: list[CallDelta]) -> None:
        start = skip_ws(self.buf, 0)
        end = value_end(self.buf, start) if start < len(self.buf) and self.buf[start] == "{" else None
        if end is not None:
            self._end_call(call, self.buf, out)
            self.buf = self.buf[end:].strip(WHITESPACE)
        elif call.index is not None and call.index >= 0:
            call.raw, call.valid = self.buf, False
            self.buf = ""
        else:
            self.buf = call.raw_prefix + self.buf

    def _run(self, final: bool) -> tuple[str, list[CallDelta]]:
        content: list[str] = []
        out: list[CallDelta] = []
        while True:
            if self.call is None:
                if self.after_call:
                    i = skip_ws(self.buf, 0)
                    if i == len(self.buf) or (not final and self.OPEN.startswith(self.buf[i:])):
                        if final:
                            self.buf = ""
                        return "".join(content), out
                    if self.buf.startswith(self.OPEN, i):
                        self.buf = self.buf[i:]
                    self.after_call = False
                at = self.buf.find(self.OPEN)
                if at < 0:
                    keep = 0 if final else _held_prefix(self.buf, self.OPEN)
                    content.append(self._content(self.buf[: len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep:]
                    return "".join(content), out
                content.append(self._content(self.buf[:at]))
                self.buf = self.buf[at + len(self.OPEN):]
                self.call = _Call(self.OPEN)
                continue
            start = skip_ws(self.buf, 0)
            if start >= len(self.buf):
                return "".join(content), out
            if self.buf[start] != "{":  # not JSON: the marker and what follows are content
                call, self.call = self.call, None
                self.buf = call.raw_prefix + self.buf
                content.append(self._content(self.buf[:len(call.raw_prefix)]))
                self.buf = self.buf[len(call.raw_prefix):]
                continue
            end, bad = self._call_object(self.call, self.buf, start, self.ARGS, out)
            if bad:
                call, self.call = self.call, None
                if call.index is None:
                    content.append(self._content(call.raw_prefix))
                else:
                    call.raw, call.valid = "", False
                continue
            if end is None:
                return "".join(content), out
            rest = self.buf[end:]
            after = skip_ws(rest, 0)
            if rest[after:].startswith(self.CLOSE):
                cut = end + after + len(self.CLOSE)
            elif not final and self.CLOSE.startswith(rest[after:]):
                return "".join(content), out  # the closing marker may be arriving
            else:
                cut = end
            call, self.call = self.call, None
            self._end_call(call, self.buf[:cut], out)
            if call.index is None:  # no name: never a call
                content.append(self._content(call.raw_prefix + self.buf[:cut]))
            self.buf = self.buf[cut:]
            self.after_call = True


class _SequenceParser(ToolParser):
    """Calls as a run of JSON objects (after an optional lead-in), separated by `sep` characters; the shared
    machinery of `llama3_json`, `mistral` and the constrained `required` array."""

    ARGS: tuple[str, ...] = ("arguments", "parameters")
    SEPARATORS = ";,"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.buf = ""
        self.mode = "start"  # start -> calls | text
        self.pos = 0  # where the next call (or separator) starts in buf
        self.call: _Call | None = None
        self.call_start = 0

    def push(self, text: str) -> tuple[str, list[CallDelta]]:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, list[CallDelta]]:
        content, out = self._run(final=True)
        if self.mode == "start":  # nothing decided: all content
            content += self._content(self.buf)
        elif self.mode == "calls":
            if self.call is not None and self.call.index is not None:
                if self.call.index >= 0:
                    self.call.raw, self.call.valid = self.buf[self.call_start:], False
            elif self.pos < len(self.buf):
                rest = self.buf[self.pos:]
                content += self._content(rest if rest.strip(WHITESPACE + self.SEPARATORS + "]") else "")
        self.finished = True
        return content, out

    def _lead(self, final: bool) -> int | None:
        """Where the calls start in `buf` (past any lead-in), -1 when the answer is content, None: undecided."""
        raise NotImplementedError

    def _run(self, final: bool) -> tuple[str, list[CallDelta]]:
        out: list[CallDelta] = []
        content = ""
        if self.mode == "start":
            lead = self._lead(final)
            if lead is None:
                return "", out
            if lead < 0:
                self.mode = "text"
            else:
                self.mode, self.pos = "calls", lead
        if self.mode == "text":
            text, self.buf = self.buf, ""
            return self._content(text), out
        while True:
            if self.call is None:
                i = skip_ws(self.buf, self.pos)
                while i < len(self.buf) and self.buf[i] in self.SEPARATORS:
                    i = skip_ws(self.buf, i + 1)
                if i >= len(self.buf):
                    return content, out
                if self.buf[i] != "{":
                    self.pos = i
                    return content, out  # the end of the calls (`]`, or text: content at finish)
                self.call, self.call_start = _Call(""), i
            end, bad = self._call_object(self.call, self.buf, self.call_start, self.ARGS, out)
            if bad:
                self.call.raw, self.call.valid = self.buf[self.call_start:], False
                self.call, self.pos = None, len(self.buf)
                return content, out
            if end is None:
                return content, out
            call, self.call = self.call, None
            self._end_call(call, self.buf[self.call_start:end], out)
            self.pos = end


class Llama3JsonParser(_SequenceParser):
    """Llama 3.1-3.3's JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (after an optional
    `<|python_tag|>`; several separated by `;`), else it is content."""

    name = "llama3_json"
    TAG = "<|python_tag|>"

    def _lead(self, final: bool) -> int | None:
        i = skip_ws(self.buf, 0)
        rest = self.buf[i:]
        if rest.startswith(self.TAG):
            return i + len(self.TAG)
        if rest.startswith("{"):
            return i
        if not rest or (self.TAG.startswith(rest) and not final):
            return None if not final else -1
        return -1


class MistralParser(_SequenceParser):
    """Mistral's `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` (content may come before it), or
    `[TOOL_CALLS]name[ARGS]{...}` per call (newer tokenizers)."""

    name = "mistral"
    TAG, ARGS_TAG = "[TOOL_CALLS]", "[ARGS]"

    def __init__(self, **options: Any) -> None:
        options.setdefault("make_id", mistral_call_id)
        super().__init__(**options)
        self.sent = 0  # content of buf sent while looking for the tag
        self.named: _Call | None = None  # a `name[ARGS]` call being read
        self.opened = False  # the text after the tag was looked at
        self.named_form = False  # the calls are `name[ARGS]{...}`

    def _lead(self, final: bool) -> int | None:
        at = self.buf.find(self.TAG)
        if at < 0:
            keep = 0 if final else _held_prefix(self.buf, self.TAG)
            if final:
                return -1
            self._pending_content = self.buf[self.sent: len(self.buf) - keep]
            return None
        self._pending_content = self.buf[self.sent:at]
        return at + len(self.TAG)

    def _run(self, final: bool) -> tuple[str, list[CallDelta]]:
        self._pending_content = ""
        if self.mode == "start":
            lead = self._lead(final)
            content = self._content(self._pending_content)
            self.sent += len(self._pending_content)
            if lead is None:
                return content, []
            if lead < 0:
                self.mode = "text"
                text, self.buf = self.buf[self.sent:], ""
                return content + self._content(text), []
            self.mode, self.pos = "calls", lead
        else:
            content = ""
        if self.mode == "calls" and not self.opened:  # `[` opens the array form; a name the newer form
            i = skip_ws(self.buf, self.pos)
            if i >= len(self.buf):
                return content, []
            self.opened = True
            if self.buf[i] == "[":
                self.pos = i + 1
        if self.mode == "calls" and self._named_form():
            more, out = self._run_named(final)
            return content + more, out
        more, out = super()._run(final)
        return content + more, out

    def _named_form(self) -> bool:
        """Whether the calls are `name[ARGS]{...}` (the text after the tag is not an array)."""
        if not self.named_form:
            i = skip_ws(self.buf, self.pos)
            self.named_form = i < len(self.buf) and self.buf[i] not in "[{" and self.ARGS_TAG in self.buf[i:]
        return self.named_form

    def _run_named(self, final: bool) -> tuple[str, list[CallDelta]]:
        out: list[CallDelta] = []
        while True:
            if self.named is None:
                i = skip_ws(self.buf, self.pos)
                if self.buf.startswith(self.TAG, i):
                    i += len(self.TAG)
                at = self.buf.find(self.ARGS_TAG, i)
                if at < 0:
                    return "", out
                self.named = _Call(self.TAG, name=self.buf[i:at].strip() or None)
                self.call_start = at + len(self.ARGS_TAG)
            start = skip_ws(self.buf, self.call_start)
            if start >= len(self.buf):
                return "", out
            if self.named.scanner is None:
                self.named.scanner = ValueScanner(start)
            end = self.named.scanner.advance(self.buf)
            self._emit_call(self.named, self.buf, self.named.scanner.start, end, out)
            if end is None:
                return "", out
            call, self.named = self.named, None
            self._end_call(call, self.buf[self.call_start:end], out)
            self.pos = end


class RequiredParser(_SequenceParser):
    """`tool_choice: "required"` under constrained decoding: a JSON array of `{"name", "parameters"}` objects."""

    name = "required"

    def _lead(self, final: bool) -> int | None:
        i = skip_ws(self.buf, 0)
        if i >= len(self.buf):
            return None if not final else -1
        return i + 1 if self.buf[i] == "[" else -1


class NamedParser(ToolParser):
    """`tool_choice` naming a function under constrained decoding: the answer is that function's arguments."""

    name = "named"

    def __init__(self, function: str, **options: Any) -> None:
        super().__init__(**options)
        self.buf = ""
        self.call = _Call("", name=function)

    def push(self, text: str) -> tuple[str, list[CallDelta]]:
        self.buf += text
        out: list[CallDelta] = []
        if self.call.scanner is None:
            start = skip_ws(self.buf, 0)
            if start >= len(self.buf):
                return "", out
            self.call.scanner = ValueScanner(start)
        scanner = self.call.scanner
        self._emit_call(self.call, self.buf, scanner.start, scanner.advance(self.buf), out)
        return "", out

    def finish(self) -> tuple[str, list[CallDelta]]:
        out: list[CallDelta] = []
        start = skip_ws(self.buf, 0)
        scanner = self.call.scanner
        end = scanner.advance(self.buf) if isinstance(scanner, ValueScanner) else (
            value_end(self.buf, start) if start < len(self.buf) else None)
        if end is not None:
            self._end_call(self.call, self.buf, out)
        else:  # cut short (max_tokens): not a call; a whole answer keeps the text as content
            self._emit_call(self.call, self.buf, start, None, out)
            self.call.raw, self.call.valid = self.buf, False
            if self.call.index is None:
                self.content = self.buf
        self.finished = True
        return "", out


def make_parser(name: str, **options: Any) -> ToolParser:
    """The parser of format `name` (one of `PARSERS`)."""
    classes = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "mistral": MistralParser,
               "required": RequiredParser}
    return classes[name](**options)
