"""hwrun serve's parts without a server: settings, OpenAI bodies, streamed text, metrics, the engine's
scheduling over a scripted backend, the slot backend over the decoder's step API, the engine choice,
and `hwrun serve` / `hwrun chat` option checks (one line, exit 2, before the model loads)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import hwrun
import pytest
from hwrun.errors import EngineStartError, RequestError, ServeConfigError
from hwrun.serve import protocol
from hwrun.serve.config import ServeConfig, check_config, context_limit, read_api_key
from hwrun.serve.engine import Engine, EngineEvent, EngineNotReady, EngineRequest, QueueFullError
from hwrun.serve.metrics import Histogram, Metrics
from hwrun.serve.text import Detokenizer, StopMatcher, TextStream

MODEL_ID = "hwrun/tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)


# ------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("field, value, words", [
    ("port", 70000, "outside 0-65535"), ("port", -1, "outside 0-65535"), ("max_concurrency", 0, ">= 1"),
    ("max_queue", -2, ">= 0"), ("grace_seconds", -1.0, "between 0 and 3600"), ("engine", "vllm", "not one of"),
    ("max_model_len", 1, ">= 2"), ("host", "", "not a host"),
])
def test_check_config_refuses_each_bad_value_naming_it(field, value, words):
    with pytest.raises(ServeConfigError, match=words) as info:
        check_config(ServeConfig(**{field: value}))
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_config_defaults_bind_loopback_only():
    config = check_config(ServeConfig())
    assert config.host == "127.0.0.1" and config.loopback and config.api_key is None
    assert not ServeConfig(host="0.0.0.0").loopback and ServeConfig(host="::1").loopback


def test_api_key_comes_from_the_named_variable_and_never_starts_open():
    assert read_api_key(None, {}) is None
    assert read_api_key("MY_KEY", {"MY_KEY": "s3cret"}) == "s3cret"
    with pytest.raises(ServeConfigError, match="MY_KEY: the variable is unset"):
        read_api_key("MY_KEY", {})
    with pytest.raises(ServeConfigError, match="is empty"):
        read_api_key("MY_KEY", {"MY_KEY": ""})
    with pytest.raises(ServeConfigError, match="not an environment variable name") as info:
        read_api_key("sk-live-123", {})  # a key pasted where the variable's name belongs
    assert "sk-live-123" not in str(info.value)  # the pasted key is not echoed to the terminal or logs


def test_torch_threads_leave_the_server_a_core_and_yield_to_the_user():
    from hwrun.serve.config import torch_threads_for

    assert torch_threads_for(False, 2, {})[0] == 1 and torch_threads_for(False, 16, {})[0] == 15
    assert torch_threads_for(False, 1, {})[0] == 1
    assert torch_threads_for(True, 64, {}) == (1, "accelerator: one torch thread prepares each step on the host "
                                                  "(as transformers serve does)")
    assert torch_threads_for(False, 16, {"OMP_NUM_THREADS": "4"})[0] is None  # the user's setting wins
    assert torch_threads_for(False, 16, {"OMP_NUM_THREADS": "4"}, given=3) == (3, "given (--torch-threads)")
    with pytest.raises(ServeConfigError, match="--torch-threads 0 must be an integer >= 1"):
        check_config(ServeConfig(torch_threads=0))


def test_context_limit_caps_long_models_and_refuses_more_than_the_model_has():
    assert context_limit(None, 512) == (512, "the model's context (max_position_embeddings)")
    assert context_limit(None, 131072)[0] == 4096
    assert context_limit(256, 512)[0] == 256
    with pytest.raises(ServeConfigError, match="exceeds the model's context of 512"):
        context_limit(1024, 512)


# --------------------------------------------------------------------------------------------- protocol


def _completion(**body):
    return protocol.parse_request({"model": MODEL_ID, "prompt": "hi", **body}, "completion", MODEL_ID)


def test_parse_completion_defaults_follow_openai():
    parsed = _completion()
    assert parsed.max_tokens == protocol.DEFAULT_COMPLETION_TOKENS and parsed.sampling.temperature == 1.0
    assert not parsed.stream and parsed.stop == ()
    chat = protocol.parse_request({"model": MODEL_ID, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 5,
        "stop": "x", "stream": True, "stream_options": {"include_usage": True}}, "chat", MODEL_ID)
    assert chat.messages == ({"role": "user", "content": "ab"},) and chat.max_tokens == 5
    assert chat.stop == ("x",) and chat.stream and chat.include_usage and chat.max_tokens == 5


@pytest.mark.parametrize("body, param, code", [
    ({"model": "other"}, "model", "model_not_found"),
    ({"model": 3}, "model", "invalid_type"),
    ({"prompt": 5}, "prompt", "invalid_type"),
    ({"prompt": ["a", "b"]}, "prompt", "invalid_type"),
    ({"prompt": ""}, "prompt", "invalid_value"),
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"max_tokens": -3}, "max_tokens", "invalid_value"),
    ({"max_tokens": "10"}, "max_tokens", "invalid_value"),
    ({"max_tokens": True}, "max_tokens", "invalid_value"),
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"top_p": 0}, "top_p", "invalid_value"),
    ({"top_k": -2}, "top_k", "invalid_value"),
    ({"top_k": 1.5}, "top_k", "invalid_type"),
    ({"top_k": 2**31}, "top_k", "invalid_value"),
    ({"top_k": 10**30}, "top_k", "invalid_value"),
    ({"seed": "x"}, "seed", "invalid_value"),
    ({"stop": 5}, "stop", "invalid_value"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"n": 17}, "n", "invalid_value"),
    ({"logprobs": 6}, "logprobs", "invalid_value"),
    ({"presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
])
def test_every_bad_field_is_a_400_naming_the_field(body, param, code):
    with pytest.raises(RequestError) as info:
        _completion(**body)
    error = info.value
    assert (error.status, error.param, error.code, error.type) == (400, param, code, "invalid_request_error")


def test_extreme_sampling_values_are_greedy_or_refused_never_passed_on():
    for tiny in (1e-40, 1e-300, 5e-324, 9.9e-6):
        assert _completion(temperature=tiny).sampling.temperature == 0.0  # greedy, as vLLM does
        assert _completion(temperature=tiny).sampling.greedy
    assert _completion(temperature=protocol.MIN_TEMPERATURE).sampling.temperature == protocol.MIN_TEMPERATURE
    assert _completion(top_k=protocol.MAX_TOP_K).sampling.top_k == 2**31 - 1
    assert _completion(top_p=1e-300).sampling.top_p == 1e-300  # the filters keep at least one token


def test_no_op_values_of_unsupported_fields_pass():
    parsed = _completion(n=1, logprobs=None, echo=False, presence_penalty=0, frequency_penalty=0.0, best_of=1)
    assert parsed.prompt == "hi"


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "robot", "content": "x"}], [{"role": "user"}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}], ["hi"]])
def test_bad_messages_are_400(messages):
    with pytest.raises(RequestError) as info:
        protocol.parse_request({"model": MODEL_ID, "messages": messages}, "chat", MODEL_ID)
    assert info.value.status == 400 and info.value.param.startswith("messages")


def test_parse_json_refuses_bad_json_and_non_objects():
    with pytest.raises(RequestError, match="not valid JSON") as info:
        protocol.parse_json(b"{nope")
    assert info.value.code == "invalid_json"
    with pytest.raises(RequestError, match="not an object"):
        protocol.parse_json(b"[1, 2]")


def test_sse_and_chunk_shapes():
    assert protocol.sse("[DONE]") == b"data: [DONE]\n\n"
    chunk = protocol.chunk_body("chat", "id", MODEL_ID, 1, text="é")
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"] == {"content": "é"}
    assert protocol.sse(chunk).decode().startswith('data: {"id":"id"') and "é" in protocol.sse(chunk).decode()
    body = protocol.response_body("completion", "id", MODEL_ID, "t", "stop", 3, 4, 1)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


# ------------------------------------------------------------------------------------------------- text


def test_detokenizer_pieces_join_to_the_full_decode_even_across_split_characters(tokenizer):
    text = "The king said, é 中文 😀 and the Lord spake: 'amen'."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    detok = Detokenizer(tokenizer)
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces), "a piece ended inside a multi-byte character"
    assert sum(1 for p in pieces if p) > 5  # it streams, not one lump at the end


def test_stop_strings_are_cut_and_never_sent_even_split_across_tokens():
    matcher = StopMatcher(["END", "\n\n"])
    sent = [matcher.push(t) for t in ["abc E", "N", "xyz", " E", "ND tail"]]
    assert sent == ["abc ", "", "ENxyz", " ", ""] and matcher.stopped  # "E", "EN" held until they could not stop
    assert matcher.push("more") == "" and matcher.flush() == ""
    plain = StopMatcher(["END"])
    assert plain.push("the E") == "the " and plain.flush() == "E" and not plain.stopped


def test_text_stream_with_a_stop_string(tokenizer):
    ids = tokenizer("one two three four", add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, ["three"])
    out = "".join(stream.push([i]) for i in ids) + stream.finish()
    assert out == "one two " and stream.stopped


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics_render_prometheus_text():
    metrics = Metrics(queue_depth=lambda: 3, running=lambda: 2)
    metrics.count_request("completions", "ok")
    metrics.count_request("completions", "ok")
    metrics.ttft.observe(0.03)
    metrics.itl.observe(0.002, 4)
    text = metrics.render()
    assert 'hwrun_requests_total{endpoint="completions",outcome="ok"} 2' in text
    assert "hwrun_queue_depth 3" in text and "hwrun_running_requests 2" in text
    assert 'hwrun_time_to_first_token_seconds_bucket{le="0.025"} 0' in text
    assert 'hwrun_time_to_first_token_seconds_bucket{le="0.05"} 1' in text
    assert 'hwrun_inter_token_latency_seconds_bucket{le="+Inf"} 4' in text
    assert "hwrun_inter_token_latency_seconds_count 4" in text
    for line in text.splitlines():  # every sample line is `name{labels} value`
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2 and float(line.rsplit(" ", 1)[1]) >= 0


def test_metrics_escape_label_values_and_map_paths_to_a_fixed_set():
    from hwrun.serve.app import ENDPOINT_LABELS, endpoint_label

    metrics = Metrics()
    metrics.count_request('x",evil="y\nfake_metric 1\\', "ok")
    text = metrics.render()
    assert 'hwrun_requests_total{endpoint="x\\",evil=\\"y\\nfake_metric 1\\\\",outcome="ok"} 1' in text
    assert not any(line.startswith("fake_metric") for line in text.splitlines())
    assert endpoint_label('/v1/x0",evil="y\nfake_metric 1') == "other"
    assert endpoint_label("/v1/models/some/model") == "models" and endpoint_label("/metrics") == "metrics"
    assert {endpoint_label(path) for path in ENDPOINT_LABELS} | {endpoint_label("/nope")} == {
        "completions", "chat_completions", "responses", "models", "health", "metrics", "other"}


def test_histogram_buckets_are_cumulative():
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.5, 0.5, 5.0):
        hist.observe(value)
    assert hist.lines("h")[:3] == ['h_bucket{le="0.1"} 1', 'h_bucket{le="1.0"} 3', 'h_bucket{le="+Inf"} 4']


# ----------------------------------------------------------------------------------------------- engine


class ScriptedBackend:
    """A backend whose request i yields tokens 100+i, 101+i, ... one per step, `slots` at a time."""

    name = "scripted"

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.active: dict[str, list] = {}
        self.added: list[str] = []
        self.cancelled: list[str] = []
        self.max_active = 0
        self.closed = False

    def free_slots(self) -> int:
        return self.slots - len(self.active)

    def add(self, request: EngineRequest) -> None:
        assert len(self.active) < self.slots, "the engine admitted past the free slots"
        self.active[request.request_id] = [0, request.max_new_tokens]
        self.added.append(request.request_id)
        self.max_active = max(self.max_active, len(self.active))

    def cancel(self, request_id: str) -> None:
        self.active.pop(request_id)
        self.cancelled.append(request_id)

    def step(self) -> list[EngineEvent]:
        time.sleep(0.002)
        events = []
        for request_id, state in list(self.active.items()):
            state[0] += 1
            done = state[0] >= state[1]
            if done:
                del self.active[request_id]
            events.append(EngineEvent(request_id, (100 + state[0],), done, "length" if done else None))
        return events

    def close(self) -> None:
        self.closed = True


def _run_engine(engine: Engine, work) -> None:
    async def main():
        engine.start(asyncio.get_running_loop())
        for _ in range(500):
            if engine.state in ("ready", "failed"):
                break
            await asyncio.sleep(0.01)
        await work()
        await asyncio.to_thread(engine.stop)

    asyncio.run(asyncio.wait_for(main(), 30))


def _collector():
    events: dict[str, list[EngineEvent]] = {}
    done: dict[str, asyncio.Event] = {}

    def sink_for(request_id):
        events[request_id], done[request_id] = [], asyncio.Event()

        def sink(event):
            events[request_id].append(event)
            if event.finished:
                done[request_id].set()
        return sink
    return events, done, sink_for


def test_engine_admits_between_steps_up_to_the_free_slots_and_queues_the_rest():
    backend = ScriptedBackend(slots=2)
    engine = Engine(lambda: backend, max_concurrency=2, max_queue=3)
    events, done, sink_for = _collector()

    async def work():
        for i in range(5):
            engine.submit(EngineRequest(f"r{i}", (1,), 3 + i), sink_for(f"r{i}"))
        with pytest.raises(QueueFullError):
            engine.submit(EngineRequest("r5", (1,), 3), sink_for("r5"))
        await asyncio.gather(*(done[f"r{i}"].wait() for i in range(5)))

    _run_engine(engine, work)
    assert backend.max_active == 2 and backend.added == [f"r{i}" for i in range(5)]
    for i in range(5):
        tokens = [t for e in events[f"r{i}"] for t in e.token_ids]
        assert tokens == list(range(101, 101 + 3 + i)) and events[f"r{i}"][-1].finish_reason == "length"
    assert backend.closed and engine.state == "stopped"


def test_engine_cancel_frees_the_slot_for_the_next_request_and_drain_refuses_new_ones():
    backend = ScriptedBackend(slots=1)
    engine = Engine(lambda: backend, max_concurrency=1, max_queue=1)
    events, done, sink_for = _collector()

    async def work():
        engine.submit(EngineRequest("long", (1,), 10_000), sink_for("long"))
        engine.submit(EngineRequest("next", (1,), 3), sink_for("next"))  # waits: the one slot is taken
        while not events["long"]:
            await asyncio.sleep(0.005)
        engine.cancel("long")
        await asyncio.wait_for(done["next"].wait(), 10)
        engine.drain()
        with pytest.raises(EngineNotReady):
            engine.submit(EngineRequest("late", (1,), 3), sink_for("late"))

    _run_engine(engine, work)
    assert backend.cancelled == ["long"] and events["long"][-1].finish_reason == "cancelled"
    assert len(events["long"]) < 1000  # stopped long before its budget
    assert [t for e in events["next"] for t in e.token_ids] == [101, 102, 103]


def test_serve_state_before_the_load_raises_engine_not_ready_not_an_assertion():
    from hwrun.serve.state import ServeState

    state = ServeState(ServeConfig(port=0), hwrun.plan(), say=lambda line: None)
    for name in ("tokenizer", "max_model_len"):
        with pytest.raises(EngineNotReady, match="not loaded yet"):
            getattr(state, name)


def test_engine_that_cannot_start_fails_and_refuses_requests():
    def broken():
        raise RuntimeError("no model here")

    engine = Engine(broken, max_concurrency=1, max_queue=1)

    async def work():
        for _ in range(100):
            if engine.state == "failed":
                break
            await asyncio.sleep(0.01)

    _run_engine(engine, work)
    assert engine.state == "failed" and "no model here" in str(engine.error) and not engine.was_ready
    with pytest.raises(EngineNotReady):
        engine.submit(EngineRequest("x", (1,), 1), lambda e: None)


class FailingStepBackend(ScriptedBackend):
    """A scripted backend whose `step()` raises while `failing` is set."""

    failing = True

    def step(self) -> list[EngineEvent]:
        if self.failing:
            time.sleep(0.01)
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return super().step()


def test_engine_failure_is_reported_to_every_waiting_request():
    backend = FailingStepBackend(slots=2)
    engine = Engine(lambda: backend, max_concurrency=2, max_queue=2)
    events, done, sink_for = _collector()

    async def work():
        engine.submit(EngineRequest("a", (1,), 5), sink_for("a"))
        engine.submit(EngineRequest("b", (1,), 5), sink_for("b"))
        await asyncio.wait_for(asyncio.gather(done["a"].wait(), done["b"].wait()), 10)
        assert engine.state == "ready"  # one failed step fails its requests, not the engine
        backend.failing = False
        engine.submit(EngineRequest("c", (1,), 2), sink_for("c"))
        await asyncio.wait_for(done["c"].wait(), 10)

    _run_engine(engine, work)
    for request_id in ("a", "b"):
        assert events[request_id][-1].finished and events[request_id][-1].finish_reason == "error"
        assert "inf, nan" in events[request_id][-1].error
    assert sorted(backend.cancelled) == ["a", "b"]  # their slots were freed
    assert [t for e in events["c"] for t in e.token_ids] == [101, 102]


def test_a_backend_that_fails_every_step_fails_the_engine_at_runtime():
    from hwrun.serve.engine import MAX_STEP_FAILURES

    backend = FailingStepBackend(slots=1)
    engine = Engine(lambda: backend, max_concurrency=1, max_queue=MAX_STEP_FAILURES)
    events, done, sink_for = _collector()

    async def work():
        for i in range(MAX_STEP_FAILURES):
            engine.submit(EngineRequest(f"r{i}", (1,), 5), sink_for(f"r{i}"))
        await asyncio.wait_for(asyncio.gather(*(done[f"r{i}"].wait() for i in range(MAX_STEP_FAILURES))), 10)

    _run_engine(engine, work)
    assert engine.state == "failed" and engine.was_ready  # a runtime failure, not a start failure
    assert all(events[f"r{i}"][-1].finish_reason == "error" for i in range(MAX_STEP_FAILURES))


class SilentBackend(ScriptedBackend):
    """Takes requests and steps, but never produces a token (a backend that lost them)."""

    def step(self) -> list[EngineEvent]:
        time.sleep(0.01)
        return []


def test_a_request_without_tokens_for_stall_seconds_fails_and_the_engine_goes_on():
    backend = SilentBackend(slots=1)
    engine = Engine(lambda: backend, max_concurrency=1, max_queue=1, stall_seconds=0.3)
    events, done, sink_for = _collector()

    async def work():
        started = time.monotonic()
        engine.submit(EngineRequest("lost", (1,), 5), sink_for("lost"))
        await asyncio.wait_for(done["lost"].wait(), 10)
        assert 0.3 <= time.monotonic() - started < 5
        assert engine.state == "ready" and not engine.stalled  # steps go on: the engine is healthy

    _run_engine(engine, work)
    assert events["lost"][-1].finish_reason == "error" and "stalled" in events["lost"][-1].error
    assert backend.cancelled == ["lost"]


class HangingBackend(ScriptedBackend):
    """A backend whose `step()` blocks until released (a hung device call)."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        import threading

        self.release = threading.Event()

    def step(self) -> list[EngineEvent]:
        self.release.wait(10)
        return super().step()


def test_engine_reports_stalled_when_a_step_hangs_while_requests_run():
    backend = HangingBackend(slots=1)
    engine = Engine(lambda: backend, max_concurrency=1, max_queue=1, stall_seconds=0.2)
    events, done, sink_for = _collector()

    async def work():
        assert not engine.stalled
        engine.submit(EngineRequest("r", (1,), 1), sink_for("r"))
        await asyncio.sleep(0.5)
        assert engine.stalled
        backend.release.set()
        await asyncio.wait_for(done["r"].wait(), 10)
        assert not engine.stalled

    _run_engine(engine, work)


# ------------------------------------------------------------------------------------- slots backend


class FakeStepDecoder:
    """The slot decoder's step API as its contract states it: one TokenEvent per active request per step."""

    def __init__(self, slots: int) -> None:
        from types import SimpleNamespace

        self.slots, self.requests, self.Event = slots, {}, SimpleNamespace
        self.started = False

    def start(self, processed=False):
        self.started = processed

    @property
    def free_slots(self):
        return self.slots - len(self.requests)

    @property
    def active(self):
        return set(self.requests)

    def add(self, request_id, input_ids, *, max_new_tokens, sampling=None, eos_token_id="model", n=1, matchers=None):
        self.requests[request_id] = [input_ids[-1], max_new_tokens, sampling]

    def cancel(self, request_id):
        del self.requests[request_id]

    def step(self):
        events = []
        for request_id, state in list(self.requests.items()):
            state[0] += 1
            state[1] -= 1
            eos = state[0] == 7
            reason = "stop" if eos else "length" if state[1] == 0 else None
            if reason:
                del self.requests[request_id]
            events.append(self.Event(request_id=request_id, token_id=state[0], finished=reason is not None,
                                     finish_reason=reason, index=0, logprob=None, top=(), error=None))
        return events


def test_slots_backend_drives_the_step_api_and_maps_finish_reasons():
    from hwrun.serve.backend_slots import SlotsBackend
    from hwrun.serve.protocol import Sampling

    decoder = FakeStepDecoder(slots=2)
    seen = []
    backend = SlotsBackend(decoder, sampling_class=lambda **kw: seen.append(kw) or kw)
    backend.start()
    backend.add(EngineRequest("a", (1, 2), 3, Sampling(temperature=0.5, top_p=0.9, top_k=4, seed=3)))
    backend.add(EngineRequest("b", (4,), 10))
    assert decoder.started and backend.free_slots() == 0
    assert seen[0] == {"temperature": 0.5, "top_p": 0.9, "top_k": 4, "seed": 3, "min_p": 0.0, "presence_penalty": 0.0,
                       "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": (), "logprobs": None}
    events = [backend.step() for _ in range(3)]
    flat = {(e.request_id, e.token_ids, e.finished, e.finish_reason) for step in events for e in step}
    assert ("a", (5,), True, "length") in flat and ("b", (7,), True, "stop") in flat
    assert backend.free_slots() == 2 and backend.step() == []
    backend.add(EngineRequest("c", (1,), 50))
    backend.cancel("c")
    assert backend.free_slots() == 2 and backend.step() == []


def _step_api_ready() -> bool:
    from hwrun.inference.engine import EngineCore
    from hwrun.serve.backend_slots import step_api_missing

    return not step_api_missing(EngineCore)


@pytest.mark.skipif(not _step_api_ready(), reason="hwrun's EngineCore has no step API yet (issue 28's engine work)")
def test_slots_backend_over_the_real_slot_decoder_equals_generate_greedy():
    from hwrun.inference.decode import SamplingParams
    from hwrun.inference.engine import EngineCore
    from hwrun.serve.backend_slots import SlotsBackend
    from hwrun.serve.protocol import Sampling

    plan = hwrun.plan()
    model, tok = hwrun.load(plan)
    prompts = ["The king said", "Once upon a time", "And the LORD"]
    budgets = [12, 5, 9]
    want = [hwrun.generate(plan, p, n, model=model, tokenizer=tok, batching="static").token_ids[0]
            for p, n in zip(prompts, budgets, strict=True)]
    backend = SlotsBackend(EngineCore(model, slots=2, max_cache_len=64, use_graphs=False),
                           sampling_class=SamplingParams)
    backend.start()
    engine = Engine(lambda: backend, max_concurrency=2, max_queue=4)
    events, done, sink_for = _collector()

    async def work():
        for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
            ids = tuple(tok(p)["input_ids"])
            engine.submit(EngineRequest(f"r{i}", ids, n, Sampling(temperature=0.0)), sink_for(f"r{i}"))
        await asyncio.gather(*(done[f"r{i}"].wait() for i in range(3)))

    _run_engine(engine, work)
    got = [[t for e in events[f"r{i}"] for t in e.token_ids] for i in range(3)]
    assert got == want


# ------------------------------------------------------------------------------------------ engine choice


def test_decide_engine_on_cpu_is_transformers_and_says_why():
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.startup import decide_engine

    plan = hwrun.plan()
    model, _ = hwrun.load(plan)
    choice = decide_engine(plan, ServeConfig(), model, 512)
    assert choice.engine == "transformers" and "no CUDA or XPU graphs" in choice.reason
    assert decide_engine(plan, ServeConfig(engine="transformers"), model, 512).reason.startswith("given")


def test_decide_serving_prefers_slots_where_graphs_exist_and_refuses_what_cannot_run():
    import hwenv
    from hwrun.inference.decision import decide_serving
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.startup import decide_engine
    from transformers import GPT2Config, GPT2LMHeadModel, StableLmConfig, StableLmForCausalLM

    plan = hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)))
    model, _ = hwrun.load(hwrun.plan())
    if _step_api_ready():
        choice = decide_serving(plan, model, "auto")
        assert choice.engine == "slots" and "CUDA graph" in choice.reason
    # any family: the slot decoder runs GPT-2 through the model's own forward (issue 26 point 3)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))
    choice = decide_serving(plan, gpt2, "auto")
    assert choice.engine == "slots" and "the model's own forward over a per-row slot cache" in choice.reason
    # a class that computes attention itself: neither the slot decoder nor Transformers' batching runs it
    stablelm = StableLmForCausalLM(StableLmConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                                  intermediate_size=64, vocab_size=64))
    with pytest.raises(EngineStartError, match="--engine slots cannot serve this model.*is_backend_compatible"):
        decide_serving(plan, stablelm, "slots")
    gaudi = hwrun.plan(device=hwenv.Accelerator("hpu", 1, memory=(96 * 2**30,)))
    # serve's start-up asks the same rule: on Gaudi hwrun's engine replays HPU graphs (Transformers' batching has no
    # Gaudi); the bridge records them in lazy mode (tests/test_hwrun_serve_gaudi_warmup.py)
    choice = decide_engine(gaudi, ServeConfig(), gpt2, 64)
    assert choice.engine == "slots" and "Gaudi: hwrun's engine, one HPU graph replay per step" in choice.reason
    assert choice.reason == decide_serving(gaudi, gpt2, "auto", max_cache_len=64).reason
    with pytest.raises(EngineStartError, match="no engine can serve this model on hpu"):
        decide_serving(gaudi, stablelm, "auto")


# ------------------------------------------------------------------------------------------------ CLIs


@pytest.mark.parametrize("argv, words", [
    (["--port", "70000"], "--port 70000 is outside 0-65535"),
    (["--port", "http"], "--port 'http' is not an integer"),
    (["--max-concurrency", "0"], "--max-concurrency 0 must be an integer >= 1"),
    (["--max-queue", "-1"], "--max-queue -1 must be an integer >= 0"),
    (["--grace-seconds", "-5"], "--grace-seconds -5.0 must be between 0 and 3600"),
    (["--api-key-env", "HWRUN_TEST_UNSET_KEY"], "--api-key-env HWRUN_TEST_UNSET_KEY: the variable is unset"),
    (["--max-model-len", "100000"], "--max-model-len 100000 exceeds the model's context of 512"),
])
def test_hwrun_serve_refuses_bad_options_in_one_line_before_loading(argv, words, capsys, monkeypatch):
    from hwrun.cli import main

    monkeypatch.delenv("HWRUN_TEST_UNSET_KEY", raising=False)
    monkeypatch.setattr("hwrun.model.load.load", lambda *a, **k: pytest.fail("the model loaded"))
    assert main.main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("hwrun: error: ") and words in err


def test_hwrun_chat_refuses_bad_options_in_one_line(capsys):
    from hwrun.cli import main

    assert main.main(["chat", "--max-tokens", "0"]) == 2
    assert "--max-tokens 0 must be a positive integer" in capsys.readouterr().err
    assert main.main(["chat", "--base-url", "http://127.0.0.1:1"]) == 2  # nothing listens on port 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hwrun: error: cannot reach http://127.0.0.1:1") and "\n" not in err


def test_cli_modules_import_no_torch_starlette_or_uvicorn():
    code = ("import sys, hwrun.cli.serve, hwrun.cli.chat, hwrun.serve, hwrun.cli.main as m; m.build_parser();"
            "print(sorted(k for k in ('torch', 'starlette', 'uvicorn', 'transformers') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_serve_parser_has_the_plan_options_and_safe_defaults():
    from hwrun.cli import main

    args = main.build_parser().parse_args(["serve", "--device", "cpu"])
    assert (args.host, args.port, args.api_key_env, args.device, args.engine) == ("127.0.0.1", "8000", None, "cpu",
                                                                                   "auto")


def test_decide_serving_refuses_quantized_plans_with_both_reasons():
    from hwrun.inference.decision import decide_serving

    model, _ = hwrun.load(hwrun.plan())
    quantized = hwrun.plan(quantization="8bit")
    with pytest.raises(EngineStartError) as info:
        decide_serving(quantized, model, "auto")
    message = str(info.value)
    assert "hwrun's engine: bitsandbytes weights (8bit: Linear4bit/Linear8bitLt layers)" in message
    assert "Transformers' continuous batching: 8bit bitsandbytes weights are not supported" in message


# ------------------------------------------------------------------------------ ignore_eos (fixed output lengths)


def test_ignore_eos_is_an_optional_bool_refused_otherwise():
    body = {"model": "m", "prompt": "hi"}
    assert protocol.parse_request(body, "completion", "m").ignore_eos is False
    assert protocol.parse_request({**body, "ignore_eos": True}, "completion", "m").ignore_eos
    with pytest.raises(RequestError) as info:
        protocol.parse_request({**body, "ignore_eos": "yes"}, "completion", "m")
    assert info.value.param == "ignore_eos"


def _decode_until_done(backend, requests) -> dict[str, tuple[list[int], str]]:
    """Run `requests` through `backend` step by step: each one's tokens and finish reason (bounded)."""
    for request in requests:
        backend.add(request)
    got: dict[str, list[int]] = {r.request_id: [] for r in requests}
    reasons: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while len(reasons) < len(requests) and time.monotonic() < deadline:
        for event in backend.step():
            got[event.request_id] += list(event.token_ids)
            if event.finished:
                reasons[event.request_id] = event.finish_reason
    assert len(reasons) == len(requests), f"unfinished after 60 s: {reasons}"
    return {rid: (tokens, reasons[rid]) for rid, tokens in got.items()}


def _first_greedy_token(model, tokenizer, prompt: str) -> int:
    result = hwrun.generate(hwrun.plan(), prompt, 1, model=model, tokenizer=tokenizer, batching="static")
    return result.token_ids[0][0]


@pytest.mark.parametrize("engine", ["slots", "transformers"])
def test_ignore_eos_decodes_the_whole_budget_on_both_engines(engine):
    """The model's EOS is made the prompt's first greedy token: without ignore_eos the request stops there
    ("stop", one token); with it, it decodes every token of its budget ("length")."""
    from hwrun.inference.decode import SamplingParams
    from hwrun.inference.engine import EngineCore
    from hwrun.serve.backend_slots import SlotsBackend
    from hwrun.serve.backend_transformers import TransformersBackend
    from hwrun.serve.protocol import Sampling

    plan = hwrun.plan()
    model, tokenizer = hwrun.load(plan)
    prompt = "The king said"
    eos = _first_greedy_token(model, tokenizer, prompt)
    ids = tuple(tokenizer(prompt)["input_ids"])
    if engine == "slots":
        backend = SlotsBackend(EngineCore(model, slots=2, max_cache_len=64, use_graphs=False),
                               sampling_class=SamplingParams, eos_token_id=[eos])
        backend.start()
    else:
        backend = TransformersBackend(model, kind=plan.accelerator.kind, eos_ids=[eos], max_concurrency=2,
                                      max_model_len=64, pad_token_id=tokenizer.pad_token_id)
    try:
        greedy = Sampling(temperature=0.0)
        out = _decode_until_done(backend, [EngineRequest("stops", ids, 9, greedy),
                                           EngineRequest("ignores", ids, 9, greedy, ignore_eos=True)])
    finally:
        backend.close()
    assert out["stops"] == ([eos], "stop")
    tokens, reason = out["ignores"]
    assert len(tokens) == 9 and tokens[0] == eos and reason == "length"


def test_served_buckets_are_fewer_when_each_one_compiles():
    """Every row bucket is compiled (greedy and sampled) at start-up under --compile: the server keeps 1, 8 and
    the slot count there, and the decoder's default powers of two otherwise."""
    from hwrun.inference.engine import (  # what serve/startup.py passes
        bucket_sizes,
        compiled_buckets,
    )

    assert compiled_buckets(64, compiled=False) is None
    assert bucket_sizes(64, compiled_buckets(64, compiled=False)) == (1, 2, 4, 8, 16, 32, 64)
    assert compiled_buckets(64, compiled=True) == (1, 8, 64)
    assert compiled_buckets(4, compiled=True) == (1, 4)
    assert compiled_buckets(1, compiled=True) == (1,)
    assert bucket_sizes(4, compiled_buckets(4, compiled=True)) == (1, 4)


# ------------------------------------------------------------------------------- per-token host work


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_text_chunk_encoder_sends_the_same_bytes_as_the_generic_chunk(kind):
    """The per-request template gives byte for byte what `sse(chunk_body(...))` gives, for any text and model id."""
    model = 'odd "model"\\ name é'
    encode = protocol.text_chunk_encoder(kind, "cmpl-x", model, 7)
    for text in ["", "a", ' "quoted" \\ back', "é 中文 😀", "\n\t\x00\u2028", "hwrun-text-\u2063", "}]}"]:
        assert encode(text) == protocol.sse(protocol.chunk_body(kind, "cmpl-x", model, 7, text=text)), text


class _FakeEngine:
    def __init__(self, stall_seconds: float = 60.0) -> None:
        self.stall_seconds = stall_seconds
        self.cancelled: list[str] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def _run_of(tokenizer, stall_seconds: float = 60.0, **body):
    from types import SimpleNamespace

    from hwrun.serve.request import Run

    state = SimpleNamespace(metrics=Metrics(), engine=_FakeEngine(stall_seconds), tokenizer=tokenizer,
                            config=SimpleNamespace(model_id=MODEL_ID))
    return Run(state, "completion", _completion(**body), 3, time.perf_counter())


def _stream_text(run, events, *, together: bool) -> list[str]:
    """The text pieces of `run` when `events` arrive all before it reads (`together`) or one per read."""
    async def main() -> list[str]:
        pieces, stream = [], run.pieces()
        if together:
            for event in events:
                run.deliver(event)
            return [piece async for piece in stream]
        async def produce() -> None:
            # one event, then turns of the event loop for the reader to take it: ordered by the loop, not by a
            # clock (1 ms timers fired together on a loaded host and the pieces coalesced)
            for event in events:
                run.deliver(event)
                for _ in range(10):
                    await asyncio.sleep(0)

        producer = asyncio.create_task(produce())
        async for piece in stream:
            pieces.append(piece)
        await producer
        return pieces

    return asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("stop", [None, ["three"]])
def test_events_that_arrive_together_go_out_as_one_piece_with_the_same_text_and_counts(tokenizer, stop):
    """A loaded server coalesces the tokens already delivered into one chunk: the text, the token count (usage),
    the finish reason and the metrics equal those of one chunk per token; only the number of pieces drops."""
    ids = tokenizer("one two three four five é 中文", add_special_tokens=False)["input_ids"]
    events = [EngineEvent("r", (i,)) for i in ids] + [EngineEvent("r", (), True, "length")]
    body = {"stop": stop} if stop else {}
    runs = {together: _run_of(tokenizer, **body) for together in (True, False)}
    pieces = {together: _stream_text(run, events, together=together) for together, run in runs.items()}
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    if stop:
        expected = expected[:expected.index("three")]
    for together, run in runs.items():
        assert "".join(pieces[together]) == expected
        assert run.finish_reason == ("stop" if stop else "length") and run.error is None and run.done
        assert run.state.metrics.generation_tokens == run.completion_tokens
        assert run.state.engine.cancelled == ([run.rid] if stop else [])  # a stop string cancels its request
    assert runs[True].completion_tokens == runs[False].completion_tokens
    assert len(pieces[True]) == 1 < len(pieces[False])
    assert runs[True].state.metrics.itl.count == runs[False].state.metrics.itl.count


def test_a_request_without_events_fails_after_twice_the_stall_seconds(tokenizer):
    """The wait for the next event is bounded (one timer per wait): a silent engine fails the request, which
    cancels it in the engine and reports a generic error."""
    run = _run_of(tokenizer, stall_seconds=0.05)
    start = time.monotonic()
    assert _stream_text(run, [], together=True) == []
    assert 0.09 < time.monotonic() - start < 5
    assert run.error is not None and run.outcome == "error" and run.state.engine.cancelled == [run.rid]


# ------------------------------------------------------------------ the engine core's IPC and the front's reader


MULTIBYTE = "The king said, é 中文 😀 and the Lord spake: 'amen'. ñandú — ü ß 𝔘 ok"


def _decoded_pieces(make, ids: list[int], chunks: int = 1) -> list[str]:
    detok = make()
    pieces = [detok.push(ids[i:i + chunks]) for i in range(0, len(ids), chunks)]
    return pieces + [detok.flush()]


@pytest.mark.parametrize("chunks", [1, 3])
def test_decode_stream_detokenizer_equals_the_full_decode_across_split_characters(tokenizer, chunks):
    """The front's detokenizer (tokenizers' DecodeStream for the shipped fast tokenizer): its pieces join to
    `tokenizer.decode` of the whole sequence, multi-byte UTF-8 split across tokens included, one token or three
    per push (a batch may carry several of a request's tokens)."""
    from hwrun.serve.text import StreamDetokenizer, detokenizer_factory

    make, why = detokenizer_factory(tokenizer)
    assert "DecodeStream" in why and isinstance(make(), StreamDetokenizer)
    ids = tokenizer(MULTIBYTE, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    pieces = _decoded_pieces(make, ids, chunks)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces) and sum(1 for p in pieces if p) > 5


def test_decode_stream_detokenizer_flushes_an_incomplete_last_character_as_decode_does(tokenizer):
    from hwrun.serve.text import detokenizer_factory

    make, _ = detokenizer_factory(tokenizer)
    ids = tokenizer("and then 😀", add_special_tokens=False)["input_ids"]
    for cut in range(1, len(ids) + 1):  # the answer may end inside the emoji's bytes (max_tokens)
        assert "".join(_decoded_pieces(make, ids[:cut])) == tokenizer.decode(ids[:cut], skip_special_tokens=True)


def test_slow_tokenizers_keep_the_window_detokenizer(tokenizer):
    from types import SimpleNamespace

    from hwrun.serve.text import detokenizer_factory

    slow = SimpleNamespace(is_fast=False, decode=tokenizer.decode)
    make, why = detokenizer_factory(slow)
    assert isinstance(make(), Detokenizer) and "slow" in why
    ids = tokenizer(MULTIBYTE, add_special_tokens=False)["input_ids"]
    assert "".join(_decoded_pieces(make, ids)) == tokenizer.decode(ids, skip_special_tokens=True)


def test_ipc_messages_round_trip_between_the_two_sides():
    from hwrun.serve.ipc import AddRequest, Batch, Cancel, Channel, Failed, Ready, Shutdown

    front = Channel.bind()
    core = Channel.connect(front.addresses)
    try:
        sent = [AddRequest("r1", [1, 2, 3], 16, 0.0, 1.0, 0, None, False),
                AddRequest("r2", [4], 8, 0.7, 0.9, 5, 3, True, 0.05, 0.5, -0.5, 1.2, [(7, -3.0)], 2,
                           ("json_schema", '{"type":"object"}'), 3, [9, 11], None),
                Cancel(["r1", "r2"]), Shutdown()]
        for message in sent:
            front.send(message)
        got = [core.recv(5) for _ in sent]
        assert got == sent
        back = [Ready({"engine": "x", "eos_ids": [2]}, b"tok", 123),
                Batch([("r1", [5, 6], False, None, None, 0, None), ("r2", [], True, "error", "boom", 2, None),
                       ("r3", [8], True, "stop", None, 1, [(-0.25, [(8, -0.25), (3, -1.5)])])], 1, 0, 3, 7),
                Failed("RuntimeError: x", b"", True)]
        for message in back:
            core.send(message)
        assert [front.recv(5) for _ in back] == back
        assert front.recv(0) is None and front.recv_ready() == []
    finally:
        core.close()
        front.close()
    import os

    assert not os.path.exists(front.folder)  # the sockets' private folder is removed


def test_the_front_detokenizes_each_batch_off_the_loop_and_flushes_at_the_end(tokenizer):
    """The Engine's reader thread turns each batch's token ids into text with the request's detokenizer; the texts
    of one request join to the full decode, and the end of the text comes with its finishing event."""
    from hwrun.serve.text import detokenizer_factory

    ids = tokenizer(MULTIBYTE, add_special_tokens=False)["input_ids"]

    class Replay(ScriptedBackend):
        def step(self):
            time.sleep(0.002)
            events = []
            for request_id, state in list(self.active.items()):
                chunk = ids[state[0]:state[0] + 2]  # two tokens a step: split characters inside one event too
                state[0] += len(chunk)
                done = state[0] >= len(ids)
                if done:
                    del self.active[request_id]
                events.append(EngineEvent(request_id, tuple(chunk), done, "length" if done else None))
            return events

    engine = Engine(lambda: Replay(slots=2), max_concurrency=2, max_queue=2)
    engine.detokenizer = detokenizer_factory(tokenizer)[0]
    events, done, sink_for = _collector()

    async def work():
        for name in ("a", "b"):
            engine.submit(EngineRequest(name, (1,), len(ids)), sink_for(name))
        await asyncio.wait_for(asyncio.gather(done["a"].wait(), done["b"].wait()), 10)

    _run_engine(engine, work)
    for name in ("a", "b"):
        assert all(e.text is not None for e in events[name])
        assert "".join(e.text for e in events[name]) == tokenizer.decode(ids, skip_special_tokens=True)
        assert [t for e in events[name] for t in e.token_ids] == ids


def test_the_front_refuses_past_its_limits_before_the_core_answers():
    """429 is decided by the front (requests in flight >= slots + queue), at once, without a round trip."""
    backend = ScriptedBackend(slots=1)
    engine = Engine(lambda: backend, max_concurrency=1, max_queue=1)
    events, done, sink_for = _collector()

    async def work():
        engine.submit(EngineRequest("a", (1,), 10_000), sink_for("a"))
        engine.submit(EngineRequest("b", (1,), 3), sink_for("b"))
        with pytest.raises(QueueFullError):
            engine.submit(EngineRequest("c", (1,), 3), sink_for("c"))
        assert engine.in_flight == 2
        engine.cancel("a")
        await asyncio.wait_for(asyncio.gather(done["a"].wait(), done["b"].wait()), 10)
        assert engine.in_flight == 0

    _run_engine(engine, work)
    assert events["a"][-1].finish_reason == "cancelled" and events["b"][-1].finish_reason == "length"


def test_the_front_knows_the_free_slots_once_ready_before_any_batch():
    """The core's counters come with Ready (the GPU serve test read 0 free slots before the first step's batch)."""
    engine = Engine(lambda: ScriptedBackend(slots=3), max_concurrency=3, max_queue=0)

    async def work():
        assert engine.ready and engine.free_slots == 3

    _run_engine(engine, work)
