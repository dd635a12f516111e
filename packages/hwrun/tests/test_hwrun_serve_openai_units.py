"""The OpenAI surface of `hwrun serve` without a server (issue 36): tool-call parsers on fixed strings (whole and
split at every position), the tool fields and the constraints they make, every request field's rule (table-driven),
the Responses API's input items, the tool format read from a chat template, token texts for logprobs, and a `Run`
fed scripted engine events (n choices, logprobs, tool calls, a cut at shutdown) written as OpenAI's shapes."""

from __future__ import annotations

import asyncio
import json
import types

import hwrun
import pytest
from hwrun.errors import RequestError, ServeConfigError
from hwrun.serve import protocol
from hwrun.serve.config import ServeConfig, check_config, parse_lora
from hwrun.serve.engine import EngineEvent, TokenLogprob
from hwrun.serve.protocol import ServedModels, parse_request
from hwrun.serve.tools import NamedParser, make_parser
from hwrun.serve.tools.spec import parse_tool_setup, parse_tools

MODEL_ID = "hwrun/tiny-llama"
SERVED = ServedModels(MODEL_ID, ("bible",), {}, 3072)
#: A chat template in Qwen2/Hermes' style: it renders `tools`, and calls as <tool_call> JSON.
HERMES_TEMPLATE = (
    "{{ bos_token }}{% if tools %}system: tools: {% for t in tools %}{{ t.function.name }}{{ t.function.parameters "
    "| tojson }} {% endfor %}answer <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}assistant: {{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}\n{% elif m.role == 'tool' %}tool: {{ m.content }}\n{% else %}{{ m.role }}: "
    "{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
PLAIN_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "enum": ["Paris", "Rome"]}},
                                               "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]}}}]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)


# ------------------------------------------------------------------------------------------------ parsers


def _run(factory, pieces):
    """(content, [(name, arguments)], parser) of `pieces` pushed through a new parser, assembled from deltas as
    an OpenAI client assembles `delta.tool_calls`."""
    parser = factory()
    content, calls = "", {}

    def take(out):
        nonlocal content
        text, deltas = out
        content += text
        for delta in deltas:
            if delta.id is not None:
                assert delta.index not in calls and delta.name, "a call opens once, with its id and name"
                calls[delta.index] = [delta.name, ""]
            else:
                assert delta.name is None and delta.index in calls
            calls[delta.index][1] += delta.arguments

    for piece in pieces:
        take(parser.push(piece))
    take(parser.finish())
    return content, [tuple(calls[i]) for i in sorted(calls)], parser


PARSER_CASES = [
    ("hermes", 'Sure.<tool_call>\n{"name": "get", "arguments": {"city": "Paris", "n": 3}}\n</tool_call>\n'
               '<tool_call>{"arguments": {}, "name": "b"}</tool_call> done',
     "Sure. done", [("get", '{"city": "Paris", "n": 3}'), ("b", "{}")]),
    ("hermes", "no calls < here <tool", "no calls < here <tool", []),
    ("hermes", 'x<tool_call>{"name": "f", "arguments": {"a": "}</tool_call>"}}', "x",
     [("f", '{"a": "}</tool_call>"}')]),
    ("hermes", "a <tool_call> not json", "a <tool_call> not json", []),
    ("llama3_json", '{"name": "get", "parameters": {"city": "Rome"}}; {"name": "h", "parameters": {}}', "",
     [("get", '{"city": "Rome"}'), ("h", "{}")]),
    ("llama3_json", '<|python_tag|>{"name": "get", "parameters": {"q": [1, 2]}}', "", [("get", '{"q": [1, 2]}')]),
    ("llama3_json", 'Hello {"name": "x"}', 'Hello {"name": "x"}', []),
    ("mistral", 'ok [TOOL_CALLS][{"name": "get", "arguments": {"city": "Paris"}}, {"name": "b", "arguments": '
                '{"x": 1}}]', "ok ", [("get", '{"city": "Paris"}'), ("b", '{"x": 1}')]),
    ("mistral", '[TOOL_CALLS]get[ARGS]{"city": "Paris"}[TOOL_CALLS]b[ARGS]{}', "",
     [("get", '{"city": "Paris"}'), ("b", "{}")]),
    ("mistral", "plain [TOOL text", "plain [TOOL text", []),
    ("required", '[{"name": "get", "parameters": {"city": "Paris"}}, {"name": "b", "parameters": {}}]', "",
     [("get", '{"city": "Paris"}'), ("b", "{}")]),
]


@pytest.mark.parametrize("name, text, content, calls", PARSER_CASES)
def test_tool_parsers_read_each_format_whole_and_split_at_every_position(name, text, content, calls):
    whole = _run(lambda: make_parser(name), [text])
    assert whole[:2] == (content, calls)
    assert [(c.name, c.arguments) for c in whole[2].tool_calls] == calls
    for call in whole[2].tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    for cut in range(len(text) + 1):
        assert _run(lambda: make_parser(name), [text[:cut], text[cut:]])[:2] == whole[:2], cut
    assert _run(lambda: make_parser(name), list(text))[:2] == whole[:2]  # one character at a time


def test_a_named_function_parser_streams_the_arguments_object():
    text = ' {"city": "Paris"}'
    whole = _run(lambda: NamedParser("get_weather"), [text])
    assert whole[:2] == ("", [("get_weather", '{"city": "Paris"}')])
    for cut in range(len(text) + 1):
        assert _run(lambda: NamedParser("get_weather"), [text[:cut], text[cut:]])[:2] == whole[:2]
    cut_short = _run(lambda: NamedParser("get_weather"), ['{"city": "Pa'])[2]
    assert cut_short.tool_calls == [] and cut_short.whole_content == '{"city": "Pa'  # max_tokens cut it: not a call


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    content, calls, parser = _run(lambda: make_parser("hermes", max_calls=1), [text])
    assert calls == [("a", "{}")] and [c.name for c in parser.tool_calls] == ["a"]


def test_an_invalid_call_is_content_in_a_whole_answer():
    parser = _run(lambda: make_parser("hermes"), ['hi <tool_call>{"name": "f", "arguments": [1]}</tool_call>'])[2]
    assert parser.tool_calls == [] and '"arguments": [1]' in parser.whole_content


def test_mistral_call_ids_are_nine_characters():
    parser = _run(lambda: make_parser("mistral"), ['[TOOL_CALLS][{"name": "a", "arguments": {}}]'])[2]
    assert len(parser.tool_calls[0].id) == 9 and parser.tool_calls[0].id.isalnum()
    other = _run(lambda: make_parser("hermes"), ['<tool_call>{"name": "a", "arguments": {}}</tool_call>'])[2]
    assert other.tool_calls[0].id.startswith("call_")


# ----------------------------------------------------------------------------------------- tool fields


def test_required_and_named_choices_build_vllms_constraint_shapes():
    tools = parse_tools(TOOLS)
    required = parse_tool_setup(tools, "required", None).constraint_schema()
    assert required["type"] == "array" and required["minItems"] == 1 and "maxItems" not in required
    variants = required["items"]["anyOf"]
    assert [v["properties"]["name"]["enum"] for v in variants] == [["get_weather"], ["get_time"]]
    assert variants[0]["properties"]["parameters"] == TOOLS[0]["function"]["parameters"]
    assert parse_tool_setup(tools, "required", False).constraint_schema()["maxItems"] == 1
    named = parse_tool_setup(tools, {"type": "function", "function": {"name": "get_time"}}, None)
    assert named.choice == "function" and named.constraint_schema() == TOOLS[1]["function"]["parameters"]
    assert parse_tool_setup(tools, None, None).choice == "auto" and parse_tool_setup((), None, None).choice == "none"
    request = parse_request({"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                             "tool_choice": "required"}, "chat", SERVED)
    assert request.sampling.structured.kind == "json_schema"
    assert request.sampling.structured.schema_dict() == required


@pytest.mark.parametrize("tools, choice, words", [
    ([{"type": "web_search"}], None, "function tools only"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, "letters, digits"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}], None, "not a JSON Schema type"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "JSON Schema object"),
    (TOOLS + [TOOLS[0]], None, "twice"),
    (TOOLS, "sometimes", "must be none, auto, required"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in `tools`"),
    (None, "required", "needs `tools`"),
])
def test_bad_tool_fields_are_400s_naming_the_field(tools, choice, words):
    with pytest.raises(RequestError, match=words) as info:
        parse_tool_setup(parse_tools(tools), choice, None)
    assert info.value.status == 400 and info.value.param.startswith(("tools", "tool_choice"))


# ------------------------------------------------------------------------------------------ every field


def _chat(**body):
    return parse_request({"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], **body}, "chat", SERVED)


def _completion(**body):
    return parse_request({"model": MODEL_ID, "prompt": "x", **body}, "completion", SERVED)


def test_every_sampling_field_reaches_sampling_with_openai_and_vllm_names():
    s = _chat(temperature=0.5, top_p=0.9, top_k=7, seed=3, min_p=0.1, presence_penalty=-1.5, frequency_penalty=2,
              repetition_penalty=1.2, logit_bias={"17": -100, "5": 3.5}, logprobs=True, top_logprobs=4).sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.min_p) == (0.5, 0.9, 7, 3, 0.1)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (-1.5, 2.0, 1.2)
    assert s.logit_bias == ((5, 3.5), (17, -100.0)) and s.logprobs == 4
    assert _chat(logprobs=True).sampling.logprobs == 0 and _chat(logprobs=False).sampling.logprobs is None
    assert _completion(logprobs=3).sampling.logprobs == 3 and _completion(logprobs=0).sampling.logprobs == 0
    assert _completion(top_k=-1).sampling.top_k == 0  # vLLM's "off"
    request = _chat(n=3, stop_token_ids=[2, 9], chat_template_kwargs={"enable_thinking": False}, model="bible")
    assert (request.n, request.stop_token_ids, request.adapter) == (3, (2, 9), "bible")
    assert dict(request.chat_template_kwargs) == {"enable_thinking": False}
    assert _chat().adapter is None and _completion(echo=True, best_of=1).echo


def test_generation_config_defaults_apply_where_the_request_is_silent():
    served = ServedModels(MODEL_ID, (), {"temperature": 0.6, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
                          3072)
    s = parse_request({"model": MODEL_ID, "prompt": "x"}, "completion", served).sampling
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty) == (0.6, 0.8, 20, 1.05)
    s = parse_request({"model": MODEL_ID, "prompt": "x", "temperature": 0, "top_k": 0}, "completion", served).sampling
    assert (s.temperature, s.top_k, s.top_p) == (0.0, 0, 0.8)


def test_response_formats_become_constraints_and_text_is_the_default():
    assert _chat().sampling.structured is None and _chat(response_format={"type": "text"}).sampling.structured is None
    assert _chat(response_format={"type": "json_object"}).sampling.structured.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    parsed = _chat(response_format={"type": "json_schema", "json_schema": {"name": "A", "schema": schema,
                                                                           "strict": True}})
    assert parsed.response_format == "json_schema" and parsed.sampling.structured.schema_dict() == schema


BAD_FIELDS = [
    ("chat", {"n": 0}, "n", "invalid_value"),
    ("chat", {"n": protocol.MAX_N + 1}, "n", "invalid_value"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty", "invalid_value"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
    ("chat", {"min_p": 1.5}, "min_p", "invalid_value"),
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias", "invalid_value"),
    ("chat", {"logit_bias": {"99999": 1}}, "logit_bias", "invalid_value"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias", "invalid_value"),
    ("chat", {"logit_bias": [1]}, "logit_bias", "invalid_type"),
    ("chat", {"top_logprobs": 3}, "top_logprobs", "invalid_value"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ("chat", {"logprobs": 2}, "logprobs", "invalid_type"),
    ("completion", {"logprobs": 6}, "logprobs", "invalid_value"),
    ("completion", {"logprobs": True}, "logprobs", "invalid_type"),
    ("completion", {"echo": True, "logprobs": 1}, "echo", "unsupported_parameter"),
    ("completion", {"best_of": 3}, "best_of", "unsupported_parameter"),
    ("completion", {"suffix": "end"}, "suffix", "unsupported_parameter"),
    ("chat", {"stop_token_ids": [-1]}, "stop_token_ids", "invalid_value"),
    ("chat", {"stop_token_ids": [5000]}, "stop_token_ids", "invalid_value"),
    ("chat", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "invalid_value"),
    ("chat", {"chat_template_kwargs": "x"}, "chat_template_kwargs", "invalid_type"),
    ("chat", {"response_format": {"type": "xml"}}, "response_format", "invalid_value"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}, "response_format",
     "invalid_schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objet"}}}},
     "response_format", "invalid_schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format", "invalid_schema"),
    ("chat", {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "invalid_value"),
    ("chat", {"store": True}, "store", "unsupported_parameter"),
    ("chat", {"service_tier": "flex"}, "service_tier", "unsupported_parameter"),
    ("chat", {"audio": {"voice": "x"}}, "audio", "unsupported_parameter"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction", "unsupported_parameter"),
    ("chat", {"reasoning_effort": "high"}, "reasoning_effort", "unsupported_parameter"),
    ("chat", {"verbosity": "low"}, "verbosity", "unsupported_parameter"),
    ("chat", {"web_search_options": {}}, "web_search_options", "unsupported_parameter"),
    ("chat", {"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ("chat", {"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ("chat", {"moderation": {"x": 1}}, "moderation", "unsupported_parameter"),
    ("chat", {"parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_type"),
    ("chat", {"guided_json": {}}, "guided_json", "unknown_parameter"),
    ("chat", {"best_of": 2}, "best_of", "unknown_parameter"),
    ("completion", {"chat_template_kwargs": {}}, "chat_template_kwargs", "unknown_parameter"),
    ("completion", {"tools": []}, "tools", "unknown_parameter"),
    ("chat", {"stream_options": {"include_usage": "false"}}, "stream_options.include_usage", "invalid_type"),
    ("chat", {"stream_options": {"nope": True}}, "stream_options", "unknown_parameter"),
    ("chat", {"model": "other"}, "model", "model_not_found"),
    ("chat", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "missing"),
    ("chat", {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls",
     "invalid_value"),
    ("chat", {"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}, "messages[0].audio",
     "unknown_parameter"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0]", "invalid_type"),
]


@pytest.mark.parametrize("kind, body, param, code", BAD_FIELDS)
def test_each_bad_or_unserved_field_is_a_400_naming_it(kind, body, param, code):
    with pytest.raises(RequestError) as info:
        (_chat if kind == "chat" else _completion)(**body)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code), info.value.message


def test_openai_fields_without_effect_are_accepted_and_no_op_values_of_refused_ones_too():
    parsed = _chat(user="u1", metadata={"k": "v"}, safety_identifier="s", prompt_cache_key="p", store=False,
                   service_tier="auto", modalities=["text"], parallel_tool_calls=True, audio=None, n=1,
                   prompt_cache_retention="24h", stream_options={"include_usage": True, "include_obfuscation": False})
    assert parsed.messages == ({"role": "user", "content": "x"},)
    assert _completion(user="u", suffix="", best_of=1, echo=False).prompt == "x"


def test_every_openai_field_of_the_official_client_is_served_or_refused_explicitly():
    import inspect

    from openai.resources.chat.completions import Completions as Chat
    from openai.resources.completions import Completions

    plumbing = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    for kind, method in (("chat", Chat.create), ("completion", Completions.create)):
        sent = set(inspect.signature(method).parameters) - plumbing
        assert sent <= set(protocol.OPENAI_FIELDS[kind]), sorted(sent - set(protocol.OPENAI_FIELDS[kind]))


def test_assistant_tool_calls_and_tool_messages_are_accepted():
    messages = parse_request({"model": MODEL_ID, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
        {"role": "assistant", "content": ""}]}, "chat", SERVED).messages
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


# ------------------------------------------------------------------------------------------- Responses API


def test_responses_input_items_become_chat_messages():
    from hwrun.serve.responses import parse_responses

    parsed, meta = parse_responses({"model": MODEL_ID, "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": '{"utc": true}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 20,
        "text": {"format": {"type": "text"}}, "store": False, "metadata": {"a": "b"}}, SERVED)
    assert [m["role"] for m in parsed.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in parsed.messages[2]["tool_calls"]] == ["c1", "c2"]
    assert parsed.tools.choice == "function" and parsed.max_tokens == 20 and meta.metadata == {"a": "b"}
    assert parsed.sampling.structured.schema_dict() == TOOLS[0]["function"]["parameters"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    parsed, _ = parse_responses({"model": MODEL_ID, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "A", "schema": schema, "strict": True}}}, SERVED)
    assert parsed.sampling.structured.schema_dict() == schema and parsed.messages == ({"role": "user",
                                                                                       "content": "hi"},)


@pytest.mark.parametrize("body, param, code", [
    ({"store": True}, "store", "unsupported_parameter"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"include": ["file_search_call.results"]}, "include", "unsupported_parameter"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "unsupported_tool"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content",
     "invalid_type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}, "text", "invalid_schema"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"frequency_penalty": 1}, "frequency_penalty", "unknown_parameter"),
])
def test_responses_bad_or_unserved_fields_are_400s(body, param, code):
    from hwrun.serve.responses import parse_responses

    with pytest.raises(RequestError) as info:
        parse_responses({"model": MODEL_ID, "input": "hi", **body}, SERVED)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code), info.value.message


def test_every_responses_field_of_the_official_client_is_served_or_refused_explicitly():
    import inspect

    from hwrun.serve.responses import RESPONSES_FIELDS
    from openai.resources.responses import Responses

    plumbing = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    assert set(inspect.signature(Responses.create).parameters) - plumbing <= set(RESPONSES_FIELDS)


# ------------------------------------------------------------------------------------- templates, tokens


def test_the_tool_format_is_read_from_the_chat_template(tokenizer):
    from hwrun.serve.tools.choice import choose_tool_support

    tokenizer.chat_template = HERMES_TEMPLATE
    support = choose_tool_support(tokenizer)
    assert support.parser == "hermes" and support.renders and "<tool_call> in the chat template" in support.why
    assert choose_tool_support(tokenizer, "llama3_json").parser == "llama3_json"
    tokenizer.chat_template = PLAIN_TEMPLATE
    support = choose_tool_support(tokenizer)
    assert support.parser is None and not support.renders and "does not render `tools`" in support.why
    tokenizer.chat_template = PLAIN_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}{{ tools | tojson }}")
    support = choose_tool_support(tokenizer)
    assert support.parser is None and support.renders and "--tool-parser" in support.why
    tokenizer.chat_template = None


def test_special_marker_tokens_a_parser_needs_stay_in_the_text(tokenizer):
    from hwrun.serve.text import Detokenizer, StreamDetokenizer, special_ids

    ids = tokenizer("a b", add_special_tokens=False)["input_ids"]
    marked = [1, *ids, 2]  # <s> a b </s>: keep <s> as if it were a parser's marker
    drop = special_ids(tokenizer) - {1}
    for make in (lambda: Detokenizer(tokenizer, drop_ids=drop),
                 lambda: StreamDetokenizer(tokenizer.backend_tokenizer, drop_ids=drop)):
        detok = make()
        text = "".join(detok.push([i]) for i in marked) + detok.flush()
        assert text == "<s>" + tokenizer.decode(ids)


def test_token_texts_give_exact_bytes_even_inside_a_character(tokenizer):
    from hwrun.serve.text import TokenTexts

    texts = TokenTexts(tokenizer)
    ids = tokenizer("héllo 😀 king", add_special_tokens=False)["input_ids"]
    assert b"".join(texts(i)[1] for i in ids).decode() == "héllo 😀 king"
    assert texts(ids[-1]) == (tokenizer.decode([ids[-1]]), tokenizer.decode([ids[-1]]).encode())


# ----------------------------------------------------------------------------------------- config


def test_lora_options_are_checked_before_anything_loads(tmp_path):
    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "peft_type": "LORA",
                                                             "base_model_name_or_path": hwrun.DEFAULT_MODEL}))
    assert parse_lora([f"bible={adapter}"]) == (("bible", str(adapter)),)
    check_config(ServeConfig(adapters=(("bible", str(adapter)),)))
    for adapters, words in [((("x", str(tmp_path / "none")),), "no such folder"),
                            ((("x", str(tmp_path)),), "no adapter_config.json"),
                            ((("x", str(adapter)), ("x", str(adapter))), "given twice"),
                            (((MODEL_ID, str(adapter)),), "the base model's id"),
                            ((("bad name", str(adapter)),), "must be 1-128")]:
        with pytest.raises(ServeConfigError, match=words):
            check_config(ServeConfig(adapters=adapters))
    with pytest.raises(ServeConfigError, match="NAME=PATH"):
        parse_lora(["just-a-path"])
    (adapter / "adapter_config.json").write_text(json.dumps({"r": "four"}))
    with pytest.raises(ServeConfigError, match="r='four'"):
        check_config(ServeConfig(adapters=(("bible", str(adapter)),)))
    with pytest.raises(ServeConfigError, match="--tool-parser"):
        check_config(ServeConfig(tool_parser="pythonic"))


# --------------------------------------------------------------------------- a Run over scripted events


class _Engine:
    stall_seconds = 30.0

    def __init__(self):
        self.cancelled = []

    def cancel(self, rid):
        self.cancelled.append(rid)


def _state(tokenizer, parser="hermes"):
    from hwrun.serve.metrics import Metrics
    from hwrun.serve.text import TokenTexts
    from hwrun.serve.tools.choice import ToolSupport

    return types.SimpleNamespace(tokenizer=tokenizer, drop_ids=None, metrics=Metrics(), engine=_Engine(),
                                 runs=set(), token_texts=TokenTexts(tokenizer),
                                 tool_support=ToolSupport(parser, True, "test"))


def _feed(run, events):
    async def go():
        loop = asyncio.get_running_loop()
        for event in events:
            loop.call_soon(run.deliver, event)
        return [chunk async for chunk in run.stream()]
    return asyncio.run(go())


def _chunks(raw):
    out = []
    for chunk in raw:
        text = chunk.decode()
        assert text.startswith("data: ") and text.endswith("\n\n")
        out.append(text[6:-2] if text[6:-2] == "[DONE]" else json.loads(text[6:-2]))
    return out


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_n_choices_stream_with_their_index_and_usage_counts_them_all(tokenizer):
    from hwrun.serve.request import Run

    parsed = _chat(n=2, stream=True, stream_options={"include_usage": True})
    run = Run(_state(tokenizer), "chat", parsed, 5, 0.0)
    a, b = _ids(tokenizer, "one two"), _ids(tokenizer, "three")
    events = [EngineEvent(run.rid, (a[0],), index=0), EngineEvent(run.rid, tuple(b), index=1),
              EngineEvent(run.rid, tuple(a[1:]), True, "stop", index=0), EngineEvent(run.rid, (), True, "length",
                                                                                    index=1)]
    chunks = _chunks(_feed(run, events))
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == len(a) + len(b)
    text = {0: "", 1: ""}
    finish = {}
    for chunk in chunks[:-2]:
        for choice in chunk["choices"]:
            text[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                finish[choice["index"]] = choice["finish_reason"]
    assert text == {0: "one two", 1: "three"} and finish == {0: "stop", 1: "length"}


def test_logprobs_are_written_in_chat_and_completion_shapes(tokenizer):
    from hwrun.serve.request import Run

    ids = _ids(tokenizer, "The king")
    lps = tuple(TokenLogprob(-0.5 * (i + 1), ((ids[i], -0.5 * (i + 1)), (7, -3.0))) for i in range(len(ids)))
    run = Run(_state(tokenizer), "chat", _chat(stream=True, logprobs=True, top_logprobs=2), 3, 0.0)
    chunks = _chunks(_feed(run, [EngineEvent(run.rid, tuple(ids), True, "stop", logprobs=lps)]))
    content = [c for chunk in chunks[:-1] for choice in chunk["choices"] if choice["logprobs"]
               for c in choice["logprobs"]["content"]]
    assert [c["token"] for c in content] == [tokenizer.decode([i]) for i in ids]
    assert [c["logprob"] for c in content] == [-0.5 * (i + 1) for i in range(len(ids))]
    assert bytes(content[0]["bytes"]) == content[0]["token"].encode()
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.5, -3.0]
    run = Run(_state(tokenizer), "completion", _completion(stream=True, logprobs=1, echo=False), 3, 0.0)
    chunks = _chunks(_feed(run, [EngineEvent(run.rid, tuple(ids), True, "stop", logprobs=lps)]))
    body = next(c["choices"][0]["logprobs"] for c in chunks[:-1] if c["choices"][0]["logprobs"])
    assert body["tokens"] == [tokenizer.decode([i]) for i in ids] and body["token_logprobs"][0] == -0.5
    assert body["text_offset"] == [0, len(body["tokens"][0])] and len(body["top_logprobs"][0]) == 2


def test_tool_calls_stream_as_openai_deltas_and_finish_with_tool_calls(tokenizer):
    from hwrun.serve.request import Run

    text = 'ok<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    ids = _ids(tokenizer, text)
    run = Run(_state(tokenizer), "chat", _chat(stream=True, tools=TOOLS), 9, 0.0)
    events = [EngineEvent(run.rid, (i,)) for i in ids] + [EngineEvent(run.rid, (), True, "stop")]
    chunks = _chunks(_feed(run, events))
    deltas = [c for chunk in chunks[:-1] for choice in chunk["choices"] for c in choice["delta"].get("tool_calls", [])]
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Paris"}'
    assert {d["index"] for d in deltas} == {0} and len(deltas) > 2  # the arguments came in fragments
    content = "".join(choice["delta"].get("content") or "" for chunk in chunks[:-1] for choice in chunk["choices"])
    assert content == "ok" and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_request_ended_at_shutdown_streams_an_error_event_and_done(tokenizer):
    from hwrun.serve.request import Run

    state = _state(tokenizer)
    run = Run(state, "completion", _completion(stream=True), 3, 0.0)
    ids = _ids(tokenizer, "The king")

    async def go():
        loop = asyncio.get_running_loop()
        loop.call_soon(run.deliver, EngineEvent(run.rid, (ids[0],)))
        loop.call_soon(run.end_now, "shutting down (--grace-seconds)")
        return [chunk async for chunk in run.stream()]

    chunks = _chunks(asyncio.run(go()))
    assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["code"] == "shutting_down"
    assert "grace" in chunks[-2]["error"]["message"] and run.rid in state.engine.cancelled


def test_tools_with_a_template_that_cannot_show_them_or_an_unknown_format_are_400s(tokenizer):
    from hwrun.serve.request import encode
    from hwrun.serve.tools.choice import choose_tool_support

    state = types.SimpleNamespace(tokenizer=tokenizer, max_model_len=512, config=types.SimpleNamespace(model_id="m"))
    for template, choice, words in [(PLAIN_TEMPLATE, None, "does not render `tools`"),
                                    (PLAIN_TEMPLATE, "required", "does not render `tools`"),
                                    (PLAIN_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}{{ tools | tojson }}"),
                                     None, "none of the formats")]:
        tokenizer.chat_template = template
        state.tool_support = choose_tool_support(tokenizer)
        with pytest.raises(RequestError, match=words) as info:
            encode(state, _chat(tools=TOOLS, tool_choice=choice))
        assert info.value.param == "tools" and "--tool-parser" in info.value.message
    # an unknown format still serves a constrained choice: the calls come from the grammar, not a parser
    assert encode(state, _chat(tools=TOOLS, tool_choice="required"))
    assert encode(state, _chat(tools=TOOLS, tool_choice="none"))  # tools the model is told not to call: no check
    tokenizer.chat_template = None


def test_models_cards_list_each_adapter_with_the_base_as_parent(tmp_path):
    from hwrun.serve.state import ServeState

    state = ServeState.__new__(ServeState)
    state.config = ServeConfig(model_id=MODEL_ID, adapters=(("bible", str(tmp_path)),))
    state.loaded, state.created = None, 1
    state.served = ServedModels(MODEL_ID, ("bible",))
    cards = state.adapter_cards()
    assert cards == [{"id": "bible", "object": "model", "created": 1, "owned_by": "hwrun", "root": str(tmp_path),
                      "parent": MODEL_ID, "max_model_len": None,
                      "hwrun": {"adapter": str(tmp_path), "base": MODEL_ID}}]
    assert state.card("bible") == cards[0] and state.card("other") is None


def test_fields_the_engine_cannot_apply_are_400s_before_any_work():
    from hwrun.serve.protocol import engine_refusal

    refuses = {"min_p": "only temperature", "structured": "no mask", "adapter": "one set of weights"}
    engine_refusal(_chat(), refuses, "transformers")  # nothing refused asked for
    for body, param in [({"min_p": 0.2}, "min_p"), ({"response_format": {"type": "json_object"}}, "response_format"),
                        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"), ({"model": "bible"}, "model")]:
        with pytest.raises(RequestError, match="not served by this server's transformers engine") as info:
            engine_refusal(_chat(**body), refuses, "transformers")
        assert (info.value.param, info.value.code) == (param, "unsupported_by_engine")


def test_sampling_defaults_are_read_from_generation_config(tmp_path):
    import shutil

    from hwrun.serve.state import generation_defaults

    folder = tmp_path / "m"
    shutil.copytree(hwrun.DEFAULT_MODEL, folder)
    plan = types.SimpleNamespace(model=str(folder))
    defaults, why = generation_defaults(plan)
    assert defaults == {} and "sets none of temperature" in why  # the tiny model's: do_sample, max_new_tokens only
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_new_tokens": 40}))
    defaults, why = generation_defaults(plan)
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    assert why.startswith("temperature=0.6, top_p=0.95, top_k=20, min_p=0.0 from the model's generation_config.json")
    (folder / "generation_config.json").unlink()
    assert generation_defaults(plan) == ({}, "OpenAI's (the model has no generation_config.json)")


@pytest.mark.parametrize("text", ['{"name": "f", "arguments": {"a": [1, {"b": "}\\\\\\""}], "c": null}}',
                                  '{ }', '{"a": 1, "b": true}', '{"a" 1}', '{"a": "x"  x}', '{"s": "a\\"}"}'])
def test_the_incremental_scanners_agree_with_a_full_scan_at_every_length(text):
    from hwrun.serve.tools.jsonscan import ObjectScanner, ValueScanner, scan_object, value_end

    scanner, values = ObjectScanner(0), ValueScanner(0)
    for size in range(1, len(text) + 1):
        prefix = text[:size]
        incremental, full = scanner.advance(prefix), scan_object(prefix, 0)
        assert incremental.end == full.end and incremental.bad == full.bad, size
        if not full.bad:
            assert incremental.members == full.members, size
        assert values.advance(prefix) == value_end(prefix, 0), size


def test_responses_stream_events_carry_text_logprobs_and_a_call_in_order(tokenizer):
    from hwrun.serve.request import Run
    from hwrun.serve.responses import parse_responses, responses_stream

    parsed, meta = parse_responses({"model": MODEL_ID, "input": "hi", "top_logprobs": 1, "tools": [
        {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
        "include": ["message.output_text.logprobs"]}, SERVED)
    run = Run(_state(tokenizer), "responses", parsed, 4, 0.0)
    ids = _ids(tokenizer, 'ok<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    lps = tuple(TokenLogprob(-1.0, ((i, -1.0),)) for i in ids)

    async def go():
        loop = asyncio.get_running_loop()
        loop.call_soon(run.deliver, EngineEvent(run.rid, tuple(ids[:2]), logprobs=lps[:2]))
        loop.call_soon(run.deliver, EngineEvent(run.rid, tuple(ids[2:]), True, "stop", logprobs=lps[2:]))
        return [chunk async for chunk in responses_stream(run, meta)]

    events = []
    for chunk in asyncio.run(go()):
        name, data = chunk.decode().split("\n", 1)
        event = json.loads(data[len("data: "):])
        assert name == f"event: {event['type']}"
        events.append(event)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.completed" and [e["sequence_number"] for e in events] == list(range(len(events)))
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert text_done["text"] == "ok" and text_done["logprobs"][0]["logprob"] == -1.0
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Rome"} and done["name"] == "get_weather"
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[1]["call_id"].startswith("call_") and output[1]["status"] == "completed"
    assert events[-1]["response"]["usage"]["output_tokens"] == len(ids)
