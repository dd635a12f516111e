"""The engine side of the served sampling surface (issue 36.3): a request's every sampling field, `n`,
`stop_token_ids` and `structured` cross the IPC to the core, the slots backend maps them onto hwrun's engine, and
each choice's tokens, per-token logprobs and finish come back to the front with their index (detokenized per
choice); the transformers backend maps `n` and stop ids and refuses what its batching manager cannot apply, naming
the field and `--engine slots`; the core fails a refused request at once and admits one only when all its choices
fit."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import hwrun
import pytest
import torch
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.inference.structured import StructuredOutput
from hwrun.serve.backend_slots import SlotsBackend
from hwrun.serve.backend_transformers import REFUSED, TransformersBackend
from hwrun.serve.engine import Engine, EngineEvent, EngineRequest, TokenLogprob
from hwrun.serve.protocol import Sampling
from hwrun.serve.text import detokenizer_factory


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan()
    model, tokenizer = hwrun.load(plan)
    return model, tokenizer


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def _serve(backend, requests, tokenizer=None, max_concurrency=4):
    """Run `requests` through an Engine front over a thread core; {request id: [events]}."""
    engine = Engine(lambda: backend, max_concurrency=max_concurrency, max_queue=8)
    if tokenizer is not None:
        engine.detokenizer = detokenizer_factory(tokenizer)[0]
    events: dict[str, list[EngineEvent]] = {}
    done: dict[str, asyncio.Event] = {}

    async def main():
        engine.start(asyncio.get_running_loop())
        for _ in range(500):
            if engine.state in ("ready", "failed"):
                break
            await asyncio.sleep(0.01)
        for request in requests:
            events[request.request_id], done[request.request_id] = [], asyncio.Event()

            def sink(event, rid=request.request_id):
                events[rid].append(event)
                if rid not in engine._sinks:  # the front let the request go: every choice finished, or it failed
                    done[rid].set()
            engine.submit(request, sink)
        await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done.values())), 30)
        await asyncio.to_thread(engine.stop)

    asyncio.run(main())
    return events


def _by_choice(events):
    tokens, texts, logprobs, reasons = {}, {}, {}, {}
    for event in events:
        tokens.setdefault(event.index, []).extend(event.token_ids)
        texts[event.index] = texts.get(event.index, "") + (event.text or "")
        logprobs.setdefault(event.index, []).extend(event.logprobs or ())
        if event.finished:
            reasons[event.index] = event.finish_reason
    return tokens, texts, logprobs, reasons


def test_choices_logprobs_and_stop_ids_reach_the_front_per_choice(loaded):
    model, tokenizer = loaded
    ids = tuple(tokenizer("Once upon a time there was")["input_ids"])
    expected = _greedy(model, list(ids), 8)
    stop = expected[5]
    backend = SlotsBackend(EngineCore(model, slots=4, max_cache_len=64, use_graphs=False),
                           sampling_class=SamplingParams, eos_token_id=None)
    events = _serve(backend, [
        EngineRequest("n2", ids, 8, Sampling(temperature=0.0, logprobs=2, repetition_penalty=1.0), n=2,
                      stop_token_ids=(stop,)),
        EngineRequest("pen", ids, 8, Sampling(temperature=0.0, repetition_penalty=1.4))], tokenizer)
    tokens, texts, logprobs, reasons = _by_choice(events["n2"])
    cut = expected[: expected.index(stop) + 1]
    assert tokens == {0: cut, 1: cut} and reasons == {0: "stop", 1: "stop"}
    assert texts[0] == texts[1] == tokenizer.decode(cut, skip_special_tokens=True)
    assert all(isinstance(lp, TokenLogprob) and len(lp.top) == 2 for lp in logprobs[0])
    assert len(logprobs[0]) == len(cut) and [lp.top[0][0] for lp in logprobs[0]] == cut  # greedy: the top one
    pen_tokens, _, pen_logprobs, _ = _by_choice(events["pen"])
    assert pen_logprobs[0] == []  # not asked: none sent
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0, eos_token_id=None, repetition_penalty=1.4)
    assert pen_tokens[0] == out[0, len(ids):].tolist()


class OnlyIds:
    """A fake grammar matcher allowing `allowed` ids, complete after `length` tokens."""

    def __init__(self, allowed, length):
        self.allowed, self.length, self.seen = sorted(allowed), length, 0

    def fill(self, bitmask, row):
        bitmask[row] = 0
        for token in self.allowed:
            word, bit = divmod(token, 32)
            bitmask[row, word] |= (1 << bit) if bit < 31 else -(1 << 31)

    def accept(self, token):
        self.seen += 1
        return token in self.allowed

    @property
    def finished(self):
        return self.seen >= self.length


def test_structured_requests_get_a_matcher_per_choice(loaded):
    model, tokenizer = loaded
    backend = SlotsBackend(EngineCore(model, slots=4, max_cache_len=64, use_graphs=False),
                           sampling_class=SamplingParams, tokenizer=tokenizer)
    specs = []
    backend._compiler = SimpleNamespace(matcher=lambda spec: specs.append(spec) or OnlyIds({15, 42, 300}, 4))
    spec = StructuredOutput("json_object")
    events = _serve(backend, [EngineRequest("s", (1, 656, 366, 334), 10, Sampling(temperature=1.0, seed=2,
                                                                                 structured=spec), n=2)])
    tokens, _, _, reasons = _by_choice(events["s"])
    assert specs == [spec, spec] and reasons == {0: "stop", 1: "stop"}
    assert all(len(t) == 4 and set(t) <= {15, 42, 300} for t in tokens.values())


def test_the_core_fails_a_refused_request_at_once_and_waits_for_room_for_every_choice(loaded):
    model, _ = loaded
    backend = SlotsBackend(EngineCore(model, slots=2, max_cache_len=64, use_graphs=False),
                           sampling_class=SamplingParams)
    events = _serve(backend, [
        EngineRequest("lora", (1, 5), 4, adapter="bible"),
        EngineRequest("wide", (1, 5), 4, n=3),
        EngineRequest("one", (1, 5, 9), 6),
        EngineRequest("two", (1, 7), 3, n=2)], max_concurrency=2)
    (lora,) = events["lora"]
    assert lora.finish_reason == "error" and "adapter='bible'" in lora.error and "slot engine" in lora.error
    (wide,) = events["wide"]
    assert wide.finish_reason == "error" and "n=3 choices need 3 slots" in wide.error
    assert _by_choice(events["one"])[3] == {0: "length"}
    assert _by_choice(events["two"])[3] == {0: "length", 1: "length"}  # admitted once "one" left both slots


@pytest.mark.parametrize("field, value", [
    ("min_p", 0.1), ("presence_penalty", 0.5), ("frequency_penalty", -0.5), ("repetition_penalty", 1.2),
    ("logit_bias", ((5, 1.0),)), ("logprobs", 0), ("structured", StructuredOutput("json_object"))])
def test_the_transformers_backend_refuses_what_it_cannot_apply_naming_it(field, value):
    fake = SimpleNamespace(max_concurrency=4)
    why = TransformersBackend.refusal(fake, EngineRequest("r", (1,), 4, Sampling(**{field: value})))
    assert why.startswith(f"{field}: not served by --engine transformers") and "--engine slots" in why
    assert TransformersBackend.refusal(fake, EngineRequest("r", (1,), 4, Sampling())) is None
    assert "adapter" in TransformersBackend.refusal(fake, EngineRequest("r", (1,), 4, adapter="x"))
    assert set(REFUSED) >= {field, "adapter"}


def test_the_transformers_backend_runs_choices_and_stop_ids(loaded):
    model, tokenizer = loaded
    ids = tuple(tokenizer("The king said")["input_ids"])
    expected = _greedy(model, list(ids), 6)
    backend = TransformersBackend(model, kind="cpu", eos_ids=[], max_concurrency=4, max_model_len=64)
    try:
        events = _serve(backend, [EngineRequest("r", ids, 6, Sampling(temperature=0.0), n=2,
                                                stop_token_ids=(expected[2],))])
    finally:
        backend.close()
    tokens, _, _, reasons = _by_choice(events["r"])
    assert tokens == {0: expected[:3], 1: expected[:3]} and reasons == {0: "stop", 1: "stop"}


def test_every_request_field_crosses_the_ipc_unchanged():
    import msgspec
    from hwrun.serve.core import request_of
    from hwrun.serve.engine import add_message
    from hwrun.serve.ipc import ToCore

    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=2**40, min_p=0.05, presence_penalty=0.5,
                        frequency_penalty=-0.25, repetition_penalty=1.1, logit_bias=((3, -100.0), (7, 2.5)),
                        logprobs=20, structured=StructuredOutput.json_schema({"type": "object"}))
    request = EngineRequest("r", (1, 2, 3), 9, sampling, True, n=3, stop_token_ids=(5, 6), adapter="bible")
    wire = msgspec.msgpack.encode(add_message(request))
    assert request_of(msgspec.msgpack.Decoder(ToCore).decode(wire)) == request
    plain = EngineRequest("p", (4,), 2)
    assert request_of(msgspec.msgpack.Decoder(ToCore).decode(msgspec.msgpack.encode(add_message(plain)))) == plain
