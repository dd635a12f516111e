"""bitsandbytes weights in hwrun's engine and server (issue 43.2: `hwrun serve` on a quantized model). 4-bit
`Linear4bit` layers run the engine's model step eagerly, giving Transformers' greedy tokens per prompt, and
`hwrun serve` picks that engine for them (Transformers' continuous batching refuses quantized weights); 8-bit
(LLM.int8, whose outlier split depends on the whole batch) is refused by the engine and the server with the reason;
the fused step, graphs and compile are refused for 4-bit, naming what was asked."""

from __future__ import annotations

import importlib.util

import hwrun
import pytest
import torch
from hwrun.errors import EngineStartError, FastDecodeError
from hwrun.inference.engine import EngineCore
from hwrun.testing import build_tiny_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")

PROMPTS = ["The king said", "Once upon a time there was", "In the beginning"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-bnb")))


@pytest.fixture(scope="module")
def four_bit(tiny):
    plan = hwrun.plan(tiny, device="cpu", quantization="4bit")
    model, tokenizer = hwrun.load(plan)
    return plan, model, tokenizer


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_the_engine_runs_4bit_weights_eagerly_with_transformers_tokens(four_bit):
    _, model, tokenizer = four_bit
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    engine = EngineCore(model, slots=2, max_cache_len=64)  # 3 prompts through 2 slots: a join after a leave
    assert engine.step_name == "model" and engine.use_graphs is False
    assert engine.generate(prompts, [8, 6, 7], eos_token_id=None) == [
        _greedy(model, p, n) for p, n in zip(prompts, [8, 6, 7], strict=True)]
    assert {type(m).__name__ for n, m in model.named_modules() if n.endswith("q_proj")} == {"Linear4bit"}


@pytest.mark.parametrize("asked", [{"step": "fused"}, {"use_graphs": True}, {"compile_backend": "inductor"}])
def test_what_cannot_run_4bit_weights_is_refused_naming_it(four_bit, asked):
    _, model, _ = four_bit
    key, value = next(iter(asked.items()))
    with pytest.raises(FastDecodeError, match=f"{key}={value!r} cannot run this model: bitsandbytes 4-bit"):
        EngineCore(model, slots=2, max_cache_len=32, **asked)


def test_hwrun_serve_picks_the_engine_for_4bit_weights(four_bit):
    from hwrun.inference.decision import decide_serving

    plan, model, _ = four_bit
    choice = decide_serving(plan, model, "auto", max_cache_len=64)
    assert choice.engine == "slots" and "bitsandbytes 4-bit weights (Linear4bit)" in choice.reason
    assert "Transformers' continuous batching: 4bit bitsandbytes weights are not supported" in choice.reason
    assert decide_serving(plan, model, "slots", max_cache_len=64).engine == "slots"
    with pytest.raises(EngineStartError, match="--engine transformers cannot serve this model here"):
        decide_serving(plan, model, "transformers", max_cache_len=64)
    compiled = hwrun.plan(plan.model, device="cpu", quantization="4bit", compile=True)
    with pytest.raises(EngineStartError, match="--compile with bitsandbytes 4-bit weights"):
        decide_serving(compiled, model, "auto", max_cache_len=64)


def test_8bit_weights_are_refused_by_the_engine_and_the_server(tiny):
    from hwrun.inference.decision import decide_serving

    plan = hwrun.plan(tiny, device="cpu", quantization="8bit")
    model, _ = hwrun.load(plan)
    with pytest.raises(FastDecodeError, match="LLM.int8.*beside it. Use 4-bit weights"):
        EngineCore(model, slots=2, max_cache_len=32)
    with pytest.raises(EngineStartError, match="no engine can serve this model: hwrun's engine: bitsandbytes 8-bit"):
        decide_serving(plan, model, "auto", max_cache_len=64)
