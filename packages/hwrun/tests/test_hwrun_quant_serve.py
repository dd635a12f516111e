"""Serving quantized weights (issue 43.2): a pre-quantized compressed-tensors checkpoint made on the CPU runs hwrun's
engine (the model's own forward, eagerly: `inference/engine/quantized.py`) in `generate` with continuous batching and
in `hwrun serve`, and `hwrun serve --quantize int8-weight-only` answers over HTTP; greedy tokens equal the same
quantized model's `model.generate` / `hwrun.generate` on Transformers' loop. Tiny models built here, CPU only."""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import shutil
from pathlib import Path

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError
from hwrun.serve.config import ServeConfig
from hwrun.serve.server import ServerThread
from hwrun.testing import build_tiny_model

needs_ct = pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None,
                              reason="compressed-tensors not installed")
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
PROMPTS = ["the cat", "a dog and", "once upon a time"]
KEY = "test-key-quant-7a1d"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-quant-serve")))


def compressed_tensors_int8_checkpoint(tiny: str, out: Path) -> str:
    """An int8 per-channel (W8A16) compressed-tensors checkpoint of `tiny`, made on the CPU with compressed-tensors'
    own API (symmetric scales from each row's max, as a weight observer would set them)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=8, type="int", symmetric=True,
                                                                           strategy="channel"))
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                        quantization_status="frozen", format="int-quantized"))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                module.weight_scale.copy_(module.weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127)
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.zero_()
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (source := Path(tiny) / name).exists():
            shutil.copy(source, out)
    return str(out)


@pytest.fixture(scope="module")
def ct_folder(tiny, tmp_path_factory):
    return compressed_tensors_int8_checkpoint(tiny, tmp_path_factory.mktemp("ct") / "ct-int8")


def _greedy(model, tokenizer, prompt: str, n: int) -> list[int]:
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def _proj_dtypes(model) -> set:
    return {layer.weight.dtype for name, layer in model.named_modules() if name.endswith("proj")}


# ---- compressed-tensors: the engine's eager model step ----------------------------------------------------------


@needs_ct
def test_a_compressed_tensors_checkpoint_loads_compressed_and_is_decompressed_by_its_own_hook(ct_folder):
    """What compressed-tensors 0.20 does under Transformers 5.25: the int8 weights load as they are, and its forward
    pre-hook decompresses them in place at the first forward (no compressed int kernels); hwrun says so, in the
    plan and the table, rather than claim that they run compressed."""
    plan = hwrun.plan(ct_folder, device="cpu")
    assert plan.quantization == "compressed-tensors"
    assert "pre-quantized checkpoint (quantization_config.quant_method='compressed-tensors')" in \
        plan.reasons["quantization"]
    assert "decompresses" in plan.reasons["quantization"], plan.reasons["quantization"]
    model, tokenizer = hwrun.load(plan)
    assert _proj_dtypes(model) == {torch.int8} and hasattr(model, "ct_decompress_hook")
    assert hwrun.generate(plan, PROMPTS[:2], 6, model=model, tokenizer=tokenizer).new_tokens == [6, 6]
    assert _proj_dtypes(model) == {torch.float32} and not hasattr(model, "ct_decompress_hook")


@needs_ct
def test_the_engine_batches_compressed_tensors_weights_with_transformers_tokens(ct_folder, caplog):
    """`generate(decode="graphs", batching="continuous")` on the compressed-tensors checkpoint runs hwrun's engine
    (3 prompts through their slots), its model step eagerly, logged with the reason; tokens equal model.generate's."""
    plan = hwrun.plan(ct_folder, device="cpu")
    model, tokenizer = hwrun.load(plan)
    with caplog.at_level(logging.INFO, logger="hwrun.inference.engine.quantized"):
        got = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="graphs",
                             batching="continuous")
    assert got.decode == "graphs" and got.batching == "continuous", got.decode_reason
    assert "model's own forward" in got.decode_reason and "fused step does not apply" in got.decode_reason
    logged = caplog.text
    assert "engine over compressed-tensors weights: model step, eager steps" in logged
    assert "decompresses the checkpoint's weights in place" in logged  # a warning, never silent
    want = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="generate", batching="static")
    assert got.token_ids == want.token_ids
    assert got.token_ids == [_greedy(model, tokenizer, p, n) for p, n in zip(PROMPTS, got.new_tokens, strict=True)]


@needs_ct
@pytest.mark.parametrize("asked", [{"step": "fused"}, {"use_graphs": True}, {"compile_backend": "inductor"}])
def test_what_cannot_run_compressed_tensors_weights_is_refused_naming_it(ct_folder, asked):
    from hwrun.inference.engine import EngineCore

    model, _ = hwrun.load(hwrun.plan(ct_folder, device="cpu"))
    key, value = next(iter(asked.items()))
    with pytest.raises(FastDecodeError, match=f"{key}={value!r} cannot run this model: compressed-tensors weights "
                                              "run the model's own forward, eagerly"):
        EngineCore(model, slots=2, max_cache_len=32, **asked)


@needs_ct
def test_hwrun_serve_picks_the_engine_for_compressed_tensors_weights(ct_folder):
    from hwrun.inference.decision import decide_serving

    plan = hwrun.plan(ct_folder, device="cpu")
    model, _ = hwrun.load(plan)
    choice = decide_serving(plan, model, "auto", max_cache_len=64)
    assert choice.engine == "slots" and "hwrun's engine, eager steps" in choice.reason, choice.reason
    assert "compressed-tensors weights are not supported by the paged-cache runner" in choice.reason


# ---- hwrun serve over HTTP --------------------------------------------------------------------------------------


def _complete(server, prompt: str, n: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", server.state.port, timeout=120)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0}
    connection.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status == 200, text
    return json.loads(text)


def _serve_and_compare(plan, engine_line: str) -> None:
    """Start `hwrun serve` on `plan` (a server thread, the engine in its own process), ask each prompt for 5 greedy
    tokens over HTTP, and compare with `hwrun.generate` on Transformers' loop over a second load of the same plan."""
    config = ServeConfig(port=0, max_concurrency=2, max_queue=4, grace_seconds=5, model_id="tiny",
                         api_key_env="HWRUN_QUANT_SERVE_TEST_KEY", api_key=KEY)
    lines: list[str] = []
    server = ServerThread(config, plan, say=lines.append).start(timeout=240)
    try:
        answers = [_complete(server, prompt, 5) for prompt in PROMPTS]
    finally:
        server.stop()
    assert any(line.startswith("engine: slots (") and engine_line in line for line in lines), lines
    model, tokenizer = hwrun.load(plan)
    want = hwrun.generate(plan, PROMPTS, 5, model=model, tokenizer=tokenizer, decode="generate", batching="static")
    for answer, text, count in zip(answers, want.texts, want.new_tokens, strict=True):
        assert answer["choices"][0]["text"] == text
        assert answer["usage"]["completion_tokens"] == count


@needs_torchao
def test_hwrun_serve_quantize_int8_weight_only_answers_the_quantized_models_tokens(tiny):
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    _serve_and_compare(plan, "hwrun's engine")


@needs_ct
def test_hwrun_serve_answers_a_compressed_tensors_checkpoint(ct_folder):
    _serve_and_compare(hwrun.plan(ct_folder, device="cpu"), "hwrun's engine, eager steps")


def test_eager_reason_names_the_pre_quantized_methods_only():
    """What `inference.decision` can ask before load (the plan's value) or after (the model's quantizer)."""
    from hwrun.inference.engine.quantized import eager_reason

    for method in ("awq", "gptq", "auto-round", "compressed-tensors", "fp8"):
        assert eager_reason(quantization=method).startswith(f"{method} weights run the model's own forward, eagerly")
    for value in (None, "int8-weight-only", "int4-weight-only", "4bit", "8bit"):
        assert eager_reason(quantization=value) is None
    assert eager_reason(torch.nn.Linear(2, 2)) is None  # no quantizer: nothing to say
