"""Quantize on load with torchao on the CPU, generate with the result, and load the pre-quantized checkpoints made
here (torchao and bitsandbytes make them on the CPU), all through hwrun's plan/load/generate (issue 43.2, 43.5).
compressed-tensors checkpoints made here: test_hwrun_quant_serve.py."""

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
@pytest.mark.parametrize("method", ["int8-weight-only", "int4-weight-only"])
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_hwrun_graph_loops_run_torchao_weights_as_they_are(tiny, method, batching):
    """Both of hwrun's loops (the static-cache decoder and the engine) run torchao's tensor-subclass weights through
    the fused step, unfused (q/k/v and gate/up as separate torchao products: no dequantized copies), giving
    Transformers' greedy tokens on the same quantized model (issue 43.2)."""
    plan = hwrun.plan(tiny, device="cpu", quantization=method)
    model, tokenizer = hwrun.load(plan)
    # Transformers' paged-cache runner (generate_batch) refuses torchao weights: its static loop is the reference
    want = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="generate", batching="static")
    got = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="graphs", batching=batching)
    assert got.decode == "graphs" and got.batching == batching, got.decode_reason
    assert "fused" in got.decode_reason and "model forward" not in got.decode_reason, got.decode_reason
    assert _weight_types(model) != {"Parameter"}  # still quantized after the run: no dequantized copy was swapped in
    assert got.token_ids == want.token_ids


@needs_torchao
def test_the_compiled_engine_runs_torchao_weights(tiny):
    """The engine's model step compiled by Inductor over torchao weights (the H100 quantization run of 2026-12-06
    failed here at 64 prompts: 'aliased inputs that are mutated in the graph ... a tensor subclass', because the
    slot cache held a view of the engine's positions made outside the step); tokens equal Transformers' loop."""
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only", compile=True)
    model, tokenizer = hwrun.load(plan)
    want = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="generate", batching="static")
    got = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="graphs", batching="continuous")
    assert got.decode == "graphs" and got.batching == "continuous"
    assert got.token_ids == want.token_ids


@needs_torchao
def test_the_engine_serves_torchao_weights(tiny):
    from hwrun.inference.decision import decide_serving

    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    model, _ = hwrun.load(plan)
    decision = decide_serving(plan, model, "slots")
    assert decision.engine == "slots" and "quantized weights" not in decision.reason, decision.reason


@needs_bnb
def test_graph_decode_is_refused_for_bitsandbytes_weights_with_the_reason(tmp_path_factory):
    from hwrun.errors import GenerateError

    tiny = str(build_tiny_model(tmp_path_factory.mktemp("tiny-bnb-refused"), hidden_size=128, heads=4, kv_heads=2))
    plan = hwrun.plan(tiny, device="cpu", quantization="8bit")
    with pytest.raises(GenerateError, match="bitsandbytes weights \\(8bit: Linear4bit/Linear8bitLt layers\\)"):
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


@needs_torchao
def test_a_torchao_int4_model_made_on_the_cpu_cannot_be_saved(tiny, tmp_path):
    """The int8 reload test above cannot be copied for int4 on the CPU: torchao 0.18's safetensors support (the only
    format Transformers 5.25 saves) has no Int4OpaqueTensor, the CPU's int4 layout, and the other int4 layouts cannot
    be made here (plain needs mslk, tile_packed_to_4d a CUDA GPU, plain_int32 an XPU). So no pre-quantized int4
    checkpoint can be made and reloaded on this CPU; the README says so. When torchao saves Int4OpaqueTensor, this
    test fails: replace it with the reload test (plan pre-quantized, reload Int4OpaqueTensor, the same tokens)."""
    plan = hwrun.plan(tiny, device="cpu", quantization="int4-weight-only")
    model, tokenizer = hwrun.load(plan)
    assert _weight_types(model) == {"Int4OpaqueTensor"}
    assert hwrun.generate(plan, PROMPTS, 4, model=model, tokenizer=tokenizer).new_tokens == [4, 4]
    with pytest.raises(ValueError, match="Unsupported tensor type: .*Int4OpaqueTensor"):
        model.save_pretrained(tmp_path / "int4", safe_serialization=True)


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


@needs_torchao
@pytest.mark.parametrize("method", ["int8-weight-only", "int4-weight-only"])
def test_the_fused_step_reads_torchao_weights_unfused_without_copies(tiny, method):
    """The fused step over torchao weights keeps q/k/v and gate/up as the model's own quantized tensors (the same
    objects: nothing concatenated or dequantized), and its logits equal the model's own forward's."""
    import torch
    from hwrun.inference.decode.fused_step import (
        FusedLlamaStep,
        fused_step_support,
        torchao_weights,
    )

    plan = hwrun.plan(tiny, device="cpu", quantization=method)
    model, _ = hwrun.load(plan)
    assert torchao_weights(model) and fused_step_support(model) is None
    step = FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert step.unfused and step.fused_bytes == 0
    held = (*step.layers[0]["qkv"], *step.layers[0]["gate_up"])
    own = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight)
    assert all(a is b for a, b in zip(held, own, strict=True))
    assert step.lm_head is model.lm_head.weight
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.inference_mode():
        got = step(ids, torch.arange(5)[None, :])
        want = model(ids).logits[:, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_other_quantized_layers_keep_the_model_forward():
    """A quantized model whose layers are not torchao tensors on plain Linears (bitsandbytes' modules, ...) is not
    the fused step's: `torchao_weights` says no (checked on stand-ins, by class, without those libraries)."""
    import torch
    from hwrun.inference.decode.fused_step import torchao_weights

    class Linear4bit(torch.nn.Linear):
        pass

    Linear4bit.__module__ = "bitsandbytes.nn.modules"
    model = torch.nn.Sequential(Linear4bit(4, 4))
    assert not torchao_weights(model)
    assert not torchao_weights(torch.nn.Sequential(torch.nn.Linear(4, 4)))  # nothing of torchao's at all


@needs_torchao
def test_the_fused_step_runs_torchao_weights_with_projection_biases(tmp_path):
    """Qwen2's q/k/v carry biases: the unfused products add each projection's own bias (logits equal the model's
    forward; the engine's greedy tokens equal Transformers' loop)."""
    import torch
    from hwrun.inference.decode.fused_step import FusedLlamaStep
    from hwrun.testing.families import build_tiny_family

    folder = str(build_tiny_family("qwen2", tmp_path / "qwen2"))
    plan = hwrun.plan(folder, device="cpu", quantization="int8-weight-only")
    model, tokenizer = hwrun.load(plan)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    step = FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    assert step.unfused and all(b is not None for b in step.layers[0]["qkv_bias"])
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(step(ids, torch.arange(5)[None, :]), model(ids).logits[:, -1], rtol=1e-4,
                                   atol=1e-4)
    want = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="generate", batching="static")
    got = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="graphs", batching="continuous")
    assert "fused" in got.decode_reason and got.token_ids == want.token_ids
