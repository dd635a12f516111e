"""bitsandbytes 4-bit on the CPU (issue 43.4): `hwrun generate --quantization 4bit` failed on the shipped tiny model with
`RuntimeError: shape '[128, 5]' is invalid for input of size 704`.

Cause: bitsandbytes 0.50 repacks a 4-bit weight for its AVX512-BF16 CPU kernel at the first inference forward
(`Linear4bit.forward` -> `functional._convert_weight_packed_for_cpu`), reshaping the block absmax to
`[out_features, in_features // blocksize]`; the tiny model's `down_proj` has in_features 352, not a multiple of the
blocksize 64 (704 blocks of the flattened weight, not 128 x 5). hwrun keeps such layers on bitsandbytes' generic 4-bit
path (logged) and the others on the packed one."""

from __future__ import annotations

import importlib.util
import logging
import types

import hwrun
import pytest
from hwrun.model.quantization import bnb_cpu_unpackable, keep_cpu_4bit_layers_unpacked

needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")


def test_the_repacking_rule_names_the_shape_that_breaks_it():
    assert bnb_cpu_unpackable(128, 352, 64) is None  # gate/up: in 128, out 352 (11 x 32)
    assert "in_features 352 is not a multiple of the 4-bit blocksize 64" in bnb_cpu_unpackable(352, 128, 64)
    assert "out_features 100 is not a multiple of 32" in bnb_cpu_unpackable(128, 100, 64)
    assert bnb_cpu_unpackable(2048, 8192, 64) is None  # a 1B Llama's shapes repack


def _layer(in_features, out_features, *, avx512bf16=True, device="cpu", packed=False):
    state = types.SimpleNamespace(shape=(out_features, in_features), blocksize=64, packing_format_for_cpu=packed)
    weight = types.SimpleNamespace(quant_state=state, device=types.SimpleNamespace(type=device))
    return types.SimpleNamespace(weight=weight, support_avx512bf16_for_cpu=avx512bf16)


def test_only_layers_the_repacking_cannot_take_are_kept_unpacked_and_it_is_logged(caplog):
    layers = {"up": _layer(128, 352), "down": _layer(352, 128), "gpu": _layer(352, 128, device="cuda"),
              "no_avx": _layer(352, 128, avx512bf16=False), "done": _layer(352, 128, packed=True)}
    model = types.SimpleNamespace(named_modules=lambda: iter(layers.items()))
    with caplog.at_level(logging.WARNING, logger="hwrun.model.quantization"):
        kept = keep_cpu_4bit_layers_unpacked(model)
    assert kept == {"down": "in_features 352 is not a multiple of the 4-bit blocksize 64"}
    assert layers["down"].support_avx512bf16_for_cpu is False and layers["up"].support_avx512bf16_for_cpu is True
    assert "1 layer(s) stay on bitsandbytes' generic 4-bit path" in caplog.text and "down" in caplog.text


@needs_bnb
@pytest.mark.facts("X14")
def test_the_shipped_tiny_model_generates_in_4bit_on_the_cpu():
    """The command of the issue, through the API: load the shipped model in 4-bit on the CPU and generate."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import has_avx512bf16

    plan = hwrun.plan(device="cpu", quantization="4bit")
    model, tokenizer = hwrun.load(plan)
    result = hwrun.generate(plan, ["hi", "the two tables"], 6, model=model, tokenizer=tokenizer)
    assert result.new_tokens == [6, 6] and all(len(ids) == 6 for ids in result.token_ids)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    down = [m for name, m in layers.items() if name.endswith("down_proj")]
    assert down and len(layers) > len(down)
    if has_avx512bf16():  # where bitsandbytes repacks: down_proj kept generic, the others packed after a forward
        assert all(m.support_avx512bf16_for_cpu is False for m in down)
        others = [m for name, m in layers.items() if not name.endswith("down_proj")]
        assert all(m.weight.quant_state.packing_format_for_cpu for m in others)
