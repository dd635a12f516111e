"""Quantize on load with torchao on the CPU, generate with the result, and load the pre-quantized checkpoints made
here (torchao and bitsandbytes save them on the CPU), all through hwrun's plan/load/generate (issue 43.2, 43.5)."""

from __future__ import annotations

import importlib.util
import json

import hwrun
import pytest
from hwrun.testing import build_tiny_model

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")
PROMPTS = ["the cat", "a dog and"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-torchao")))


@pytest.fixture(scope="module")
def reference(tiny):
    plan = hwrun.plan(tiny, device="cpu")
    return hwrun.generate(plan, PROMPTS, 6).token_ids


def _weight_types(model) -> set[str]:
    return {type(layer.weight).__name__ for name, layer in model.named_modules() if name.endswith("proj")}


@needs_torchao
@pytest.mark.parametrize("method, tensor", [("int8-weight-only", "Int8Tensor"), ("int8-dynamic", "Int8Tensor"),
                                            ("int4-weight-only", "Int4OpaqueTensor")])
def test_quantize_on_load_and_generate(tiny, reference, method, tensor):
    plan = hwrun.plan(tiny, device="cpu", quantization=method)
    model, tokenizer = hwrun.load(plan)
    assert model.is_quantized and _weight_types(model) == {tensor}  # every projection quantized, none skipped
    result = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer)
    assert result.new_tokens == [6, 6] and result.decode == "generate"
    if method.startswith("int8"):  # int8 per-channel keeps the tiny model's peaked greedy choices
        assert result.token_ids == reference


@needs_torchao
def test_graph_decode_is_refused_for_torchao_weights_with_the_reason(tiny):
    from hwrun.errors import GenerateError

    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    with pytest.raises(GenerateError, match="torchao weights \\(int8-weight-only: tensor-subclass weights\\)"):
        hwrun.generate(plan, PROMPTS, 2, decode="graphs")


@needs_torchao
def test_a_torchao_checkpoint_saved_here_loads_pre_quantized(tiny, reference, tmp_path):
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    model, tokenizer = hwrun.load(plan)
    saved = tmp_path / "int8"
    model.save_pretrained(saved, safe_serialization=True)
    tokenizer.save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text())["quantization_config"]["quant_method"] == "torchao"

    again = hwrun.plan(str(saved), device="cpu")  # nothing requested: the checkpoint's config is planned
    assert again.quantization == "int8-weight-only" and "pre-quantized checkpoint" in again.reasons["quantization"]
    assert "quantization_config" not in hwrun.from_pretrained_kwargs(again)
    reloaded, tok = hwrun.load(again)
    assert _weight_types(reloaded) == {"Int8Tensor"}
    assert hwrun.generate(again, PROMPTS, 6, model=reloaded, tokenizer=tok).token_ids == reference


@needs_bnb
def test_a_bitsandbytes_4bit_checkpoint_saved_here_loads_pre_quantized(tmp_path_factory):
    import bitsandbytes as bnb

    # hidden 96: q/k/v/gate/up in_features 96, not a multiple of bitsandbytes' blocksize 64 (issue 43.4's rule)
    tiny = str(build_tiny_model(tmp_path_factory.mktemp("tiny-bnb"), hidden_size=96, heads=4, kv_heads=2))
    plan = hwrun.plan(tiny, device="cpu", quantization="4bit")
    model, tokenizer = hwrun.load(plan)
    saved = tmp_path_factory.mktemp("bnb4") / "model"
    model.save_pretrained(saved, safe_serialization=True)
    tokenizer.save_pretrained(saved)
    again = hwrun.plan(str(saved), device="cpu")
    assert again.quantization == "4bit" and "pre-quantized checkpoint" in again.reasons["quantization"]
    reloaded, tok = hwrun.load(again)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in reloaded.modules())
    assert hwrun.generate(again, PROMPTS, 4, model=reloaded, tokenizer=tok).new_tokens == [4, 4]
