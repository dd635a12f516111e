"""What a request's sampling asks beyond temperature / top-k / top-p / seed, inside hwrun's engine step (issue 36.3):
min_p, repetition / presence / frequency penalties, logit_bias and logprobs, from per-row device buffers, checked
against Transformers' own processors (RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
MinPLogitsWarper) or a plain torch reference of OpenAI's definition on the same model. Greedy rows stay
`model.generate(do_sample=False)`'s beside penalised, sampled and logprobs rows in the same step; every bad value is
refused naming it."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwenv.platforms import get_platform
from hwenv.testing import fake_xpu
from hwrun.errors import FastDecodeError, GenerateError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.decode.sampling import filter_logits
from hwrun.inference.engine import EngineCore
from hwrun.testing.families import build_tiny_family
from transformers import LogitsProcessor, LogitsProcessorList

TEXTS = ["The king said", "Once upon a time there was a little house", "It was", "She opened the door"]


@pytest.fixture(scope="module")
def llama():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("gpt2", tmp_path_factory.mktemp("knobs") / "gpt2")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence / frequency penalties over the generated tokens: logit - f * count - p * (count > 0)."""

    def __init__(self, start: int, presence: float, frequency: float) -> None:
        self.start, self.presence, self.frequency = start, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.start:]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def _generate(model, ids, n, **kwargs):
    """`n` greedy tokens of `model.generate` with processors, without stopping at EOS."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None, **kwargs)
    return out[0, len(ids):].tolist()


def _run(engine, requests, steps=200):
    """{(request id, index): tokens}, and the events, of `engine.add(**request)` for each, stepped to the end."""
    for request in requests:
        engine.add(**request)
    tokens, events = {}, []
    for _ in range(steps):
        if not engine.active:
            break
        for event in engine.step():
            events.append(event)
            if event.token_id is not None:
                tokens.setdefault((event.request_id, event.index), []).append(event.token_id)
    assert not engine.active
    return tokens, events


@pytest.mark.parametrize("bad, named", [
    (dict(min_p=1.5), "min_p=1.5"), (dict(min_p=-0.1), "min_p=-0.1"),
    (dict(presence_penalty=2.5), "presence_penalty=2.5"), (dict(frequency_penalty=-3), "frequency_penalty=-3"),
    (dict(repetition_penalty=0), "repetition_penalty=0"), (dict(repetition_penalty=float("inf")), "repetition_penalty=inf"),
    (dict(logprobs=21), "logprobs=21"), (dict(logprobs=-1), "logprobs=-1"), (dict(logprobs=True), "logprobs=True"),
    (dict(logit_bias=((5, 101.0),)), "logit_bias[5]=101.0"), (dict(logit_bias=((-1, 1.0),)), "token id -1"),
    (dict(logit_bias=((5, 1.0), (5, 2.0))), "token id 5 twice"), (dict(logit_bias=(5,)), "entry 5"),
])
def test_bad_values_are_refused_naming_them(bad, named):
    with pytest.raises(GenerateError, match=named.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**bad)


def test_params_normalise_bias_and_say_when_processed():
    params = SamplingParams(logit_bias={9: -1, 3: 2.5})
    assert params.logit_bias == ((3, 2.5), (9, -1.0)) and params.processed
    assert not SamplingParams(temperature=0.7, top_k=5, seed=1).processed
    assert SamplingParams(logprobs=0).processed and SamplingParams(repetition_penalty=1.2).processed


def test_a_bias_id_outside_the_vocabulary_is_refused_before_any_slot_is_taken(llama):
    model, ids = llama
    engine = EngineCore(model, slots=2, max_cache_len=64)
    with pytest.raises(GenerateError, match="logit_bias token id 3072 is outside"):
        engine.add("a", ids[0], max_new_tokens=3, sampling=SamplingParams(logit_bias=((3072, 1.0),)))
    assert engine.free_slots == 2
    with pytest.raises(FastDecodeError, match="logprobs=0: generate"):
        engine.generate([ids[0]], 3, sampling=SamplingParams(logprobs=0))


def test_min_p_filters_as_transformers_warpers_do():
    from transformers import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 3
    for temperature, top_k, top_p, min_p in ((1.0, 0, 1.0, 0.1), (0.7, 20, 0.9, 0.05), (1.3, 0, 0.95, 0.3)):
        warpers = [TemperatureLogitsWarper(temperature)]
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        warpers += [TopPLogitsWarper(top_p), MinPLogitsWarper(min_p)]
        expected = LogitsProcessorList(warpers)(None, logits.clone())
        got = filter_logits(logits, torch.full((3,), temperature), torch.full((3,), top_k),
                            torch.full((3,), top_p), torch.full((3,), min_p))
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        assert torch.allclose(got[~torch.isinf(got)], expected[~torch.isinf(expected)], atol=1e-6)


@pytest.mark.parametrize("step", ["fused", "model"])
def test_greedy_penalties_and_bias_equal_transformers_processors(llama, step):
    model, ids = llama
    bias = ((int(_generate(model, ids[0], 1)[0]), -5.0), (17, 3.0))
    cases = {
        "rep": (SamplingParams(repetition_penalty=1.4), dict(repetition_penalty=1.4)),
        "bias": (SamplingParams(logit_bias=bias), dict(sequence_bias={(t,): b for t, b in bias})),
        "openai": (SamplingParams(presence_penalty=0.8, frequency_penalty=0.6),
                   dict(logits_processor=LogitsProcessorList([OpenAIPenalties(len(ids[0]), 0.8, 0.6)]))),
        "plain": (None, {}),
    }
    prompts = {"rep": ids[1], "bias": ids[0], "openai": ids[0], "plain": ids[2]}
    engine = EngineCore(model, slots=4, max_cache_len=64, step=step)
    tokens, _ = _run(engine, [dict(request_id=name, input_ids=prompts[name], max_new_tokens=10, sampling=params,
                                   eos_token_id=None) for name, (params, _) in cases.items()])
    for name, (_, kwargs) in cases.items():
        assert tokens[(name, 0)] == _generate(model, prompts[name], 10, **kwargs), name
    assert tokens[("rep", 0)] != _generate(model, prompts["rep"], 10)  # the penalty changed the answer


def test_logprobs_are_the_raw_models_log_softmax(llama):
    model, ids = llama
    engine = EngineCore(model, slots=2, max_cache_len=64)
    sampling = SamplingParams(temperature=0.9, seed=3, logprobs=5, repetition_penalty=1.2)
    _, events = _run(engine, [dict(request_id="a", input_ids=ids[0], max_new_tokens=6, sampling=sampling,
                                   eos_token_id=None),
                              dict(request_id="b", input_ids=ids[1], max_new_tokens=6, eos_token_id=None)])
    mine = [e for e in events if e.request_id == "a"]
    assert all(e.logprob is None and e.top == () for e in events if e.request_id == "b")  # not asked
    sequence = ids[0] + [e.token_id for e in mine]
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([sequence])).logits[0].float(), dim=-1)
    for i, event in enumerate(mine):
        row = reference[len(ids[0]) - 1 + i]
        assert event.logprob == pytest.approx(float(row[event.token_id]), abs=1e-4)
        top = row.topk(5)
        assert [t for t, _ in event.top] == top.indices.tolist()
        assert [lp for _, lp in event.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_min_p_one_and_a_huge_bias_decide_the_sampled_token(llama):
    model, ids = llama
    engine = EngineCore(model, slots=2, max_cache_len=64)
    tokens, _ = _run(engine, [
        dict(request_id="minp", input_ids=ids[0], max_new_tokens=8, eos_token_id=None,
             sampling=SamplingParams(temperature=1.5, seed=1, min_p=1.0)),
        dict(request_id="bias", input_ids=ids[1], max_new_tokens=8, eos_token_id=None,
             sampling=SamplingParams(temperature=1.5, seed=1, logit_bias=((42, 100.0),)))])
    assert tokens[("minp", 0)] == _generate(model, ids[0], 8)  # min_p=1 keeps only the most likely token
    assert tokens[("bias", 0)] == [42] * 8


def test_one_graph_per_kind_serves_every_mix_without_recapture(llama):
    model, ids = llama
    with fake_xpu(1) as fake:
        engine = EngineCore(model, slots=4, max_cache_len=48, platform=get_platform("xpu"), buckets=[4])
        engine.start(processed=True)
        assert sorted(engine.graphs) == [(kind, 4, 48) for kind in (0, 1, 2, 3, 6, 7)]
        captured = fake.graph_events.count("capture_begin")
        seeded = SamplingParams(temperature=0.8, seed=11, presence_penalty=0.5, logprobs=2)
        alone, _ = _run(engine, [dict(request_id="s", input_ids=ids[1], max_new_tokens=6, sampling=seeded,
                                      eos_token_id=None)])
        mixed, _ = _run(engine, [
            dict(request_id="g", input_ids=ids[0], max_new_tokens=6, eos_token_id=None),
            dict(request_id="s", input_ids=ids[1], max_new_tokens=6, sampling=seeded, eos_token_id=None),
            dict(request_id="r", input_ids=ids[2], max_new_tokens=6, eos_token_id=None,
                 sampling=SamplingParams(repetition_penalty=1.3))])
        assert fake.graph_events.count("capture_begin") == captured  # replays only
        assert "replay" in fake.graph_events
    assert mixed[("s", 0)] == alone[("s", 0)]  # a seeded row's draws do not depend on its neighbours
    assert mixed[("g", 0)] == _generate(model, ids[0], 6)
    assert mixed[("r", 0)] == _generate(model, ids[2], 6, repetition_penalty=1.3)


def test_generate_applies_penalties_to_every_prompt(gpt2):
    prompts = [[5, 9, 14], [2, 7, 11, 13, 17], [40, 41, 42]]
    engine = EngineCore(gpt2, slots=2, max_cache_len=32)  # 3 prompts through 2 slots: a row is reused
    got = engine.generate(prompts, 6, eos_token_id=None, sampling=SamplingParams(repetition_penalty=1.5))
    assert got == [_generate(gpt2, p, 6, repetition_penalty=1.5) for p in prompts]
