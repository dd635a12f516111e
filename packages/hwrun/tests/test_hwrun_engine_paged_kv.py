"""Paged KV (issue 35 point 2): the engine's K/V live in a pool of fixed-size blocks, a request holds blocks for the
tokens it has, and when they run out the newest request is preempted and recomputed later. Greedy tokens equal
Transformers' greedy under joins, leaves, cancels, preemption (forced with a tiny pool) and chunked prefill, for
the fused step and the model's own forward, eagerly and through the XPU fake's graphs; seeded sampling (penalties
and logprobs included) is unchanged by preemption; no block leaks; a request larger than the pool is refused at
add."""

from __future__ import annotations

import pytest
import torch
from hwenv.platforms import get_platform
from hwenv.testing import fake_xpu
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.testing.families import build_tiny_family

STEPS = ["fused", "model"]
PROMPTS = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 19), (9, 7), (2, 23), (7, 14))]
BUDGETS = [21, 14, 26, 9, 17]
BLOCK = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("llama", tmp_path_factory.mktemp("paged") / "llama")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


@pytest.fixture(scope="module")
def references(model):
    """Transformers' greedy tokens of every prompt (one generate call per token: no EOS stop)."""
    out = []
    for prompt, budget in zip(PROMPTS, BUDGETS, strict=True):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(budget):
                step = model.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False, pad_token_id=0)
                seq.append(int(step[0, -1]))
        out.append(seq[len(prompt):])
    return out


def _blocks(model, step, blocks, **options):
    """An engine whose pool holds `blocks` blocks of 16 positions."""
    per_token = EngineCore(model, slots=1, max_cache_len=16, step=step).kv_report.bytes_per_token
    engine = EngineCore(model, step=step, kv_cache_memory=blocks * BLOCK * per_token, **options)
    assert engine.kv.num_blocks == blocks and engine.kv_report.blocks == blocks
    return engine


def _no_leak(engine):
    assert engine.kv.free_blocks == engine.kv.num_blocks
    assert engine.kv.blocks.tables == {} and not any(engine.kv.rows) and engine.kv.free_slots == engine.slots


def _drive(engine, steps_before_join=2):
    """Requests 0-2 join at once, 3 and 4 later; request 1 is cancelled mid-way. Tokens by request index."""
    streams: dict = {}
    for index in range(3):
        engine.add(index, PROMPTS[index], max_new_tokens=BUDGETS[index], eos_token_id=None)
    for turn in range(400):
        if turn == steps_before_join:
            engine.add(3, PROMPTS[3], max_new_tokens=BUDGETS[3], eos_token_id=None)
        if turn >= steps_before_join + 3 and 4 not in streams and 4 not in engine.active and engine.free_slots:
            engine.add(4, PROMPTS[4], max_new_tokens=BUDGETS[4], eos_token_id=None)  # once a slot is free
        if turn == 6 and 1 in engine.active:
            engine.cancel(1)
        for event in engine.step():
            streams.setdefault(event.request_id, []).append(event.token_id)
        if 4 in streams and not engine.active:
            break
    return streams


@pytest.mark.parametrize("step", STEPS)
def test_greedy_tokens_survive_joins_leaves_cancels_and_preemption(model, references, step):
    # 6 blocks (96 positions) for 4 slots of requests that grow to 2-3 blocks each: someone is always preempted
    engine = _blocks(model, step, 6, slots=4, max_cache_len=64, prefill_chunk=8)
    streams = _drive(engine)
    for index in (0, 2, 3, 4):
        assert streams[index] == references[index], f"request {index}"
    assert len(streams.get(1, [])) < BUDGETS[1]  # cancelled
    assert engine.scheduler.preemptions > 0
    _no_leak(engine)


@pytest.mark.parametrize("step", STEPS)
def test_whole_batches_through_a_tiny_pool_give_generates_tokens(model, references, step):
    engine = _blocks(model, step, 5, slots=3, max_cache_len=64, prefill_chunk=16, check_every=4)
    assert engine.generate(PROMPTS, BUDGETS, eos_token_id=None) == references
    assert engine.scheduler.preemptions > 0
    _no_leak(engine)


def test_a_roomy_pool_never_preempts_and_every_token_is_the_same(model, references):
    engine = EngineCore(model, slots=5, max_cache_len=64)  # default: every slot at max_cache_len
    assert engine.kv.num_blocks == 5 * 4 and "fixed 2 GiB" in engine.kv_report.reason
    assert engine.generate(PROMPTS, BUDGETS, eos_token_id=None) == references
    assert engine.scheduler.preemptions == 0
    _no_leak(engine)


@pytest.mark.parametrize("step", STEPS)
def test_seeded_sampling_with_penalties_and_logprobs_is_unchanged_by_preemption(model, step):
    params = SamplingParams(temperature=1.1, top_p=0.95, seed=4, frequency_penalty=0.6, logprobs=2)

    def run(engine):
        engine.add("s", PROMPTS[1], max_new_tokens=24, eos_token_id=None, sampling=params)
        events = {"s": [(e.token_id, round(e.logprob, 4)) for e in engine.step()]}
        for index in (0, 2):
            engine.add(index, PROMPTS[index], max_new_tokens=BUDGETS[index], eos_token_id=None)
        while engine.active:
            for event in engine.step():
                events.setdefault(event.request_id, []).append((event.token_id, round(event.logprob or 0.0, 4)))
        _no_leak(engine)
        return events, engine.scheduler.preemptions

    roomy, none = run(EngineCore(model, slots=3, max_cache_len=64, step=step))
    tight, some = run(_blocks(model, step, 4, slots=3, max_cache_len=64))
    assert none == 0 and some > 0
    assert tight == roomy and len(tight["s"]) == 24  # the greedy ones too


@pytest.mark.parametrize("step", STEPS)
def test_choices_copy_their_leaders_blocks_and_preempt_like_any(model, references, step):
    engine = _blocks(model, step, 5, slots=4, max_cache_len=64, prefill_chunk=8)
    streams: dict = {}
    engine.add("n", PROMPTS[0], max_new_tokens=BUDGETS[0], eos_token_id=None, n=2)
    engine.add(2, PROMPTS[2], max_new_tokens=BUDGETS[2], eos_token_id=None)
    while engine.active:
        for event in engine.step():
            streams.setdefault((event.request_id, event.index), []).append(event.token_id)
    assert streams[("n", 0)] == streams[("n", 1)] == references[0]
    assert streams[(2, 0)] == references[2]
    _no_leak(engine)


def test_a_request_larger_than_the_whole_pool_is_refused_at_add(model):
    engine = _blocks(model, "fused", 2, slots=2, max_cache_len=64)
    with pytest.raises(FastDecodeError, match=r"request 'big' needs 3 KV blocks .* whole pool holds 2 \(32 tokens\)"):
        engine.add("big", [5] * 20, max_new_tokens=20, eos_token_id=None)
    with pytest.raises(FastDecodeError, match=r"needs 4 KV blocks \(2 x 20 positions"):
        engine.add("two", [5] * 10, max_new_tokens=10, eos_token_id=None, n=2)
    with pytest.raises(FastDecodeError, match="prompt 0 needs 3 KV blocks"):
        engine.generate([[5] * 30], 10, eos_token_id=None)
    assert not engine.active
    _no_leak(engine)


def test_paged_steps_replay_through_the_xpu_fakes_graphs_with_preemption(model, references):
    with fake_xpu(1) as fake:
        engine = _blocks(model, "fused", 6, slots=4, max_cache_len=64, prefill_chunk=8,
                         platform=get_platform("xpu"))
        assert engine.use_graphs
        streams = _drive(engine)
        assert fake.graph_events.count("capture_begin") >= 1 and "replay" in fake.graph_events
    for index in (0, 2, 3, 4):
        assert streams[index] == references[index], f"request {index}"
    assert engine.scheduler.preemptions > 0
    _no_leak(engine)


def _greedy(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False, pad_token_id=0)[0, -1]))
    return seq[len(prompt):]


@pytest.mark.parametrize("step", STEPS)
def test_a_shared_prompt_prefix_is_prefilled_once_and_outlives_its_requests(model, step):
    system = [(5 * i) % 70 + 6 for i in range(40)]  # two full blocks of 16, and 8 more tokens
    first, second = [*system, 9, 12, 3], [*system, 21, 4]
    engine = EngineCore(model, slots=2, max_cache_len=96, step=step, prefill_chunk=64)
    streams: dict = {}

    def collect():
        for event in engine.step():
            streams.setdefault(event.request_id, []).append(event.token_id)

    engine.add("a", first, max_new_tokens=6, eos_token_id=None)
    collect()
    engine.add("b", second, max_new_tokens=7, eos_token_id=None)
    collect()  # b's prefill starts at position 32: its first two blocks are a's
    rows = {engine.scheduler.requests[key].slot: key for key in ("a", "b")}
    a_row, b_row = (engine.kv.rows[slot] for slot in sorted(rows, key=rows.get))
    assert engine.kv.blocks.hits == 2 and a_row[:2] == b_row[:2] and a_row[2] != b_row[2]
    while engine.active:
        collect()
    assert engine.kv.free_blocks == engine.kv.num_blocks  # shared blocks went back once both left
    engine.add("c", first, max_new_tokens=5, eos_token_id=None)  # the prefix stayed cached in the free pool
    while engine.active:
        collect()
    assert engine.kv.blocks.hits == 4
    assert streams["a"] == _greedy(model, first, 6) and streams["b"] == _greedy(model, second, 7)
    assert streams["c"] == streams["a"][:5]
    _no_leak(engine)
    plain = EngineCore(model, slots=2, max_cache_len=96, step=step, prefix_caching=False)
    assert plain.generate([first, second], [6, 7], eos_token_id=None) == [streams["a"], streams["b"]]
    assert plain.kv.blocks.hits == 0


@pytest.mark.parametrize("step", STEPS)
def test_a_penalised_prompt_prefilled_beside_processed_steps_counts_only_its_own_tokens(model, step):
    """Idle rows step too: a row whose prompt is still being prefilled must not keep the counts of the tokens its
    idle steps chose (the penalties read them)."""
    penalised = SamplingParams(frequency_penalty=1.5, presence_penalty=0.5)
    long_prompt = [(7 * i) % 90 + 3 for i in range(37)]

    def run(chunk, beside):
        engine = EngineCore(model, slots=2, max_cache_len=96, step=step, prefill_chunk=chunk)
        streams: dict = {}
        if beside:  # a processed-kind request decoding while "p" is prefilled in chunks
            engine.add("o", PROMPTS[0], max_new_tokens=30, eos_token_id=None, sampling=SamplingParams(logprobs=1))
            engine.step()
        engine.add("p", long_prompt, max_new_tokens=12, eos_token_id=None, sampling=penalised)
        while "p" in engine.active:
            for event in engine.step():
                streams.setdefault(event.request_id, []).append(event.token_id)
        return streams["p"]

    assert run(4, beside=True) == run(96, beside=False)


@pytest.mark.parametrize("step", STEPS)
def test_prompts_continuing_cached_prefixes_share_one_forward_each_at_its_own_positions(model, step):
    """Prompts after a cached prefix used to get a prefill forward each (64 of them for 64 repeated prompts: on an
    H200 the 64-prompt generate ran at a third of its step's speed); now they are padded into one forward, each row
    at its own positions, beside the one of the prompts that start at 0, and their tokens stay Transformers'."""
    system = [(5 * i) % 70 + 6 for i in range(40)]  # two full blocks of 16, and 8 more tokens
    prompts = [[*system, 9, 12, 3], [*system, 21, 4], [*system[:20], 7, 8, 9, 10, 11], [(7 * i) % 60 + 5 for i in range(9)]]
    budgets = [6, 7, 5, 4]
    engine = EngineCore(model, slots=4, max_cache_len=96, step=step)
    engine.generate([[*system, 1, 2]], 2, eos_token_id=None)  # caches the system prompt's two full blocks
    hits = engine.kv.blocks.hits
    rows = engine.generate(prompts, budgets, eos_token_id=None)
    # the first two continue at position 32, the third at 16, the fourth starts at 0: two forwards, not four
    assert engine.prefills == 2
    assert engine.kv.blocks.hits - hits == 5
    assert rows == [_greedy(model, p, n) for p, n in zip(prompts, budgets, strict=True)]
    _no_leak(engine)
