"""The OpenAI surface of `hwrun serve` end to end (issue 36): a server on a free loopback port over a copy of the
shipped tiny model given a Qwen2/Hermes-style chat template that renders tools, talked to with the official
`openai` client (stream and non-stream), the `openai-agents` SDK and LangChain. The tiny model is random, so tool
calls come from constrained choices (`required`, a named function), whose arguments must parse against the schema;
every loop is bounded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import hwrun
import openai
import pytest
from hwrun.serve.config import ServeConfig
from hwrun.serve.server import ServerThread

MODEL_ID = "hwrun/tiny-llama-tools"
#: A chat template in Qwen2/Hermes' style: it renders `tools`, and calls as <tool_call> JSON.
HERMES_TEMPLATE = (
    "{{ bos_token }}{% if tools %}system: tools: {% for t in tools %}{{ t.function.name }}{{ t.function.parameters "
    "| tojson }} {% endfor %}answer <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}assistant: {{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}\n{% elif m.role == 'tool' %}tool: {{ m.content }}\n{% else %}{{ m.role }}: "
    "{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
ADAPTER = "tiny-lora"
#: The tool template plus a kwarg the tests set through `chat_template_kwargs`.
TEMPLATE = HERMES_TEMPLATE.replace("{% if add_generation_prompt %}", "{% if terse is defined and terse %}/terse\n"
                                   "{% endif %}{% if add_generation_prompt %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "the time",
    "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
                   "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: Small enough that the random model's constrained JSON always fits, large enough for two calls.
BUDGET = 120


def _valid_arguments(name: str, arguments: str) -> dict:
    """The call's arguments, checked against its function's schema (enum and types)."""
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city"} and args["city"] in ("Paris", "Rome"), args
    else:
        assert name == "get_time" and set(args) == {"utc"} and isinstance(args["utc"], bool), args
    return args


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "tiny-llama-tools"
    shutil.copytree(hwrun.DEFAULT_MODEL, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def adapter(tools_model, tmp_path_factory) -> Path:
    """A LoRA adapter of the tiny model whose B matrices are not zero (it changes the answers)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tools_model)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    folder = tmp_path_factory.mktemp("adapter") / "tiny-lora"
    peft_model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(tools_model):
    plan = hwrun.plan(str(tools_model))
    config = ServeConfig(port=0, max_concurrency=4, max_queue=8, grace_seconds=5, model_id=MODEL_ID, engine="slots")
    lines: list[str] = []
    srv = ServerThread(config, plan, say=lines.append).start(timeout=240)
    srv.lines = lines
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _stream_calls(stream) -> tuple[str, dict[int, dict], dict[int, str]]:
    """(content, {index: {"id", "name", "arguments"}}, {choice: finish_reason}) assembled from a chat stream."""
    content, calls, finish = "", {}, {}
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                if piece.id is not None:
                    assert piece.index not in calls and piece.function.name
                    calls[piece.index] = {"id": piece.id, "name": piece.function.name, "arguments": ""}
                calls[piece.index]["arguments"] += piece.function.arguments or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return content, calls, finish


# --------------------------------------------------------------------------------------------- start-up


def test_startup_says_how_tools_are_read_and_where_sampling_defaults_come_from(server):
    log = "\n".join(server.lines)
    assert "tools: tool calls read as hermes (<tool_call> in the chat template)" in log
    assert "sampling defaults: OpenAI's (generation_config.json sets none of temperature" in log


def test_lora_adapters_are_listed_with_their_parent_and_picked_by_model(tools_model, adapter):
    config = ServeConfig(port=0, max_concurrency=2, max_queue=2, grace_seconds=2, model_id=MODEL_ID, engine="slots",
                         adapters=((ADAPTER, str(adapter)),))
    lines: list[str] = []
    srv = ServerThread(config, hwrun.plan(str(tools_model)), say=lines.append).start(timeout=240)
    try:
        assert any(line.startswith(f"adapter: {ADAPTER} (LoRA from") for line in lines)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {MODEL_ID, ADAPTER} and cards[ADAPTER].parent == MODEL_ID
        assert cards[ADAPTER].root == str(adapter) and client.models.retrieve(ADAPTER).parent == MODEL_ID
        base = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=12, temperature=0)
        tuned = client.completions.create(model=ADAPTER, prompt="The king said", max_tokens=12, temperature=0)
        assert tuned.model == ADAPTER and base.model == MODEL_ID
        assert tuned.choices[0].text != base.choices[0].text  # the adapter's B matrices are random, not zero
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------- tools


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_gives_one_call_whose_arguments_fit_the_schema(client, stream):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    response = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                              max_tokens=BUDGET, temperature=0.8, seed=1, stream=stream)
    if stream:
        content, calls, finish = _stream_calls(response)
        assert content == "" and list(calls) == [0] and finish == {0: "tool_calls"}
        call = calls[0]
    else:
        message = response.choices[0].message
        assert response.choices[0].finish_reason == "tool_calls" and message.content is None
        assert len(message.tool_calls) == 1
        call = {"id": message.tool_calls[0].id, "name": message.tool_calls[0].function.name,
                "arguments": message.tool_calls[0].function.arguments}
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    _valid_arguments(call["name"], call["arguments"])


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_gives_calls_of_the_given_tools(client, stream):
    response = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice="required", parallel_tool_calls=False, max_tokens=BUDGET,
                                              temperature=1.0, seed=7, stream=stream)
    if stream:
        _, calls, finish = _stream_calls(response)
        assert finish == {0: "tool_calls"}
        calls = list(calls.values())
    else:
        assert response.choices[0].finish_reason == "tool_calls"
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in response.choices[0].message.tool_calls]
    assert len(calls) == 1  # parallel_tool_calls=false: at most one
    _valid_arguments(calls[0]["name"], calls[0]["arguments"])


def test_a_second_turn_with_tool_calls_and_tool_results_is_taken(client):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    response = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=[WEATHER], max_tokens=8,
                                              temperature=0)
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert response.usage.prompt_tokens > 0
    none = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=[WEATHER], tool_choice="none",
                                          max_tokens=8, temperature=0)
    assert none.choices[0].message.tool_calls is None


def test_chat_template_kwargs_reach_the_template(client):
    plain = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=1, temperature=0)
    terse = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=1, temperature=0,
                                           extra_body={"chat_template_kwargs": {"terse": True}})
    assert terse.usage.prompt_tokens > plain.usage.prompt_tokens


# ---------------------------------------------------------------------------------------- structured output


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_and_json_object_give_json(client, stream):
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                               "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    for fmt in ({"type": "json_schema", "json_schema": {"name": "Weather", "schema": schema, "strict": True}},
                {"type": "json_object"}):
        response = client.chat.completions.create(model=MODEL_ID, messages=ASK, response_format=fmt, seed=3,
                                                  max_tokens=BUDGET, temperature=0.7, stream=stream)
        if stream:
            chunks = list(response)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        else:
            text, finish = response.choices[0].message.content, response.choices[0].finish_reason
        if fmt["type"] == "json_schema":  # bounded by the schema: it always ends within the budget
            value = json.loads(text)
            assert finish == "stop" and value["city"] in ("Paris", "Rome") and isinstance(value["sunny"], bool)
            assert len(value) == 2
        else:  # any object: a random model may write a string past the budget; JSON all the same
            assert text.startswith("{") and (finish == "length" or isinstance(json.loads(text), dict))


def test_a_malformed_schema_is_a_400_before_any_work(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}})
    assert info.value.code == "invalid_schema" and "objekt" in info.value.message


# ------------------------------------------------------------------------------------------ sampling surface


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_and_usage_counting_them_all(client, stream):
    response = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=6, n=3, temperature=1.0,
                                         seed=5, stream=stream,
                                         **({"stream_options": {"include_usage": True}} if stream else {}))
    if stream:
        texts, finish, usage = {}, {}, None
        for chunk in response:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
                if choice.finish_reason:
                    finish[choice.index] = choice.finish_reason
        assert set(texts) == set(finish) == {0, 1, 2}
    else:
        assert [c.index for c in response.choices] == [0, 1, 2]
        usage = response.usage
    assert usage.completion_tokens <= 18 and usage.prompt_tokens > 0


def test_logprobs_in_chat_and_completions_shapes(client):
    chat = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
    for token in content:  # greedy: the chosen token is the most likely one
        assert token.logprob <= 0 and abs(token.top_logprobs[0].logprob - token.logprob) < 1e-4
    assert "".join(t.token for t in content).strip() and bytes(content[0].bytes) == content[0].token.encode()
    done = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=4, temperature=0, logprobs=2)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == done.usage.completion_tokens
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    streamed = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4, temperature=0,
                                              logprobs=True, stream=True)
    tokens = [t.token for c in streamed for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert tokens == [t.token for t in content]


def test_logit_bias_and_stop_token_ids_reach_the_sampler(client, server):
    tokenizer = server.state.tokenizer
    king = tokenizer(" king", add_special_tokens=False)["input_ids"][0]
    forced = client.completions.create(model=MODEL_ID, prompt="The", max_tokens=5, temperature=0,
                                       logit_bias={str(king): 100})
    assert forced.choices[0].text == " king" * 5
    stopped = client.completions.create(model=MODEL_ID, prompt="The", max_tokens=5, temperature=0,
                                        logit_bias={str(king): 100}, extra_body={"stop_token_ids": [king]})
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"


def test_penalties_min_p_and_repetition_penalty_are_taken(client):
    response = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=8, temperature=0.8, seed=2,
                                         presence_penalty=1.0, frequency_penalty=0.5,
                                         extra_body={"min_p": 0.05, "repetition_penalty": 1.3, "top_k": 40})
    assert response.choices[0].finish_reason in ("stop", "length") and response.usage.completion_tokens <= 8


def test_unknown_extension_fields_are_400s_naming_them(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, extra_body={"guided_regex": "a+"})
    assert info.value.param == "guided_regex" and info.value.code == "unknown_parameter"


def test_echo_prepends_the_prompt(client):
    plain = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=4, temperature=0)
    echoed = client.completions.create(model=MODEL_ID, prompt="The king said", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "The king said" + plain.choices[0].text


# ------------------------------------------------------------------------------------------ Responses API


def test_responses_api_whole_and_streamed_agree(client):
    whole = client.responses.create(model=MODEL_ID, input="The king said", instructions="Answer.",
                                    max_output_tokens=8, temperature=0)
    assert whole.status in ("completed", "incomplete") and whole.output[0].type == "message"
    assert whole.usage.output_tokens <= 8 and whole.usage.input_tokens > 0 and whole.output_text
    events = list(client.responses.create(model=MODEL_ID, input="The king said", instructions="Answer.",
                                          max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_responses_api_function_tools_give_function_call_items(client, stream):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"],
            "strict": True}
    response = client.responses.create(model=MODEL_ID, input=[{"role": "user", "content": "Weather in Rome?"}],
                                       tools=[tool], tool_choice={"type": "function", "name": "get_weather"},
                                       max_output_tokens=BUDGET, temperature=0.9, stream=stream)
    if stream:
        events = list(response)
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert deltas == done.arguments
        response = events[-1].response
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    _valid_arguments("get_weather", calls[0].arguments)
    follow = client.responses.create(model=MODEL_ID, max_output_tokens=6, temperature=0, input=[
        {"role": "user", "content": "Weather in Rome?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "rain"}], tools=[tool])
    assert follow.status in ("completed", "incomplete")


def test_responses_api_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"],
              "additionalProperties": False}
    response = client.responses.create(model=MODEL_ID, input="Is it sunny?", max_output_tokens=BUDGET,
                                       text={"format": {"type": "json_schema", "name": "S", "schema": schema,
                                                        "strict": True}})
    assert isinstance(json.loads(response.output_text)["sunny"], bool)


# ----------------------------------------------------------------------------------------------- real clients


def test_an_openai_agents_two_tool_loop_runs_to_completion(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather of a city."""
        called.append(f"weather:{city}")
        return "sunny"

    @function_tool
    def get_time(utc: bool) -> str:
        """The time now."""
        called.append(f"time:{utc}")
        return "noon"

    model = OpenAIChatCompletionsModel(model=MODEL_ID, openai_client=AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120))
    agent = Agent(name="weather", instructions="Use the tools.", tools=[get_weather, get_time], model=model,
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=BUDGET,
                                               temperature=0.7))
    result = Runner.run_sync(agent, "Weather in Paris, and the time?", max_turns=4)
    assert called and all(c in ("weather:Paris", "weather:Rome", "time:True", "time:False") for c in called)
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert isinstance(result.final_output, str)  # the turn after the tools (tool_choice reset to auto) ended it


def test_langchain_bind_tools_and_structured_output(server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: Literal["Paris", "Rome"]
        sunny: bool

    llm = ChatOpenAI(model=MODEL_ID, base_url=server.url + "/v1", api_key="unused", temperature=0.7,
                     max_tokens=BUDGET, max_retries=0, timeout=120)
    message = llm.bind_tools([WEATHER, TIME], tool_choice="get_time").invoke("What time is it?")
    assert len(message.tool_calls) == 1 and message.tool_calls[0]["name"] == "get_time"
    assert isinstance(message.tool_calls[0]["args"]["utc"], bool)
    message = llm.bind_tools([WEATHER, TIME], tool_choice="any").invoke("Weather?")  # "any": required
    assert message.tool_calls and message.tool_calls[0]["name"] in ("get_weather", "get_time")
    weather = llm.with_structured_output(Weather, method="json_schema").invoke("Weather in Rome?")
    assert isinstance(weather, Weather) and weather.city in ("Paris", "Rome")
