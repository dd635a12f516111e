"""Sampling inside the graph decoders: the top-k / top-p masks on hand-made logits, the counter-based noise,
greedy equivalences (temperature 0, top_k=1), seeds that reproduce and do not depend on the batch, a
plausible distribution, and `hwrun.generate(do_sample=True, decode="graphs")` using all of it."""

from __future__ import annotations

import math

import hwrun
import pytest
import torch
from hwrun.errors import GenerateError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.decode.sampling import filter_logits, mix32, next_tokens, uniform_noise
from hwrun.inference.decode.static import GraphDecoder
from hwrun.inference.engine import EngineCore

INF = float("-inf")


def _rows(n, temperature=1.0, top_p=1.0, top_k=0, seed=0):
    return (torch.full((n,), float(temperature)), torch.full((n,), float(top_p)), torch.full((n,), top_k),
            torch.full((n,), seed))


def test_top_k_and_top_p_masks_on_hand_made_logits():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = probs.log()
    keep = lambda k, p: (filter_logits(logits, torch.tensor([1.0]), torch.tensor([k]),  # noqa: E731
                                       torch.tensor([p])) > INF)[0].tolist()
    assert keep(0, 1.0) == [True, True, True, True]  # both off
    assert keep(2, 1.0) == [True, False, True, False]  # the two most likely
    assert keep(1, 1.0) == [True, False, False, False]
    assert keep(0, 0.5) == [True, False, False, False]  # 0.5 alone reaches 0.5
    assert keep(0, 0.6) == [True, False, True, False]  # 0.5 + 0.3
    assert keep(0, 0.85) == [True, False, True, True]  # 0.5 + 0.3 < 0.85: add 0.15
    assert keep(0, 1e-6) == [True, False, False, False]  # never fewer than one
    # top-p over what top-k kept (Transformers' order): within the top 2, 0.5/0.8 = 0.625 < 0.7 -> both
    assert keep(2, 0.7) == [True, False, True, False]
    assert keep(3, 0.9) == [True, False, True, True]
    # temperature divides before filtering: at 0.5 the top token holds 0.5^2/(0.25+0.09+0.0225+0.0025) > 0.6
    scaled = filter_logits(logits, torch.tensor([0.5]), torch.tensor([0]), torch.tensor([0.6]))
    assert (scaled > INF)[0].tolist() == [True, False, False, False]
    assert torch.allclose(scaled[0, 0], logits[0, 0] / 0.5)


def test_per_row_parameters_do_not_leak_between_rows():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    kept = filter_logits(logits, torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1, 0, 3]), torch.tensor([1.0, 1.0, 1.0]))
    assert (kept > INF).sum(dim=1).tolist() == [1, 4, 3]


def _reference_filter(logits, temperature, top_k, top_p):
    """The filter's plain form: float32 values sorted, the top-p mass by torch.cumsum (Transformers' warpers' order)."""
    scaled = logits.float() / torch.where(temperature > 0, temperature, 1.0)[:, None]
    ordered = scaled.sort(dim=-1, descending=True).values
    vocab = scaled.shape[-1]
    in_k = torch.arange(vocab)[None, :] < torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)[:, None]
    probs = torch.softmax(ordered.masked_fill(~in_k, INF), dim=-1)
    keep = in_k & ((probs.cumsum(dim=-1) - probs < top_p[:, None]) | (top_p[:, None] >= 1))
    threshold = ordered.gather(1, keep.sum(dim=-1, keepdim=True).clamp(min=1) - 1)
    return scaled.masked_fill(scaled < threshold, INF)


def test_block_cumsum_is_a_cumsum_for_any_width_and_under_tf32_precision():
    """block_cumsum equals torch.cumsum within float32 rounding for widths below, at and above its block (and
    recursion levels), for no rows and no columns, and with float32 matmul precision "high" (its TF32 split)."""
    from hwrun.inference.decode.sampling import block_cumsum

    generator = torch.Generator().manual_seed(1)
    for width in (1, 63, 64, 65, 1000, 4097, 128256):
        probs = torch.softmax(torch.randn(3, width, generator=generator) * 4, dim=-1)
        assert torch.allclose(block_cumsum(probs), probs.cumsum(dim=-1), atol=2e-6), width
    assert block_cumsum(torch.rand(0, 100)).shape == (0, 100) and block_cumsum(torch.rand(2, 0)).shape == (2, 0)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        probs = torch.softmax(torch.randn(2, 5000, generator=generator) * 4, dim=-1)
        assert torch.allclose(block_cumsum(probs), probs.cumsum(dim=-1), atol=2e-6)
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_filter_equals_its_plain_form_on_random_logits(dtype, compiled):
    """The filter sorts the logits in their own dtype and, compiled, sums the top-p mass by matrix products
    (block_cumsum): the kept tokens and their values equal the plain form's (float32 sort, torch.cumsum) over many
    rows, with top-k, top-p, both, neither and temperature-0 rows mixed, vocabularies below and above a block."""
    torch._dynamo.reset()
    filter_logits_ = torch.compile(filter_logits, backend="eager", dynamic=False) if compiled else filter_logits
    generator = torch.Generator().manual_seed(0)
    for vocab in (50, 1000, 5003):
        rows = 64
        logits = (torch.randn(rows, vocab, generator=generator) * torch.rand(rows, 1, generator=generator) * 8).to(dtype)
        temperature = torch.rand(rows, generator=generator) * 1.5
        temperature[::7] = 0.0
        top_p = torch.rand(rows, generator=generator).clamp(min=0.05)
        top_p[::5] = 1.0
        top_k = torch.randint(0, 40, (rows,), generator=generator)
        top_k[::3] = 0
        got = filter_logits_(logits, temperature, top_k, top_p)
        want = _reference_filter(logits, temperature, top_k, top_p)
        assert torch.equal(got > INF, want > INF), vocab
        assert torch.equal(got[got > INF], want[want > INF])


def _lowbias32(x):
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_is_the_32_bit_hash_without_int64_overflow():
    values = [0, 1, 2, 12345, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**40 + 7]
    assert mix32(torch.tensor(values)).tolist() == [_lowbias32(v) for v in values]


def test_noise_is_a_function_of_seed_counter_and_index_only():
    seed, counter = torch.tensor([7, 7, 8]), torch.tensor([3, 3, 3])
    noise = uniform_noise(seed, counter, 1000)
    assert noise.shape == (3, 1000) and bool((noise > 0).all() and (noise < 1).all())
    assert torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    alone = uniform_noise(torch.tensor([8]), torch.tensor([3]), 1000)
    assert torch.equal(alone[0], noise[2])  # the other rows change nothing
    assert not torch.equal(uniform_noise(seed, counter + 1, 1000)[0], noise[0])
    assert abs(noise.mean().item() - 0.5) < 0.02


def test_the_noise_never_reaches_0_or_1_so_a_masked_token_is_never_drawn(monkeypatch):
    """The largest and smallest hash values give uniforms strictly inside (0, 1), hence finite Gumbel noise: with
    24 bits the largest rounded to 1.0 in float32 (noise +inf), and a token a grammar mask had set to -inf was drawn
    (NaN wins argmax) once in 2**24 draws (found by hwrun serve's structured-output test at its 68th token)."""
    import hwrun.inference.decode.sampling as sampling

    for extreme in (0xFFFFFFFF, 0):
        monkeypatch.setattr(sampling, "mix32", lambda x, value=extreme: torch.full_like(x, value))
        noise = uniform_noise(torch.tensor([1]), torch.tensor([0]), 4)
        assert bool(((noise > 0) & (noise < 1)).all()), noise
        assert bool(torch.isfinite(-torch.log(-torch.log(noise))).all())
        logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]])
        drawn = next_tokens(logits, torch.tensor([0.7]), torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1]),
                            torch.tensor([0]))
        assert drawn.item() in (0, 2)


def test_greedy_equivalences():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    counter = torch.arange(5)
    greedy = logits.argmax(dim=-1)
    assert torch.equal(next_tokens(logits, *_rows(5, temperature=0.0), counter), greedy)
    assert torch.equal(next_tokens(logits, *_rows(5, temperature=5.0, top_k=1, seed=3), counter), greedy)
    sampled = next_tokens(logits, *_rows(5, temperature=5.0, seed=3), counter)
    assert not torch.equal(sampled, greedy)  # a hot temperature does move tokens


def test_sampled_distribution_is_plausible():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 6000
    logits = probs.log().expand(n, 4)
    counter = torch.arange(n)
    drawn = next_tokens(logits, *_rows(n, seed=5), counter)
    frequency = torch.bincount(drawn, minlength=4).float() / n
    assert torch.allclose(frequency, probs, atol=0.025), frequency
    top2 = next_tokens(logits, *_rows(n, top_k=2, seed=5), counter)
    assert set(top2.tolist()) == {0, 1}  # only the two most likely ever appear, both do
    assert abs((top2 == 0).float().mean().item() - 0.6 / 0.85) < 0.025
    hot = next_tokens(logits, *_rows(n, temperature=100.0, seed=5), counter)
    assert (torch.bincount(hot, minlength=4).float() / n - 0.25).abs().max() < 0.03  # nearly uniform


@pytest.mark.parametrize("values, match", [
    (dict(temperature=-0.1), "temperature=-0.1 must be a number >= 0"),
    (dict(temperature=float("nan")), "temperature=nan"),
    (dict(top_p=0.0), "top_p=0.0 must be in \\(0, 1\\]"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(top_k=2.5), "top_k=2.5"),
    (dict(seed=1.5), "seed=1.5 must be an integer or None"),
    (dict(seed="7"), "seed='7'"),
])
def test_bad_sampling_params(values, match):
    with pytest.raises(GenerateError, match=match):
        SamplingParams(**values)


# ---- the decoders ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return plan, model, tokenizer


def _ids(n, length=6, seed=1):
    return torch.randint(3, 300, (n, length), generator=torch.Generator().manual_seed(seed))


def test_static_decoder_sampling(loaded):
    _, model, _ = loaded
    ids = _ids(3)
    params = SamplingParams(temperature=1.3, top_p=0.9, seed=21)
    batch = GraphDecoder(model, batch_size=3, max_cache_len=40)
    greedy = batch.generate(ids, 12, eos_token_id=None)
    assert torch.equal(batch.generate(ids, 12, eos_token_id=None, sampling=SamplingParams(temperature=0.0)), greedy)
    assert torch.equal(batch.generate(ids, 12, eos_token_id=None, sampling=SamplingParams(temperature=2.0,
                                                                                          top_k=1, seed=4)), greedy)
    sampled = batch.generate(ids, 12, eos_token_id=None, sampling=params)
    assert not torch.equal(sampled, greedy)
    assert torch.equal(batch.generate(ids, 12, eos_token_id=None, sampling=params), sampled)  # reproducible
    single = GraphDecoder(model, batch_size=1, max_cache_len=40)
    for row in range(3):  # each row is what it is alone: the batch does not change a seeded request
        assert torch.equal(single.generate(ids[row:row + 1], 12, eos_token_id=None, sampling=params)[0], sampled[row])
    # the slot decoder draws the same tokens for the same seed (same counter: the token's index in its request)
    slots = EngineCore(model, slots=2, max_cache_len=40).generate(ids.tolist(), 12, eos_token_id=None,
                                                                    sampling=params)
    assert slots == sampled.tolist()


def test_generate_samples_through_the_graph_decoders(loaded):
    plan, model, tokenizer = loaded
    prompts = ["The king said", "Once upon a time there was a little house", "It was"]
    kwargs = dict(do_sample=True, temperature=0.9, top_p=0.95, top_k=40, seed=3, decode="graphs", model=model,
                  tokenizer=tokenizer)
    continuous = hwrun.generate(plan, prompts, 10, batching="continuous", **kwargs)
    assert continuous.decode == "graphs" and "hwrun's engine" in continuous.decode_reason
    again = hwrun.generate(plan, prompts, 10, batching="continuous", **kwargs)
    assert again.token_ids == continuous.token_ids
    one_by_one = [hwrun.generate(plan, p, 10, batching="static", **kwargs).token_ids[0] for p in prompts]
    assert one_by_one == continuous.token_ids  # static graph loop, one prompt each: the same draws
    greedy = hwrun.generate(plan, prompts, 10, batching="static", decode="generate", model=model,
                            tokenizer=tokenizer).token_ids
    assert continuous.token_ids != greedy
    top1 = hwrun.generate(plan, prompts, 10, batching="continuous", **{**kwargs, "top_k": 1})
    assert top1.token_ids == greedy


def test_generate_passes_the_models_top_k_when_none_is_given(loaded, monkeypatch):
    import importlib

    plan, model, tokenizer = loaded
    module = importlib.import_module("hwrun.inference.generate")
    seen = []
    original = module._graph_sampling
    monkeypatch.setattr(module, "_graph_sampling", lambda *a: seen.append(original(*a)) or seen[-1])
    hwrun.generate(plan, "The king", 3, do_sample=True, temperature=0.7, top_p=0.9, seed=1, decode="graphs",
                   model=model, tokenizer=tokenizer)
    assert seen == [SamplingParams(0.7, 0.9, model.generation_config.top_k or 0, 1)]
    assert math.isclose(seen[0].temperature, 0.7)


def test_sampling_traces_as_one_graph_with_no_host_sync():
    """fullgraph=True fails on any graph break (`.item()`, data-dependent shapes): what a capture forbids."""
    import torch._dynamo

    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    rows = (torch.tensor([0.0, 0.7, 1.0, 2.0]), torch.tensor([1.0, 0.9, 0.5, 1.0]), torch.tensor([0, 0, 5, 1]),
            torch.tensor([1, 2, 3, 4]))
    counter = torch.tensor([0, 1, 2, 3])
    torch._dynamo.reset()
    try:
        traced = torch.compile(next_tokens, fullgraph=True, dynamic=False, backend="eager")
        assert torch.equal(traced(logits, *rows, counter), next_tokens(logits, *rows, counter))
    finally:
        torch._dynamo.reset()


def test_next_tokens_traces_into_one_graph():
    """The sampling compiles as one graph, without breaks (reading the matmul precision by its getter broke the
    graph at every block_cumsum level)."""
    rows, vocab = 2, 300
    explained = torch._dynamo.explain(next_tokens)(torch.randn(rows, vocab), *_rows(rows, 0.7, 0.9),
                                                   torch.zeros((rows, 1), dtype=torch.long))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
