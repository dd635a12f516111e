"""Chunked prefill mixed with decode (issue 35 point 3): a step prefills at most `prefill_chunk` prompt tokens, so a
long prompt admitted while others decode is prefilled over several steps (the fused step at positions offset by
what its row already holds, the model step through the SlotCache writing each chunk at the row's offset) while the
running requests get one token every step. Greedy tokens still equal `model.generate`'s (Llama with the fused and
the model step, GPT-2 and Qwen3 with the model step); seeded sampling is unchanged by the chunking; the budget is
chosen per device with its reason."""

from __future__ import annotations

import pytest
import torch
from hwenv.platforms import get_platform
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.inference.engine.kv_cache import KVCache
from hwrun.inference.engine.prefill_budget import prefill_chunk_for
from hwrun.inference.engine.requests import Request
from hwrun.inference.engine.scheduler import Scheduler
from hwrun.testing.families import build_tiny_family

#: (family, step): the fused Llama step, and the model's own forward for three families.
CASES = [("llama", "fused"), ("llama", "model"), ("gpt2", "model"), ("qwen3", "model")]
SHORT = [[5, 9, 14], [2, 7, 11, 13, 17]]
LONG = [(7 * i) % 90 + 3 for i in range(37)]  # 37 tokens: 10 chunks of 4 (the last one 1 token)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("chunked")
    first = build_tiny_family("llama", root / "llama")
    models = {"llama": first}
    for name in ("gpt2", "qwen3"):
        models[name] = build_tiny_family(name, root / name, tokenizer_source=first)
    return {name: AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
            for name, path in models.items()}


def _reference(model, ids, n):
    """`n` greedy tokens of `model.generate`, one call per token (no EOS stop, no EOS suppression)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out = model.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False, pad_token_id=0)
            seq.append(int(out[0, -1]))
    return seq[len(ids):]


def _collect(events, streams):
    for event in events:
        streams.setdefault(event.request_id, []).append(event.token_id)
    return [event.request_id for event in events]


def test_the_budget_is_chosen_per_device_and_can_be_given():
    cpu, cuda = get_platform("cpu"), get_platform("cuda")
    chunk, why = prefill_chunk_for(cpu)
    assert chunk == 128 and "cpu" in why and "arithmetic" in why
    chunk, why = prefill_chunk_for(cuda)
    assert chunk == 512 and "reading the weights" in why  # the model's size not known
    # scaled by the model's size from the H100's launch floor (1,024 tokens at 1.24B), powers of two in 256..2,048
    assert prefill_chunk_for(cuda, None, 1_235_814_400)[0] == 1024
    assert prefill_chunk_for(cuda, None, 500_000_000)[0] == 2048
    assert prefill_chunk_for(cuda, None, 3_000_000_000)[0] == 256
    assert prefill_chunk_for(cuda, None, 70_000_000_000)[0] == 256
    assert "1.24B parameters" in prefill_chunk_for(cuda, None, 1_235_814_400)[1]
    assert prefill_chunk_for(cpu, None, 1_235_814_400)[0] == 128  # a CPU has no launch floor
    assert prefill_chunk_for(cuda, 64) == (64, "prefill_chunk=64 given")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(FastDecodeError, match="must be a positive number of prompt tokens per step"):
            prefill_chunk_for(cpu, bad)


def test_the_plan_splits_a_long_prompt_and_groups_the_prompts_that_fit():
    """Host only: the scheduler's plan under a budget of 8 tokens a step (no torch, no model)."""
    kv = KVCache(slots=4, max_cache_len=64)
    scheduler = Scheduler(kv, buckets=(1, 2, 4), cache_buckets=(64,), prefill_tokens=100, prefill_chunk=8)
    for name, prompt in (("a", [1, 2, 3]), ("long", list(range(10, 30))), ("b", [4, 5])):
        assert scheduler.admit(Request(name, prompt, 5, frozenset()))
    plans = []
    while scheduler.pending:
        plan = scheduler.prefill_plan()
        plans.append([[(c.slot, c.start, len(c.tokens), c.last) for c in forward] for forward in plan])
        for forward in plan:
            scheduler.prefilled(forward)
    # step 1: a whole (3) and long's first 5, padded together; 2: long continues (8 more, a forward of its own);
    # 3: long's last 7 and b's first token (the budget goes in admission order); 4: b's last token
    assert plans == [[[(0, 0, 3, True), (1, 0, 5, False)]], [[(1, 5, 8, False)]],
                     [[(1, 13, 7, True)], [(2, 0, 1, False)]], [[(2, 1, 1, True)]]]
    assert [r.produced for r in scheduler.requests.values()] == [1, 1, 1]


@pytest.mark.parametrize(("family", "step"), CASES)
def test_chunked_prefill_gives_generates_tokens(families, family, step):
    model = families[family]
    engine = EngineCore(model, slots=3, max_cache_len=64, step=step, prefill_chunk=4)
    assert engine.step_name == step and engine.prefill_chunk == 4
    streams: dict = {}
    engine.add("a", SHORT[0], max_new_tokens=16, eos_token_id=None)
    _collect(engine.step(), streams)
    engine.add("long", LONG, max_new_tokens=8, eos_token_id=None)  # 10 steps of prefill beside "a"
    engine.add("b", SHORT[1], max_new_tokens=6, eos_token_id=None)  # waits for long's chunks, then its own
    for _ in range(60):
        if not engine.active:
            break
        _collect(engine.step(), streams)
    assert streams["a"] == _reference(model, SHORT[0], 16)
    assert streams["long"] == _reference(model, LONG, 8)
    assert streams["b"] == _reference(model, SHORT[1], 6)
    # the whole-batch API: its plans run back to back, each up to `prefill_tokens` (no live streams to keep
    # flowing, so not the serving chunk): a prompt longer than that is chunked the same way
    chunked = EngineCore(model, slots=2, max_cache_len=64, step=step, prefill_chunk=5, prefill_tokens=5)
    rows = chunked.generate([LONG, SHORT[0], SHORT[1]], [8, 6, 5], eos_token_id=None)
    assert rows == [streams["long"], _reference(model, SHORT[0], 6), _reference(model, SHORT[1], 5)]
    assert chunked.prefills >= len(LONG) // 5
    whole = EngineCore(model, slots=3, max_cache_len=64, step=step, prefill_chunk=5)
    assert whole.generate([LONG, SHORT[0], SHORT[1]], [8, 6, 5], eos_token_id=None) == rows
    assert whole.prefills == 1  # three prompts in one padded forward, though the serving chunk is 5 tokens


@pytest.mark.parametrize(("family", "step"), [("llama", "fused"), ("gpt2", "model")])
def test_a_running_request_gets_a_token_at_every_step_of_a_long_prefill(families, family, step):
    model = families[family]
    chunk = 4
    engine = EngineCore(model, slots=2, max_cache_len=64, step=step, prefill_chunk=chunk)
    streams: dict = {}
    engine.add("a", SHORT[0], max_new_tokens=30, eos_token_id=None)
    assert _collect(engine.step(), streams) == ["a"]
    engine.add("long", LONG, max_new_tokens=4, eos_token_id=None)
    chunks = -(-len(LONG) // chunk)
    before = engine.prefills
    seen = [_collect(engine.step(), streams) for _ in range(chunks)]
    # each of the N steps that prefill `long` gives "a" its token; `long` joins at the step of its last chunk
    assert seen == [["a"]] * (chunks - 1) + [["a", "long"]]
    assert engine.prefills - before == chunks and engine.last_rows == 2
    while engine.active:
        _collect(engine.step(), streams)
    assert streams["a"] == _reference(model, SHORT[0], 30) and streams["long"] == _reference(model, LONG, 4)


@pytest.mark.parametrize("step", ["fused", "model"])
def test_a_request_moved_while_its_prompt_is_half_prefilled_keeps_its_tokens(families, step):
    """The request below a half-prefilled one leaves: its row (the chunks written so far, the position its next
    chunk starts at) moves down, and the rest of its prompt continues there."""
    model = families["llama"]
    engine = EngineCore(model, slots=2, max_cache_len=64, step=step, prefill_chunk=6)
    streams: dict = {}
    engine.add("a", SHORT[0], max_new_tokens=2, eos_token_id=None)
    _collect(engine.step(), streams)
    engine.add("long", LONG, max_new_tokens=5, eos_token_id=None)  # slot 1
    _collect(engine.step(), streams)  # long's first chunk; "a" ends and leaves slot 0
    request = engine.scheduler.requests["long"]
    assert engine.moves == 1 and request.slot == 0 and 0 < request.prefilled < len(LONG)
    while engine.active:
        _collect(engine.step(), streams)
    assert streams["long"] == _reference(model, LONG, 5)


def test_seeded_sampling_is_the_same_however_its_prompt_is_chunked(families):
    model = families["qwen3"]
    params = SamplingParams(temperature=1.2, top_p=0.95, seed=9)

    def run(prefill_chunk):
        engine = EngineCore(model, slots=2, max_cache_len=64, prefill_chunk=prefill_chunk)
        engine.add("o", SHORT[1], max_new_tokens=12, eos_token_id=None, sampling=SamplingParams(temperature=1.0, seed=1))
        engine.step()
        engine.add("s", LONG, max_new_tokens=10, eos_token_id=None, sampling=params)
        streams: dict = {}
        while engine.active:
            _collect(engine.step(), streams)
        return streams["s"]

    whole, chunked = run(64), run(3)
    assert whole == chunked and len(whole) == 10
    assert whole != _reference(model, LONG, 10)  # it did sample
