"""OpenAI request bodies in, OpenAI response bodies out: parsing, validation and the JSON shapes (no I/O).

Every invalid body raises `RequestError` (400, an OpenAI error object naming the field). Each field of OpenAI's
`/v1/completions` and `/v1/chat/completions` is either served, accepted without effect on the answer (identifiers
and caching hints: `user`, `metadata`, `safety_identifier`, `prompt_cache_*`), or refused with the reason when set
to a value that would change the answer (`REFUSED`); a field that is neither OpenAI's nor one of the vLLM
extensions served here (`EXTENSIONS`) is a 400 naming it, never dropped. Sampling defaults come from the model's
`generation_config.json` where the request leaves a field out (vLLM's `--generation-config auto`).
Shapes follow OpenAI's API reference for both endpoints and their `text_completion` / `chat.completion.chunk`
streams.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestError
from ..inference.structured import StructuredOutput
from .tools.spec import NO_TOOLS, ToolSetup, check_schema, parse_tool_setup, parse_tools

#: OpenAI's own limit on `stop` strings per request.
MAX_STOP_STRINGS = 4
#: `max_tokens` of a completion when the request gives none (OpenAI's default for /v1/completions).
DEFAULT_COMPLETION_TOKENS = 16
CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")
#: Temperatures below this decode greedily (as vLLM does): dividing logits by less overflows to inf/nan.
MIN_TEMPERATURE = 1e-5
#: Largest `top_k` taken (a 32-bit count); a `top_k` at or above the vocabulary size turns the filter off.
MAX_TOP_K = 2**31 - 1
#: Most choices one request may ask for (`n`): each choice is decoded in a slot of its own.
MAX_N = 16
#: Most `logit_bias` entries and `stop_token_ids` one request may give.
MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS = 1024, 64
#: Most alternatives per token: `logprobs` of /v1/completions (OpenAI's 5), `top_logprobs` of chat (OpenAI's 20).
COMPLETION_MAX_LOGPROBS, CHAT_MAX_TOP_LOGPROBS = 5, 20
#: Sampling fields a model's `generation_config.json` may default (vLLM's `--generation-config auto` set).
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
#: vLLM's extensions served here (beyond OpenAI's fields), per endpoint.
EXTENSIONS = {"completion": ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids"),
              "chat": ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "chat_template_kwargs")}
_COMMON = ("model", "stream", "stream_options", "temperature", "top_p", "seed", "stop", "max_tokens", "n",
           "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user")
#: OpenAI's request fields per endpoint (as the official client sends them).
OPENAI_FIELDS = {
    "completion": (*_COMMON, "prompt", "best_of", "echo", "suffix"),
    "chat": (*_COMMON, "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
             "parallel_tool_calls", "response_format", "metadata", "store", "service_tier", "modalities", "audio",
             "prediction", "reasoning_effort", "verbosity", "web_search_options", "functions", "function_call",
             "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "moderation"),
}
#: Accepted with no effect on the answer: identifiers and caching hints (prefix reuse is the engine's own).
NO_EFFECT_FIELDS = ("user", "metadata", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                    "prompt_cache_options")
#: OpenAI fields refused unless at a value that changes nothing: field -> (values taken, why the rest are refused).
REFUSED = {
    "suffix": ((None, ""), "no fill-in-the-middle here: put all the text before the answer in `prompt`"),
    "audio": ((None,), "text only: no audio output"),
    "modalities": ((None, ["text"]), "text only: no audio output"),
    "prediction": ((None,), "no predicted outputs (speculative decoding from a given text)"),
    "reasoning_effort": ((None,), "no reasoning-effort setting; a thinking model's template takes "
                                  "`chat_template_kwargs` such as {\"enable_thinking\": false}"),
    "verbosity": ((None,), "no verbosity setting (it is a prompt matter for these models)"),
    "web_search_options": ((None,), "no web search: the server reaches nothing outside"),
    "functions": ((None, []), "the deprecated function-calling fields: use `tools`"),
    "function_call": ((None,), "the deprecated function-calling fields: use `tool_choice`"),
    "store": ((None, False), "nothing is stored: hwrun serve keeps no completions to list or reuse"),
    "service_tier": ((None, "auto", "default"), "one service tier here"),
    "moderation": ((None,), "no moderation here"),
}
#: `chat_template_kwargs` keys that are the server's own arguments of `apply_chat_template`.
RESERVED_TEMPLATE_KWARGS = ("conversation", "messages", "tools", "documents", "tokenize", "return_dict",
                            "return_tensors", "chat_template", "add_generation_prompt", "continue_final_message",
                            "tokenizer_kwargs", "padding", "truncation", "max_length")


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

    kind: str  # "completion" | "chat" | "responses"
    model: str
    prompt: str | None
    messages: tuple[dict[str, Any], ...] | None
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's extension: decode the whole `max_tokens` budget past the model's EOS
    n: int = 1  # choices
    adapter: str | None = None  # the `--lora` adapter `model` names; None: the base model
    stop_token_ids: tuple[int, ...] = ()
    tools: ToolSetup = NO_TOOLS
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    echo: bool = False  # completions: the prompt starts each choice's text
    response_format: str = "text"  # "text" | "json_object" | "json_schema"


@dataclass(frozen=True)
class ServedModels:
    """What a request's `model` may name: the base model and the `--lora` adapters; the sampling defaults of the
    model's generation config; the vocabulary size (token ids are checked against it, when known)."""

    base: str
    adapters: tuple[str, ...] = ()
    defaults: Mapping[str, float] = field(default_factory=dict)
    vocab_size: int | None = None


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


def check_fields(body: dict[str, Any], endpoint: str, known: tuple[str, ...], extensions: tuple[str, ...],
                 refused: Mapping[str, tuple[tuple[Any, ...], str]]) -> None:
    """Refuse fields neither OpenAI's (`known`) nor a served extension, and refused fields set to a value that
    would change the answer: a 400 naming the field and why."""
    for name in body:
        if name not in known and name not in extensions:
            raise RequestError(f"`{name}` is not a field of OpenAI's {endpoint} nor one of the vLLM extensions hwrun "
                               f"serve takes ({', '.join(extensions)}); leave it out.", param=name,
                               code="unknown_parameter")
    for name, (allowed, why) in refused.items():
        if name in body and not any(_same(body[name], value) for value in allowed):
            raise RequestError(f"`{name}`={json.dumps(body[name])[:200]} is not supported by hwrun serve: {why}.",
                               param=name, code="unsupported_parameter")


def resolve_model(body: dict[str, Any], served: ServedModels) -> tuple[str, str | None]:
    """(`model` as sent, the adapter it names or None for the base model)."""
    model = body.get("model")
    names = [served.base, *served.adapters]
    if not isinstance(model, str) or not model:
        raise RequestError("`model` is required and must be a string; GET /v1/models lists those served here "
                           f"({', '.join(map(repr, names))}).", param="model",
                           code="invalid_type" if "model" in body else "missing")
    if model == served.base:
        return model, None
    if model in served.adapters:
        return model, model
    raise RequestError(f"model {model!r} is not served here; this server serves {', '.join(map(repr, names))} "
                       "(GET /v1/models).", param="model", code="model_not_found")


def parse_request(body: dict[str, Any], kind: str, served_model: str | ServedModels) -> ParsedRequest:
    """Validate an OpenAI completion (`kind="completion"`) or chat (`kind="chat"`) body."""
    served = served_model if isinstance(served_model, ServedModels) else ServedModels(served_model)
    endpoint = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    check_fields(body, endpoint, OPENAI_FIELDS[kind], EXTENSIONS[kind], REFUSED)
    model, adapter = resolve_model(body, served)
    n = body.get("n")
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise RequestError(f"`n`={n!r} must be an integer from 1 to {MAX_N} (choices per request; each is decoded in "
                           "a slot of its own).", param="n", code="invalid_value")
    prompt = messages = None
    tools = NO_TOOLS
    kwargs: dict[str, Any] = {}
    echo = False
    if kind == "completion":
        prompt = _prompt(body.get("prompt"))
        best_of = body.get("best_of")
        if best_of is not None and (not _is_int(best_of) or best_of != n):
            raise RequestError(f"`best_of`={best_of!r}: hwrun serve returns every choice it decodes; ask for "
                               f"n={best_of!r} choices and pick among them (best_of equal to n is taken).",
                               param="best_of", code="unsupported_parameter")
        echo = _optional(body, "echo", bool, False)
        logprobs = _optional(body, "logprobs", int, None)
        if logprobs is not None and not 0 <= logprobs <= COMPLETION_MAX_LOGPROBS:
            raise RequestError(f"`logprobs`={logprobs!r} must be from 0 to {COMPLETION_MAX_LOGPROBS} (the most "
                               "likely alternatives per token besides the chosen one).", param="logprobs",
                               code="invalid_value")
        if echo and logprobs is not None:
            raise RequestError("`echo` with `logprobs` needs the prompt's logprobs, which hwrun serve does not "
                               "compute; ask for one of them.", param="echo", code="unsupported_parameter")
    else:
        messages = parse_messages(body.get("messages"))
        logprobs = _chat_logprobs(body)
        tools = parse_tool_setup(parse_tools(body.get("tools")), body.get("tool_choice"),
                                 body.get("parallel_tool_calls"))
        kwargs = _template_kwargs(body.get("chat_template_kwargs"))
    max_tokens = body.get("max_completion_tokens") if kind == "chat" and "max_completion_tokens" in body else (
        body.get("max_tokens"))
    param = "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens <= 0):
        raise RequestError(f"`{param}`={max_tokens!r} must be a positive integer (new tokens to generate).",
                           param=param, code="invalid_value")
    if kind == "completion" and max_tokens is None:
        max_tokens = DEFAULT_COMPLETION_TOKENS
    stream = _optional(body, "stream", bool, False)
    include_usage = parse_stream_options(body.get("stream_options"), stream)
    fmt, structured = parse_response_format(body.get("response_format")) if kind == "chat" else ("text", None)
    structured = constrain(tools, fmt, structured)
    sampling = parse_sampling(body, served, logprobs=logprobs, structured=structured)
    return ParsedRequest(kind=kind, model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                         sampling=sampling, stop=_stop(body.get("stop")), stream=stream,
                         include_usage=include_usage, ignore_eos=_optional(body, "ignore_eos", bool, False), n=n,
                         adapter=adapter, stop_token_ids=_token_ids(body, "stop_token_ids", served.vocab_size),
                         tools=tools, chat_template_kwargs=kwargs, echo=echo, response_format=fmt)


#: The request field a client set, per field an engine backend may refuse (`Backend.refuses`).
ENGINE_FIELDS = {"min_p": "min_p", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                 "repetition_penalty": "repetition_penalty", "logit_bias": "logit_bias", "logprobs": "logprobs",
                 "structured": "response_format", "adapter": "model"}
_ENGINE_OFF: dict[str, Any] = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                               "repetition_penalty": 1.0, "logit_bias": (), "logprobs": None, "structured": None}


def engine_refusal(parsed: ParsedRequest, refuses: Mapping[str, str], engine: str | None) -> None:
    """A 400 naming the first field of `parsed` the engine's backend cannot apply (`refuses`: field -> why), before
    any work (the engine would fail the request at admission otherwise)."""
    for name, why in refuses.items():
        if name == "adapter":
            used = parsed.adapter is not None
        elif name in _ENGINE_OFF:
            used = getattr(parsed.sampling, name) != _ENGINE_OFF[name]
        else:
            continue
        if used:
            param = ENGINE_FIELDS[name]
            if name == "structured" and parsed.tools.constrained:
                param = "tool_choice"
            elif name == "structured" and parsed.kind == "responses":
                param = "text"
            raise RequestError(f"`{param}`: not served by this server's {engine or ''} engine ({why}).",
                               param=param, code="unsupported_by_engine")


def constrain(tools: ToolSetup, fmt: str, structured: StructuredOutput | None) -> StructuredOutput | None:
    """The constraint of a request: its `response_format`, or the calls a `required` / named `tool_choice`
    forces (not both)."""
    if not tools.constrained:
        return structured
    if structured is not None:
        raise RequestError(f"`tool_choice`={tools.choice if tools.function is None else tools.function!r} "
                           f"constrains the answer to tool calls, and `response_format` {fmt!r} to other JSON; "
                           "drop one of them.", param="response_format", code="invalid_value")
    schema = tools.constraint_schema()
    enforceable(schema, "tools")
    return StructuredOutput.json_schema(schema)


def parse_stream_options(options: Any, stream: bool) -> bool:
    """`stream_options` -> whether a usage chunk ends the stream (`include_usage` must be a boolean)."""
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError(f"`stream_options`={options!r} must be an object such as {{\"include_usage\": true}}.",
                           param="stream_options", code="invalid_type")
    for key, value in options.items():
        if key not in ("include_usage", "include_obfuscation"):
            raise RequestError(f"`stream_options.{key}` is not an option (include_usage, include_obfuscation).",
                               param="stream_options", code="unknown_parameter")
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"`stream_options.{key}`={value!r} must be true or false.",
                               param=f"stream_options.{key}", code="invalid_type")
    return bool(options.get("include_usage"))


def parse_response_format(value: Any) -> tuple[str, StructuredOutput | None]:
    """`response_format` -> ("text" | "json_object" | "json_schema", the constraint)."""
    if value is None:
        return "text", None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return "text", None
    if kind == "json_object":
        return "json_object", StructuredOutput("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RequestError("`response_format.json_schema` must be an object with `name` and `schema` "
                               "(a JSON Schema object).", param="response_format", code="invalid_schema")
        return "json_schema", schema_constraint(spec, "response_format.json_schema")
    raise RequestError(f"`response_format`={json.dumps(value)[:200]} must be {{\"type\": \"text\"}}, "
                       '{"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": '
                       "{...}}}.", param="response_format", code="invalid_value")


def schema_constraint(spec: dict[str, Any], where: str) -> StructuredOutput:
    """A json_schema spec (`name`, `schema`, `strict`, `description`) checked and turned into a constraint."""
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise RequestError(f"`{where}.name` must be a non-empty string.", param=where.split(".")[0],
                           code="invalid_schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestError(f"`{where}.strict` must be true or false.", param=where.split(".")[0],
                           code="invalid_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise RequestError(f"`{where}.schema` must be a JSON Schema object, got {type(schema).__name__}.",
                           param=where.split(".")[0], code="invalid_schema")
    check_schema(schema, f"{where}.schema")
    enforceable(schema, where.split(".")[0])
    return StructuredOutput.json_schema(schema)


def enforceable(schema: dict[str, Any], param: str) -> None:
    """Refuse (400) a schema that structured output cannot enforce (`hwrun.inference.structured.check_schema`:
    keywords no grammar engine enforces, look-around patterns), before any work."""
    from ..errors import StructuredOutputError
    from ..inference.structured.schema_check import check_schema as check_enforceable

    try:
        check_enforceable(schema)
    except StructuredOutputError as exc:
        raise RequestError(f"`{param}`: {exc}", param=param, code="invalid_schema") from None


def parse_sampling(body: dict[str, Any], served: ServedModels, *, logprobs: int | None = None,
                   structured: StructuredOutput | None = None) -> Sampling:
    """Every sampling field of `body` checked (OpenAI's and vLLM's ranges); a field left out takes the model's
    generation-config default (`served.defaults`), else OpenAI's."""
    def value(name: str, fallback: float) -> Any:
        given = body.get(name)
        return given if given is not None else served.defaults.get(name, fallback)

    temperature = _number({"temperature": value("temperature", 1.0)}, "temperature", 1.0)
    if not 0 <= temperature <= 2:
        raise RequestError(f"`temperature`={temperature!r} must be between 0 and 2 (0, or below {MIN_TEMPERATURE}: "
                           "greedy).", param="temperature", code="invalid_value")
    top_p = _number({"top_p": value("top_p", 1.0)}, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"`top_p`={top_p!r} must be in (0, 1].", param="top_p", code="invalid_value")
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0  # greedy: logits / 1e-40 are inf, and the sampler fails on them
    top_k = _optional({"top_k": value("top_k", 0)}, "top_k", int, 0)
    if top_k == -1:  # vLLM's and Transformers' "off"
        top_k = 0
    if not 0 <= top_k <= MAX_TOP_K:
        raise RequestError(f"`top_k`={top_k!r} must be between 0 and {MAX_TOP_K} (0 or -1: no top-k filter; a value "
                           "at or above the vocabulary size keeps every token).", param="top_k", code="invalid_value")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError(f"`seed`={seed!r} must be an integer in [0, 2**63).", param="seed", code="invalid_value")
    min_p = _number({"min_p": value("min_p", 0.0)}, "min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise RequestError(f"`min_p`={min_p!r} must be in [0, 1] (0: off).", param="min_p", code="invalid_value")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        penalties[name] = _number(body, name, 0.0)
        if not -2 <= penalties[name] <= 2:
            raise RequestError(f"`{name}`={penalties[name]!r} must be between -2 and 2 (0: off).", param=name,
                               code="invalid_value")
    repetition = _number({"repetition_penalty": value("repetition_penalty", 1.0)}, "repetition_penalty", 1.0)
    if not repetition > 0:
        raise RequestError(f"`repetition_penalty`={repetition!r} must be greater than 0 (1: off; above 1 "
                           "discourages repeats).", param="repetition_penalty", code="invalid_value")
    return Sampling(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), seed=seed,
                    min_p=float(min_p), presence_penalty=penalties["presence_penalty"],
                    frequency_penalty=penalties["frequency_penalty"], repetition_penalty=float(repetition),
                    logit_bias=_logit_bias(body.get("logit_bias"), served.vocab_size), logprobs=logprobs,
                    structured=structured)


def _logit_bias(bias: Any, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise RequestError(f"`logit_bias` must be an object mapping token ids (as strings) to biases, got "
                           f"{type(bias).__name__}.", param="logit_bias", code="invalid_type")
    if len(bias) > MAX_LOGIT_BIAS:
        raise RequestError(f"`logit_bias` has {len(bias)} entries; at most {MAX_LOGIT_BIAS}.", param="logit_bias",
                           code="invalid_value")
    out = []
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else None
        if token is None or (vocab_size is not None and token >= vocab_size):
            limit = f" below {vocab_size}" if vocab_size is not None else ""
            raise RequestError(f"`logit_bias` key {key!r} must be a token id{limit} written as a string, e.g. "
                               '{"1234": -100}.', param="logit_bias", code="invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise RequestError(f"`logit_bias[{key!r}]`={value!r} must be a number from -100 to 100.",
                               param="logit_bias", code="invalid_value")
        out.append((token, float(value)))
    return tuple(sorted(out))


def _token_ids(body: dict[str, Any], name: str, vocab_size: int | None) -> tuple[int, ...]:
    ids = body.get(name)
    if ids is None:
        return ()
    if (not isinstance(ids, list) or len(ids) > MAX_STOP_TOKEN_IDS or not all(_is_int(i) and i >= 0 for i in ids)
            or (vocab_size is not None and any(i >= vocab_size for i in ids))):
        limit = f" below {vocab_size}" if vocab_size is not None else ""
        raise RequestError(f"`{name}` must be a list of up to {MAX_STOP_TOKEN_IDS} token ids (integers >= 0{limit}).",
                           param=name, code="invalid_value")
    return tuple(ids)


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = _optional(body, "logprobs", bool, False)
    top = _optional(body, "top_logprobs", int, None)
    if top is not None and not 0 <= top <= CHAT_MAX_TOP_LOGPROBS:
        raise RequestError(f"`top_logprobs`={top!r} must be from 0 to {CHAT_MAX_TOP_LOGPROBS}.", param="top_logprobs",
                           code="invalid_value")
    if top and not wanted:
        raise RequestError("`top_logprobs` needs `logprobs: true`.", param="top_logprobs", code="invalid_value")
    return (top or 0) if wanted else None


def _template_kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"`chat_template_kwargs` must be an object such as {{\"enable_thinking\": false}}, got "
                           f"{type(value).__name__}.", param="chat_template_kwargs", code="invalid_type")
    for key in value:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise RequestError(f"`chat_template_kwargs.{key}` is set by the server itself (from `messages`, `tools`, "
                               "...); leave it out.", param="chat_template_kwargs", code="invalid_value")
    return dict(value)


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


#: Message keys taken beside `role` and `content` (passed to the chat template); any other key must be null.
MESSAGE_KEYS = ("name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning")


def parse_messages(messages: Any) -> tuple[dict[str, Any], ...]:
    """Chat `messages`: system, developer (as system), user, assistant (content may be empty or null beside
    `tool_calls`) and tool (`tool_call_id`) turns, text content or text parts."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of {\"role\": ..., \"content\": ...} objects.",
                           param="messages", code="invalid_type" if messages is not None else "missing")
    return tuple(_message(message, f"messages[{index}]") for index, message in enumerate(messages))


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise RequestError(f"`{where}` must be an object with role and content.", param=where, code="invalid_type")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise RequestError(f"`{where}.role`={role!r} must be one of {', '.join(CHAT_ROLES)}.",
                           param=f"{where}.role", code="invalid_value")
    for key, value in message.items():
        if key not in ("role", "content", *MESSAGE_KEYS) and value is not None:
            raise RequestError(f"`{where}.{key}` is not taken here (a message has role, content, name, tool_calls, "
                               "tool_call_id); leave it out.", param=f"{where}.{key}", code="unknown_parameter")
    tool_calls = message.get("tool_calls")
    content = message.get("content")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    if content is None and role == "assistant":
        content = ""  # an assistant turn with only tool calls (or a refusal)
    out["content"] = _content(content, f"{where}.content")
    if tool_calls is not None:
        if role != "assistant":
            raise RequestError(f"`{where}.tool_calls` belongs to assistant messages.", param=f"{where}.tool_calls",
                               code="invalid_value")
        out["tool_calls"] = _tool_calls(tool_calls, f"{where}.tool_calls")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"`{where}.tool_call_id` is required for a tool message (the id of the call it "
                               "answers).", param=f"{where}.tool_call_id", code="missing")
        out["tool_call_id"] = call_id
    for key in ("name", "reasoning_content", "reasoning"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise RequestError(f"`{where}.{key}` must be a string.", param=f"{where}.{key}", code="invalid_type")
            out[key] = value
    return out


#: Part types whose text a message's content list may hold (Chat Completions' "text", the Responses API's
#: "input_text"/"output_text"); images, files and audio are refused.
TEXT_PART_TYPES = ("text", "input_text", "output_text")


def text_of(content: Any, where: str, *, parts: str, expected: str) -> str:
    """`content` as one string: a string as it is, a list of text parts (`TEXT_PART_TYPES`) joined; anything else
    a RequestError naming `where` and saying what its parts (`parts`) or the whole (`expected`) must be."""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in TEXT_PART_TYPES or (
                    not isinstance(part.get("text"), str)):
                raise RequestError(f"`{where}` parts must be {parts}.", param=where, code="invalid_type")
            texts.append(part["text"])
        return "".join(texts)
    if not isinstance(content, str):
        raise RequestError(f"`{where}` must be {expected}, got {type(content).__name__}.", param=where,
                           code="invalid_type")
    return content


def _content(content: Any, where: str) -> str:
    return text_of(content, where, parts='{"type": "text", "text": ...}; images and audio are not served here',
                   expected="a string")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's `tool_calls`, their JSON `arguments` given to the template as objects (Transformers'
    templates take them so); arguments that are not a JSON object stay text."""
    if not isinstance(calls, list):
        raise RequestError(f"`{where}` must be a list of tool calls.", param=where, code="invalid_type")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, (str, dict)):
            raise RequestError(f"`{where}[{i}]` must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                               "{\"name\": ..., \"arguments\": \"<JSON>\"}}.", param=f"{where}[{i}]",
                               code="invalid_type")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        item: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if isinstance(call.get("id"), str):
            item["id"] = call["id"]
        out.append(item)
    return out


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
    """A response id in OpenAI's style: `cmpl-...`, `chatcmpl-...` or (Responses API) `resp_...`."""
    prefix = {"chat": "chatcmpl-", "responses": "resp_"}.get(kind, "cmpl-")
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's `usage` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True)
class TokenInfo:
    """One generated token for `logprobs`: its text and bytes, its logprob, and the top alternatives as
    (text, bytes, logprob), most likely first."""

    token: str
    bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


def _lp(value: float) -> float:
    """A logprob as OpenAI writes it (-9999.0 for a token the model gives no chance)."""
    return float(value) if math.isfinite(value) else -9999.0


def chat_logprobs(tokens: list[TokenInfo]) -> dict[str, Any]:
    """Chat's `choices[].logprobs`: `content` with token, logprob, bytes and `top_logprobs` per token."""
    return {"content": [{"token": t.token, "logprob": _lp(t.logprob), "bytes": list(t.bytes),
                         "top_logprobs": [{"token": s, "logprob": _lp(lp), "bytes": list(b)} for s, b, lp in t.top]}
                        for t in tokens], "refusal": None}


def completion_logprobs(tokens: list[TokenInfo], offset: int, alternatives: int) -> dict[str, Any]:
    """/v1/completions' `choices[].logprobs`: tokens, token_logprobs, top_logprobs (a token -> logprob map per
    position, None when no alternatives were asked for) and text_offset (from `offset` in the choice's text)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [_lp(t.logprob) for t in tokens],
            "top_logprobs": [{s: _lp(lp) for s, _, lp in t.top} if alternatives else None for t in tokens],
            "text_offset": offsets}


def completion_choice(index: int, text: str, finish_reason: str | None,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One choice of a whole /v1/completions answer."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(index: int, content: str | None, finish_reason: str | None, *,
                tool_calls: list[dict[str, Any]] | None = None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One choice of a whole chat answer; `content` is null when the turn is only tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def response_body(kind: str, rid: str, model: str, text: str, finish_reason: str | None,
                  prompt_tokens: int, completion_tokens: int, created: int | None = None, *,
                  choices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A whole (not streamed) completion or chat completion: one choice of `text`, or `choices` as given."""
    created = int(time.time()) if created is None else created
    if choices is None:
        choices = [chat_choice(0, text, finish_reason) if kind == "chat" else
                   completion_choice(0, text, finish_reason)]
    obj = "chat.completion" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
               finish_reason: str | None = None, index: int = 0, tool_calls: list[dict[str, Any]] | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chunk of choice `index`: new `text` (and `tool_calls` pieces, `logprobs` of its tokens), the
    opening `role` (chat), or the closing `finish_reason`."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def text_chunk_encoder(kind: str, rid: str, model: str, created: int, index: int = 0) -> Callable[[str], bytes]:
    """`encode(text)`: the same bytes as `sse(chunk_body(kind, rid, model, created, text=text))`, with the chunk's fixed
    JSON rendered once per request (only the text is encoded per chunk: streaming sends one chunk per step)."""
    marker = "hwrun-text-\u2063"
    whole = sse(chunk_body(kind, rid, model, created, text=marker, index=index)).decode()
    head, found, tail = whole.partition(json.dumps(marker, ensure_ascii=False))
    if not found or marker in head or marker in tail:  # cannot happen with JSON; the slow path stays exact
        return lambda text: sse(chunk_body(kind, rid, model, created, text=text, index=index))
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
