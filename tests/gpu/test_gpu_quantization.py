"""torchao weight-only int8 and int4 in hwrun's graph decoders on a real CUDA GPU (`gpu` marker; issue 43.2): a small
random bf16 Llama quantized on load (int8: Int8Tensor; int4: tinygemm's Int4TilePackedTo4dTensor, group size 128,
which divides every layer width) decodes through hwrun's static-cache decoder and its continuous-batching engine
with `decode="auto"`, each with its CUDA graphs captured (the decision says graphs, not a fallback, and the decoders
hold captured graphs), and the greedy tokens equal Transformers' own loop (`model.generate`) on the same quantized
model. The CPU twin is packages/hwrun/tests/test_hwrun_quant_torchao_cpu.py (no graphs there). Skipped, with the
reason, off CUDA, below compute capability 8.0 (tinygemm) or without torchao. First run 2026-12-06 on an H100
(torch 2.11, torchao 0.18): 4 passed, within the whole gpu suite's 114 s (its own time not taken apart).
"""

from __future__ import annotations

import importlib.util

import pytest
from gpu_marks import ACCEL, GPU_MARKS  # tests/gpu is on sys.path (conftest.py)

pytestmark = [*GPU_MARKS,
              pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed"),
              pytest.mark.skipif(ACCEL is None or ACCEL.kind != "cuda",
                                 reason="torchao's int4 tile-packed layout and these graph checks are CUDA's")]

PROMPTS = ["The king said", "Once upon a time there was", "In the beginning"]
NEW_TOKENS = 12
#: torchao weight class per method on CUDA (hwrun.model.quantization.torchao_config picks the layouts).
WEIGHTS = {"int8-weight-only": "Int8Tensor", "int4-weight-only": "Int4TilePackedTo4dTensor"}
#: A greedy choice may differ from Transformers' only where Transformers' own logits hold a tie within bf16 rounding:
#: the two tokens' logits closer than this share of the largest logit (bf16 keeps 8 significant bits: 1/128 each).
TIE = 1 / 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random Llama (2 layers, hidden 256, intermediate 512, head dim 64, 2 KV heads): every in_features is a
    multiple of 128, the int4 group size hwrun picks for it."""
    from hwrun.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("gpu-quant"), hidden_size=256, heads=4, kv_heads=2,
                                vocab_size=512))


@pytest.fixture(scope="module", params=list(WEIGHTS))
def loaded(request, tiny):
    """(method, plan, model, tokenizer): the tiny model quantized on load in bf16 on the GPU."""
    import hwrun

    method = request.param
    if method == "int4-weight-only" and tuple(ACCEL.capability or (0, 0)) < (8, 0):
        pytest.skip(f"tinygemm int4 needs compute capability >= 8.0; this GPU has {ACCEL.capability}")
    plan = hwrun.plan(tiny, device="cuda", dtype="bfloat16", quantization=method)
    assert plan.quantization == method and plan.dtype == "bfloat16"
    if method == "int4-weight-only":
        assert "tile_packed_to_4d" in plan.reasons["quantization"] and "group size 128" in plan.reasons["quantization"]
    model, tokenizer = hwrun.load(plan)
    assert _weight_types(model) == {WEIGHTS[method]}  # every projection quantized, none skipped
    return method, plan, model, tokenizer


def _weight_types(model) -> set[str]:
    return {type(layer.weight).__name__ for name, layer in model.named_modules() if name.endswith("proj")}


def _captured(model, runner: str) -> list:
    """hwrun's decoders kept for `model` whose CUDA graphs were captured: the static decoder ("static_graphs") or the
    engine ("engine")."""
    from hwrun.inference.decode.static import GraphDecoder
    from hwrun.inference.engine import EngineCore
    from hwrun.inference.generate import decoders_of

    cls = EngineCore if runner == "engine" else GraphDecoder
    return [d for d in decoders_of(model).values() if isinstance(d, cls) and d.use_graphs and d.graphs]


def _transformers_greedy(plan, model, tokenizer, prompt: str) -> list[int]:
    """Transformers' own loop (`model.generate`, through hwrun for the same EOS handling) on the same quantized model,
    one prompt at a time (no padding), greedy."""
    import hwrun

    theirs = hwrun.generate(plan, [prompt], NEW_TOKENS, decode="generate", batching="static", model=model,
                            tokenizer=tokenizer)
    assert theirs.decode == "generate"
    return theirs.token_ids[0]


def _same_or_tie(model, tokenizer, prompt: str, ours: list[int], theirs: list[int]) -> None:
    """`ours` equals `theirs`, or first differs where Transformers' own logits (teacher-forced on its tokens) hold a
    tie within bf16 rounding between the two tokens; anything after that first difference follows another prefix."""
    import torch

    if ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    eos = tokenizer.eos_token_id  # a row that ended sooner chose EOS there
    mine, their = (ours[first] if first < len(ours) else eos), (theirs[first] if first < len(theirs) else eos)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(model.device)
    prefix = torch.cat([ids, torch.tensor([theirs[:first]], device=model.device, dtype=ids.dtype)], dim=1)
    with torch.no_grad():
        logits = model(prefix).logits[0, -1].float()
    gap = (logits[their] - logits[mine]).abs().item()
    assert gap <= TIE * logits.abs().max().item(), (
        f"{prompt!r}: token {first} differs ({mine} vs Transformers' {their}) with a logit gap of {gap:.4f}, not a "
        f"bf16 tie; ours {ours}, theirs {theirs}")


@pytest.mark.parametrize("batching, runner", [("static", "static_graphs"), ("continuous", "engine")])
def test_torchao_weights_run_in_hwruns_cuda_graph_decoders_with_transformers_greedy_tokens(loaded, batching, runner):
    import hwrun

    method, plan, model, tokenizer = loaded
    ours = hwrun.generate(plan, PROMPTS, NEW_TOKENS, decode="auto", batching=batching, model=model,
                          tokenizer=tokenizer)
    assert ours.decode == "graphs" and ours.batching == batching, ours.decode_reason
    assert ours.decode_reason.startswith("CUDA (compile off") and "CUDA graph" in ours.decode_reason
    # the fused step over torchao's weights, unfused (separate quantized products: no dequantized copy)
    assert "fused" in ours.decode_reason and "model forward" not in ours.decode_reason, ours.decode_reason
    assert "model.generate" not in ours.decode_reason  # not a fallback to Transformers' loop
    assert _captured(model, runner), f"no {runner} decoder with captured CUDA graphs for {method}"
    assert _weight_types(model) == {WEIGHTS[method]}  # still quantized after the run
    for prompt, row in zip(PROMPTS, ours.token_ids, strict=True):
        _same_or_tie(model, tokenizer, prompt, row, _transformers_greedy(plan, model, tokenizer, prompt))
