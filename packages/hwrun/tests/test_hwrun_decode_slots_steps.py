"""hwrun's engine's step-wise API (a server admits live requests between steps): add / step / cancel /
start, TokenEvents with finish reasons, greedy tokens equal to `model.generate`'s, slots freed and reused;
with the fused Llama step and with the model's own forward (step="model")."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore, TokenEvent

PROMPTS = ["The king said", "Once upon a time there was a little house", "It was", "The queen"]


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, [tokenizer(p)["input_ids"] for p in PROMPTS]


def _reference(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def _drain(decoder, streams, limit=200):
    """step() until no request is active; tokens and finish reasons per request id."""
    reasons = {}
    for _ in range(limit):
        if not decoder.active:
            return reasons
        for event in decoder.step():
            assert isinstance(event, TokenEvent)
            streams.setdefault(event.request_id, []).append(event.token_id)
            if event.finished:
                reasons[event.request_id] = event.finish_reason
            else:
                assert event.finish_reason is None
    raise AssertionError("requests never finished")


@pytest.mark.parametrize("step", ["fused", "model"])
def test_requests_added_between_steps_give_generates_tokens(loaded, step):
    model, ids = loaded
    decoder = EngineCore(model, slots=2, max_cache_len=64, step=step)
    assert decoder.free_slots == 2 and decoder.active == set() and decoder.step() == []
    decoder.add("a", ids[0], max_new_tokens=7, eos_token_id=None)
    streams: dict = {}
    for event in decoder.step() + decoder.step():  # "a" runs alone for two steps
        streams.setdefault(event.request_id, []).append(event.token_id)
    decoder.add("b", ids[1], max_new_tokens=5, eos_token_id=None)  # joins "a" mid-way
    assert decoder.free_slots == 0 and decoder.active == {"a", "b"}
    first = decoder.step()
    assert [e.request_id for e in first] == ["a", "b"]  # one event per active request
    for event in first:
        streams.setdefault(event.request_id, []).append(event.token_id)
    reasons = _drain(decoder, streams)
    assert streams["a"] == _reference(model, ids[0], 7)
    assert streams["b"] == _reference(model, ids[1], 5)
    assert reasons == {"a": "length", "b": "length"}
    assert decoder.free_slots == 2 and decoder.active == set()
    # a freed slot takes the next request, which again equals generate
    decoder.add("c", ids[2], max_new_tokens=4, eos_token_id=None)
    streams = {}
    _drain(decoder, streams)
    assert streams["c"] == _reference(model, ids[2], 4)


@pytest.mark.parametrize("step", ["fused", "model"])
def test_first_event_is_the_prefill_token_and_eos_stops_with_it(loaded, step):
    model, ids = loaded
    free = _reference(model, ids[0], 8)
    decoder = EngineCore(model, slots=3, max_cache_len=64, step=step)
    decoder.add(1, ids[0], max_new_tokens=1, eos_token_id=None)
    (event,) = decoder.step()
    assert event == TokenEvent(1, free[0], True, "length")
    eos = free[3]  # the 4th token is the stop id: it is reported, with "stop", and nothing after it
    decoder.add(2, ids[0], max_new_tokens=8, eos_token_id=eos)
    streams: dict = {}
    reasons = _drain(decoder, streams)
    assert streams[2] == free[: free.index(eos) + 1] and reasons == {2: "stop"}


@pytest.mark.parametrize("step", ["fused", "model"])
def test_cancel_frees_the_slot_before_the_next_step(loaded, step):
    model, ids = loaded
    decoder = EngineCore(model, slots=2, max_cache_len=64, step=step)
    decoder.add("x", ids[0], max_new_tokens=20, eos_token_id=None)
    decoder.add("y", ids[1], max_new_tokens=6, eos_token_id=None)
    streams: dict = {}
    for event in decoder.step():
        streams.setdefault(event.request_id, []).append(event.token_id)
    decoder.cancel("x")
    assert decoder.active == {"y"} and decoder.free_slots == 1
    after = decoder.step()
    assert [e.request_id for e in after] == ["y"]
    streams["y"].append(after[0].token_id)
    decoder.add("z", ids[3], max_new_tokens=5, eos_token_id=None)  # into x's old slot, mid-way through y
    _drain(decoder, streams)
    assert streams["y"] == _reference(model, ids[1], 6) and streams["z"] == _reference(model, ids[3], 5)
    with pytest.raises(FastDecodeError, match="request_id='x' is not active"):
        decoder.cancel("x")


def test_add_refuses_what_cannot_run(loaded):
    model, ids = loaded
    decoder = EngineCore(model, slots=1, max_cache_len=16)
    with pytest.raises(FastDecodeError, match="length 10 \\+ max_new_tokens 7 exceeds max_cache_len=16"):
        decoder.add("long", [5] * 10, max_new_tokens=7)
    with pytest.raises(FastDecodeError, match="is empty"):
        decoder.add("empty", [], max_new_tokens=2)
    with pytest.raises(FastDecodeError, match="max_new_tokens=0"):
        decoder.add("zero", [5], max_new_tokens=0)
    with pytest.raises(FastDecodeError, match="sampling=0.5 must be a SamplingParams"):
        decoder.add("bad", [5], max_new_tokens=2, sampling=0.5)
    assert decoder.free_slots == 1 and decoder.active == set()  # nothing half-added
    decoder.add("one", [5, 6], max_new_tokens=3)
    with pytest.raises(FastDecodeError, match="request_id='one' is already active"):
        decoder.add("one", [5], max_new_tokens=2)
    with pytest.raises(FastDecodeError, match="no free slot for request 'two': all 1 slots are busy"):
        decoder.add("two", [5], max_new_tokens=2)
    with pytest.raises(FastDecodeError, match="1 request\\(s\\) added with add\\(\\) are active"):
        decoder.generate([[5]], 2)


def test_seeded_sampled_request_is_the_same_alone_and_beside_others(loaded):
    model, ids = loaded
    params = SamplingParams(temperature=1.5, top_p=0.95, seed=11)

    def run(others):
        decoder = EngineCore(model, slots=4, max_cache_len=64)
        for index, other in enumerate(others):  # other requests first: the sampled one gets another slot
            decoder.add(f"o{index}", ids[other], max_new_tokens=9, eos_token_id=None,
                        sampling=SamplingParams(temperature=1.0, seed=index))
        decoder.add("s", ids[0], max_new_tokens=12, eos_token_id=None, sampling=params)
        streams: dict = {}
        _drain(decoder, streams)
        return streams

    alone, beside = run([]), run([1, 2, 3])
    assert alone["s"] == beside["s"] and len(alone["s"]) == 12
    assert alone["s"] != _reference(model, ids[0], 12)  # it did sample (temperature 1.5 on a tiny model)
    # greedy requests keep generate's tokens while a sampled one shares the step
    decoder = EngineCore(model, slots=2, max_cache_len=64)
    decoder.add("g", ids[1], max_new_tokens=6, eos_token_id=None)
    decoder.add("s", ids[0], max_new_tokens=6, eos_token_id=None, sampling=params)
    streams: dict = {}
    _drain(decoder, streams)
    assert streams["g"] == _reference(model, ids[1], 6) and streams["s"] == alone["s"][:6]


@pytest.mark.parametrize("step", ["fused", "model"])
def test_start_warms_up_once_and_generate_still_works(loaded, step):
    model, ids = loaded
    decoder = EngineCore(model, slots=2, max_cache_len=64, compile_backend="eager", step=step)
    assert decoder.step_name == step and decoder.buckets == (1, 2)
    decoder.start(sampling=False)
    assert decoder.runner.warmed == {(False, 1, 64), (False, 2, 64)}  # every bucket's greedy step ran once, buffers restored
    assert not decoder.runner.position.any() and not decoder.runner.count.any()
    calls = []
    for key, original in list(decoder.runner.step_fns.items()):
        decoder.runner.step_fns[key] = lambda original=original: calls.append(1) or original()
    decoder.start(sampling=False)
    assert calls == []  # not again
    assert decoder.generate(ids[:3], 5, eos_token_id=None) == [_reference(model, i, 5) for i in ids[:3]]
