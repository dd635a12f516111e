"""OpenAI request bodies in, OpenAI response bodies out: parsing, validation and the JSON shapes (no I/O).

Every invalid body raises `RequestError` (400, an OpenAI error object naming the field); fields hwrun does
not implement are refused when set to a value that would change the answer (rather than silently ignored),
and left alone when absent or at their no-op value. One extension beyond OpenAI's fields: `ignore_eos` (vLLM's
name), which decodes every `max_tokens` token past the model's EOS (benchmarks use it to fix output lengths).
Shapes follow OpenAI's API reference for
`/v1/completions`, `/v1/chat/completions` and their `text_completion` / `chat.completion.chunk` streams.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError
from ..inference.structured import StructuredOutput

#: OpenAI's own limit on `stop` strings per request.
MAX_STOP_STRINGS = 4
#: `max_tokens` of a completion when the request gives none (OpenAI's default for /v1/completions).
DEFAULT_COMPLETION_TOKENS = 16
CHAT_ROLES = ("system", "user", "assistant", "developer")
#: Temperatures below this decode greedily (as vLLM does): dividing logits by less overflows to inf/nan.
MIN_TEMPERATURE = 1e-5
#: Largest `top_k` taken (a 32-bit count); a `top_k` at or above the vocabulary size turns the filter off.
MAX_TOP_K = 2**31 - 1
#: Fields accepted only at their no-op value: (field, allowed values).
NO_OP_FIELDS = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}


@dataclass(frozen=True)
class Sampling:
    """How one request picks tokens: `temperature=0` is greedy (a request's temperature below `MIN_TEMPERATURE`
    is stored as 0); `top_k=0` and `top_p=1` switch those filters off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0: off
    frequency_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0: off
    repetition_penalty: float = 1.0  # Transformers'/vLLM's, > 0; 1: off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) pairs, sorted by id
    logprobs: int | None = None  # None: none; 0: the chosen token's logprob; k: and the k most likely (<= 20)
    structured: StructuredOutput | None = None  # response_format / tool_choice constraint; None: free text

    @property
    def greedy(self) -> bool:
        """Whether the request decodes greedily (temperature 0)."""
        return self.temperature == 0.0


@dataclass(frozen=True)
class ParsedRequest:
    """A validated completion or chat request. `prompt` is set for completions, `messages` for chat."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's extension: decode the whole `max_tokens` budget past the model's EOS


#: Deepest JSON nesting a request body may have (OpenAI's bodies need 4 or 5 levels).
MAX_JSON_DEPTH = 32


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, else a `RequestError` saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}); send a JSON object with "
                           "Content-Type: application/json.", code="invalid_json") from None
    except RecursionError:
        raise RequestError(f"the request body nests JSON deeper than this server reads (at most {MAX_JSON_DEPTH} "
                           "levels).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body is JSON {type(body).__name__}, not an object; send "
                           '{"model": ..., ...}.', code="invalid_json")
    _check_json_values(body)
    return body


def _check_json_values(body: dict[str, Any]) -> None:
    """Refuse nesting deeper than `MAX_JSON_DEPTH` and strings that are not Unicode text (a lone surrogate such
    as "\\ud800" is valid JSON, but no tokenizer can encode it): a 400 naming the problem, not a 500 later."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels.", code="invalid_json")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError("the request body has a string with a lone UTF-16 surrogate (e.g. \"\\ud800\" "
                                   "without its pair); send valid Unicode text.", code="invalid_text") from None
        elif isinstance(value, dict):
            stack.extend((k, depth + 1) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def parse_request(body: dict[str, Any], kind: str, served_model: str) -> ParsedRequest:
    """Validate an OpenAI completion (`kind="completion"`) or chat (`kind="chat"`) body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("`model` is required and must be a string; GET /v1/models lists the one served here "
                           f"({served_model!r}).", param="model", code="invalid_type" if "model" in body else "missing")
    if model != served_model:
        raise RequestError(f"model {model!r} is not served here; this server serves {served_model!r} "
                           "(GET /v1/models).", param="model", code="model_not_found")
    for name, allowed in NO_OP_FIELDS.items():
        if name in body and not any(_same(body[name], value) for value in allowed):
            raise RequestError(f"`{name}`={body[name]!r} is not supported by hwrun serve; leave it out.",
                               param=name, code="unsupported_parameter")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise RequestError(f"`n`={n!r}: hwrun serve returns one choice per request (n=1); send several requests "
                           "for several answers.", param="n", code="unsupported_parameter")
    prompt = messages = None
    if kind == "completion":
        prompt = _prompt(body.get("prompt"))
    else:
        messages = _messages(body.get("messages"))
    max_tokens = body.get("max_completion_tokens") if kind == "chat" and "max_completion_tokens" in body else (
        body.get("max_tokens"))
    param = "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens <= 0):
        raise RequestError(f"`{param}`={max_tokens!r} must be a positive integer (new tokens to generate).",
                           param=param, code="invalid_value")
    if kind == "completion" and max_tokens is None:
        max_tokens = DEFAULT_COMPLETION_TOKENS
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"`stream_options`={options!r} must be an object such as {{\"include_usage\": true}}.",
                           param="stream_options", code="invalid_type")
    include_usage = bool(options and options.get("include_usage"))
    return ParsedRequest(kind=kind, model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                         sampling=_sampling(body), stop=_stop(body.get("stop")), stream=stream,
                         include_usage=include_usage, ignore_eos=_optional(body, "ignore_eos", bool, False))


def _sampling(body: dict[str, Any]) -> Sampling:
    temperature = _number(body, "temperature", 1.0)
    if not 0 <= temperature <= 2:
        raise RequestError(f"`temperature`={temperature!r} must be between 0 and 2 (0, or below {MIN_TEMPERATURE}: "
                           "greedy).",
                           param="temperature", code="invalid_value")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"`top_p`={top_p!r} must be in (0, 1].", param="top_p", code="invalid_value")
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0  # greedy: logits / 1e-40 are inf, and the sampler fails on them
    top_k = _optional(body, "top_k", int, 0)
    if not 0 <= top_k <= MAX_TOP_K:
        raise RequestError(f"`top_k`={top_k!r} must be between 0 and {MAX_TOP_K} (0: no top-k filter; a value at or "
                           "above the vocabulary size keeps every token).", param="top_k", code="invalid_value")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError(f"`seed`={seed!r} must be an integer in [0, 2**63).", param="seed", code="invalid_value")
    return Sampling(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), seed=seed)


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise RequestError("`prompt` must be one string; lists of several prompts or of token ids are not served "
                           "here: send one request per prompt.", param="prompt", code="invalid_type")
    if not isinstance(prompt, str):
        raise RequestError(f"`prompt` must be a string, got {type(prompt).__name__}.", param="prompt",
                           code="invalid_type" if prompt is not None else "missing")
    if not prompt:
        raise RequestError("`prompt` is empty; send at least one character.", param="prompt", code="invalid_value")
    return prompt


def _messages(messages: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of {\"role\": ..., \"content\": ...} objects.",
                           param="messages", code="invalid_type" if messages is not None else "missing")
    out = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"`{where}` must be an object with role and content.", param=where, code="invalid_type")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise RequestError(f"`{where}.role`={role!r} must be one of {', '.join(CHAT_ROLES)}.",
                               param=f"{where}.role", code="invalid_value")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"`{where}.content` parts must be {{\"type\": \"text\", \"text\": ...}}; "
                                       "images and audio are not served here.", param=f"{where}.content",
                                       code="invalid_type")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"`{where}.content` must be a string, got {type(content).__name__}.",
                               param=f"{where}.content", code="invalid_type")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return tuple(out)


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > MAX_STOP_STRINGS):
        raise RequestError(f"`stop`={stop!r} must be a non-empty string or a list of up to {MAX_STOP_STRINGS} "
                           "non-empty strings.", param="stop", code="invalid_value")
    return tuple(stops)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"`{name}`={value!r} must be a number.", param=name, code="invalid_type")
    return float(value)


def _optional(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if kind is int and not _is_int(value) or kind is bool and not isinstance(value, bool):
        raise RequestError(f"`{name}`={value!r} must be {'an integer' if kind is int else 'true or false'}.",
                           param=name, code="invalid_type")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(value: Any, allowed: Any) -> bool:
    return type(value) is type(allowed) and value == allowed if allowed is not None else value is None


# ----------------------------------------------------------------------------------------------- responses


def error_body(message: str, *, error_type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def new_id(kind: str) -> str:
    """A response id in OpenAI's style: `cmpl-...` or `chatcmpl-...`."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's `usage` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(kind: str, rid: str, model: str, text: str, finish_reason: str | None,
                  prompt_tokens: int, completion_tokens: int, created: int | None = None) -> dict[str, Any]:
    """A whole (not streamed) completion or chat completion."""
    created = int(time.time()) if created is None else created
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
               finish_reason: str | None = None) -> dict[str, Any]:
    """One streamed chunk: new `text`, the opening `role` (chat), or the closing `finish_reason`."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def text_chunk_encoder(kind: str, rid: str, model: str, created: int) -> Callable[[str], bytes]:
    """`encode(text)`: the same bytes as `sse(chunk_body(kind, rid, model, created, text=text))`, with the chunk's fixed
    JSON rendered once per request (only the text is encoded per chunk: streaming sends one chunk per step)."""
    marker = "hwrun-text-\u2063"
    whole = sse(chunk_body(kind, rid, model, created, text=marker)).decode()
    head, found, tail = whole.partition(json.dumps(marker, ensure_ascii=False))
    if not found or marker in head or marker in tail:  # cannot happen with JSON; the slow path stays exact
        return lambda text: sse(chunk_body(kind, rid, model, created, text=text))
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    return lambda text: (head + dumps(text) + tail).encode()


def usage_chunk(kind: str, rid: str, model: str, created: int, prompt_tokens: int,
                completion_tokens: int) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: `data: <json>` and a blank line (`data: [DONE]` ends the stream)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
