"""OpenAI's Responses API (`POST /v1/responses`) over the same engine: the body checked and turned into a chat
request (input items to messages, `instructions` first, flat function tools), and the `Run`'s updates written as
a `response` object or as the documented stream of typed events.

Input items: a string, or messages (`role` + text or `input_text` / `output_text` parts), `function_call` and
`function_call_output` items. Output items: a `message` with `output_text` parts and `function_call` items.
Stream: `response.created`, `response.in_progress`, then per item `response.output_item.added`, for a message
`response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`; for a call `response.function_call_arguments.delta`...,
`response.function_call_arguments.done`; then `response.output_item.done`; last `response.completed` (or
`response.incomplete` when `max_output_tokens` cut it, `response.failed` when it failed). Nothing is stored:
`store`, `previous_response_id`, `conversation` and `background` are refused with the reason.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import RequestError
from .protocol import (
    EXTENSIONS,
    REFUSED,
    ParsedRequest,
    ServedModels,
    TokenInfo,
    check_fields,
    constrain,
    parse_messages,
    parse_sampling,
    resolve_model,
    schema_constraint,
    text_of,
)
from .request import Run, Update
from .tools.spec import parse_tool_setup, parse_tools

#: The Responses API's request fields (as the official client sends them).
RESPONSES_FIELDS = ("access_programs", "background", "background_options", "context_management", "conversation",
                    "image", "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
                    "model", "moderation", "parallel_tool_calls", "previous_response_id", "prompt",
                    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning",
                    "safety_identifier", "service_tier", "store", "stream", "stream_options", "temperature", "text",
                    "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user")
RESPONSES_EXTENSIONS = (*EXTENSIONS["chat"],)
NOT_STORED = "nothing is stored here: send the whole conversation as `input` items"
RESPONSES_REFUSED = {
    "background": ((None, False), "no background responses (" + NOT_STORED + ")"),
    "background_options": ((None,), "no background responses"),
    "conversation": ((None,), "no stored conversations (" + NOT_STORED + ")"),
    "previous_response_id": ((None,), "no stored responses (" + NOT_STORED + ")"),
    "prompt": ((None,), "no stored prompt templates: send the text as `instructions` and `input`"),
    "store": ((None, False), "hwrun serve keeps no responses (send store: false)"),
    "truncation": ((None, "disabled"), "the input is never cut: an input too long for the context is a 400"),
    "max_tool_calls": ((None,), "it bounds built-in tools, which hwrun serve does not run"),
    "access_programs": ((None,), "no access programs here"),
    "context_management": ((None,), "no server-side context management: " + NOT_STORED),
    "image": ((None,), "text only: no image generation"),
    "moderation": REFUSED["moderation"],
    "service_tier": REFUSED["service_tier"],
}
#: `include` values taken: the logprobs of the output text.
INCLUDE = ("message.output_text.logprobs",)


@dataclass(frozen=True)
class ResponsesMeta:
    """What the response object repeats of the request."""

    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, Any]
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    text_format: dict[str, Any]
    temperature: float | None
    top_p: float | None
    top_logprobs: int | None
    user: str | None


def parse_responses(body: dict[str, Any], served: ServedModels) -> tuple[ParsedRequest, ResponsesMeta]:
    """Validate a Responses API body; (the chat request it runs as, what the response repeats)."""
    check_fields(body, "/v1/responses", RESPONSES_FIELDS, RESPONSES_EXTENSIONS, RESPONSES_REFUSED)
    model, adapter = resolve_model(body, served)
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or any(v is not None for v in reasoning.values())):
        raise RequestError(f"`reasoning`={json.dumps(reasoning)[:200]} is not supported by hwrun serve: no reasoning "
                           "settings; a thinking model's template takes `chat_template_kwargs` such as "
                           '{"enable_thinking": false}.', param="reasoning", code="unsupported_parameter")
    include = body.get("include") or []
    if not isinstance(include, list) or any(item not in INCLUDE for item in include):
        raise RequestError(f"`include`={json.dumps(include)[:200]}: hwrun serve can include only "
                           f"{', '.join(INCLUDE)} (it runs no built-in tools and stores nothing).", param="include",
                           code="unsupported_parameter")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("`instructions` must be a string (the system message).", param="instructions",
                           code="invalid_type")
    messages = input_messages(body.get("input"), instructions)
    tools = parse_tool_setup(parse_tools(body.get("tools"), flat=True), body.get("tool_choice"),
                             body.get("parallel_tool_calls"), flat=True)
    fmt, structured, text_format = _text_format(body.get("text"))
    structured = constrain(tools, fmt, structured)
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise RequestError(f"`top_logprobs`={top!r} must be an integer from 0 to 20.", param="top_logprobs",
                           code="invalid_value")
    logprobs = (top or 0) if INCLUDE[0] in include or top else None
    sampling = parse_sampling(body, served, logprobs=logprobs, structured=structured)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0):
        raise RequestError(f"`max_output_tokens`={max_tokens!r} must be a positive integer.",
                           param="max_output_tokens", code="invalid_value")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"`stream`={stream!r} must be true or false.", param="stream", code="invalid_type")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_obfuscation"}):
        raise RequestError(f"`stream_options`={json.dumps(options)[:200]} takes only include_obfuscation here.",
                           param="stream_options", code="invalid_value")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise RequestError("`metadata` must be an object of strings.", param="metadata", code="invalid_type")
    from .protocol import _optional, _template_kwargs, _token_ids

    parsed = ParsedRequest(kind="responses", model=model, prompt=None, messages=messages, max_tokens=max_tokens,
                           sampling=sampling, stop=(), stream=bool(stream), include_usage=False,
                           ignore_eos=_optional(body, "ignore_eos", bool, False), adapter=adapter, tools=tools,
                           stop_token_ids=_token_ids(body, "stop_token_ids", served.vocab_size),
                           chat_template_kwargs=_template_kwargs(body.get("chat_template_kwargs")),
                           response_format=fmt)
    meta = ResponsesMeta(
        instructions=instructions, max_output_tokens=max_tokens, metadata=metadata,
        tools=[{"type": "function", "name": t.name, "description": t.description,
                "parameters": t.parameters, "strict": t.strict if t.strict is not None else True}
               for t in tools.tools],
        tool_choice=body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False, text_format=text_format,
        temperature=body.get("temperature"), top_p=body.get("top_p"), top_logprobs=top,
        user=body.get("user"))
    return parsed, meta


def _text_format(text: Any) -> tuple[str, Any, dict[str, Any]]:
    """`text.format` -> (kind, constraint, the format as the response repeats it)."""
    if text is None:
        return "text", None, {"type": "text"}
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise RequestError(f"`text`={json.dumps(text)[:200]} must be an object with `format`.", param="text",
                           code="invalid_value")
    if text.get("verbosity") is not None:
        raise RequestError("`text.verbosity` is not supported by hwrun serve (no verbosity setting).",
                           param="text", code="unsupported_parameter")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return "text", None, {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        from ..inference.structured import StructuredOutput

        return "json_object", StructuredOutput("json_object"), {"type": "json_object"}
    if kind == "json_schema":
        return "json_schema", schema_constraint(fmt, "text.format"), dict(fmt)
    raise RequestError(f"`text.format`={json.dumps(fmt)[:200]} must be {{\"type\": \"text\"}}, "
                       '{"type": "json_object"} or {"type": "json_schema", "name": ..., "schema": {...}}.',
                       param="text", code="invalid_value")


def input_messages(value: Any, instructions: str | None) -> tuple[dict[str, Any], ...]:
    """`input` (a string or a list of items) and `instructions` as chat messages (checked like chat's)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        if not value:
            raise RequestError("`input` is empty; send some text.", param="input", code="invalid_value")
        messages.append({"role": "user", "content": value})
        return parse_messages(messages)
    if not isinstance(value, list) or not value:
        raise RequestError("`input` must be a string or a non-empty list of input items (messages, function_call, "
                           "function_call_output).", param="input", code="invalid_type" if value is not None else
                           "missing")
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise RequestError(f"`{where}` must be an object.", param=where, code="invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            content = item.get("content")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"`{where}.role`={role!r} must be user, assistant, system or developer.",
                                   param=f"{where}.role", code="invalid_value")
            messages.append({"role": role, "content": _item_text(content, f"{where}.content")})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise RequestError(f"`{where}` (function_call) needs string `call_id`, `name` and `arguments`.",
                                   param=where, code="invalid_type")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last["content"]
                                                                     or _previous_is_call(value, index)):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise RequestError(f"`{where}.call_id` must be the id of the call it answers.",
                                   param=f"{where}.call_id", code="invalid_type")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _item_text(output, f"{where}.output")})
        else:
            raise RequestError(f"`{where}` is a {kind!r} item; hwrun serve takes messages, function_call and "
                               "function_call_output items (no stored items, reasoning or built-in tool items).",
                               param=where, code="unsupported_parameter")
    return parse_messages(messages)


def _previous_is_call(items: list[Any], index: int) -> bool:
    return index > 0 and isinstance(items[index - 1], dict) and items[index - 1].get("type") == "function_call"


def _item_text(content: Any, where: str) -> str:
    return text_of(content, where, parts="input_text or output_text; images, files and audio are not served here",
                   expected="text or a list of text parts")


# ---------------------------------------------------------------------------------------------- output


def _logprobs(tokens: list[TokenInfo]) -> list[dict[str, Any]]:
    from .protocol import chat_logprobs

    return chat_logprobs(tokens)["content"]


def response_object(run: Run, meta: ResponsesMeta, status: str, output: list[dict[str, Any]], *,
                    error: dict[str, Any] | None = None, incomplete: str | None = None) -> dict[str, Any]:
    """The `response` object."""
    usage = None
    if status in ("completed", "incomplete"):
        usage = {"input_tokens": run.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": run.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": run.prompt_tokens + run.completion_tokens}
    return {"id": run.rid, "object": "response", "created_at": run.created, "status": status, "background": False,
            "error": error, "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": meta.instructions, "max_output_tokens": meta.max_output_tokens,
            "max_tool_calls": None, "model": run.parsed.model, "output": output,
            "parallel_tool_calls": meta.parallel_tool_calls, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": False,
            "temperature": meta.temperature, "text": {"format": meta.text_format}, "tool_choice": meta.tool_choice,
            "tools": meta.tools, "top_logprobs": meta.top_logprobs, "top_p": meta.top_p, "truncation": "disabled",
            "usage": usage, "user": meta.user, "metadata": meta.metadata}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _ending(run: Run) -> tuple[str, str | None]:
    """(status, incomplete reason) of a finished run."""
    if run.choices[0].finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


async def responses_whole(run: Run, meta: ResponsesMeta, request: Request) -> Response:
    """The whole `response` object; a client that disconnects first cancels the request."""
    if not await run.collect(request):
        return Response(status_code=499)
    if run.error is not None:
        return run.error_response()
    choice = run.choices[0]
    parser = choice.parser
    content = parser.whole_content if parser is not None else choice.content
    calls = parser.tool_calls if parser is not None else []
    output: list[dict[str, Any]] = []
    lps = _logprobs(choice.logprobs) if run.parsed.sampling.logprobs is not None else []
    if content or not calls:
        output.append(_message_item(_item_id("msg"), content, "completed", lps))
    for call in calls:
        output.append(_call_item(_item_id("fc"), call.id, call.name, call.arguments, "completed"))
    status, incomplete = _ending(run)
    return JSONResponse(response_object(run, meta, status, output, incomplete=incomplete))


def _event(kind: str, sequence: int, payload: dict[str, Any]) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": sequence, **payload}, ensure_ascii=False,
                      separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


class _Writer:
    """The open output item (a message or a call) of a streamed response, and the events that open, fill and
    close items."""

    def __init__(self, run: Run, meta: ResponsesMeta) -> None:
        self.run, self.meta = run, meta
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.open: dict[str, Any] | None = None  # the item being written
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []
        self.calls: dict[int, dict[str, Any]] = {}  # call index -> its item

    def event(self, kind: str, **payload: Any) -> bytes:
        out = _event(kind, self.sequence, payload)
        self.sequence += 1
        return out

    def close(self) -> list[bytes]:
        """Events that finish the open item."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": self.logprobs}
            done = _message_item(item["id"], self.text, "completed", self.logprobs)
            events = [self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                 content_index=0, text=self.text, logprobs=self.logprobs),
                      self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                 content_index=0, part=part)]
        else:
            done = {**item, "status": "completed"}
            events = [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 name=item["name"], arguments=item["arguments"])]
        self.output.append(done)
        return [*events, self.event("response.output_item.done", output_index=index, item=done)]

    def text_events(self, text: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        events: list[bytes] = []
        if self.open is not None and self.open["type"] != "message":
            events += self.close()
        index = len(self.output)
        if self.open is None:
            self.open = {"type": "message", "id": _item_id("msg")}
            self.text, self.logprobs = "", []
            events += [self.event("response.output_item.added", output_index=index,
                                  item=_message_item(self.open["id"], "", "in_progress", [])),
                       self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                         "logprobs": []})]
        self.text += text
        self.logprobs += logprobs
        events.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=index,
                                 content_index=0, delta=text, logprobs=logprobs))
        return events

    def call_events(self, update: Update) -> list[bytes]:
        events: list[bytes] = []
        for delta in update.calls:
            if delta.id is not None:
                events += self.close()
                self.open = _call_item(_item_id("fc"), delta.id, delta.name or "", "", "in_progress")
                self.calls[delta.index] = self.open
                events.append(self.event("response.output_item.added", output_index=len(self.output),
                                         item=dict(self.open)))
            item = self.calls.get(delta.index)
            if item is None or item is not self.open or not delta.arguments:
                continue
            item["arguments"] += delta.arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=len(self.output), delta=delta.arguments))
        return events


async def responses_stream(run: Run, meta: ResponsesMeta) -> AsyncIterator[bytes]:
    """The Responses API's event stream for `run`."""
    writer = _Writer(run, meta)
    try:
        yield writer.event("response.created", response=response_object(run, meta, "in_progress", []))
        yield writer.event("response.in_progress", response=response_object(run, meta, "in_progress", []))
        async for updates in run.updates():
            for update in updates:
                if update.index != 0:
                    continue
                logprobs = _logprobs(update.logprobs) if run.parsed.sampling.logprobs is not None else []
                if update.text or (logprobs and not update.calls):
                    for chunk in writer.text_events(update.text, logprobs):
                        yield chunk
                for chunk in writer.call_events(update):
                    yield chunk
        if run.error is not None:
            error = {"code": run.error_code if run.error_code == "shutting_down" else "server_error",
                     "message": run.error}
            for chunk in writer.close():
                yield chunk
            yield writer.event("response.failed", response=response_object(run, meta, "failed", writer.output,
                                                                           error=error))
            return
        if not writer.output and writer.open is None:  # an empty answer is still one (empty) message
            for chunk in writer.text_events("", []):
                yield chunk
        for chunk in writer.close():
            yield chunk
        status, incomplete = _ending(run)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield writer.event(kind, response=response_object(run, meta, status, writer.output, incomplete=incomplete))
    finally:
        run.abandon()


__all__ = ["ResponsesMeta", "parse_responses", "responses_stream", "responses_whole"]
