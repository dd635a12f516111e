"""hwattn.sdpa against the eager reference for MHA/GQA/MQA, causal and masked, fp32 and bf16, both paths."""

from __future__ import annotations

import hwattn
import pytest
import torch
from hwattn import ShapeError, eager_attention, sdpa

SHAPES = {"mha": (4, 4), "gqa": (8, 2), "mqa": (8, 1)}
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _inputs(heads, kv_heads, dtype, q_len=7, kv_len=7, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, q_len, dim, generator=generator).to(dtype)
    k = torch.randn(2, kv_heads, kv_len, dim, generator=generator).to(dtype)
    v = torch.randn(2, kv_heads, kv_len, dim, generator=generator).to(dtype)
    return q, k, v


def _masks(q_len=7, kv_len=7):
    keep = torch.ones(2, 1, q_len, kv_len, dtype=torch.bool).tril()
    keep[0, :, :, :2] = False  # left padding of the first sequence
    keep[0, :, :, 2] = True  # every query row keeps at least one key
    additive = torch.zeros(2, 1, q_len, kv_len).masked_fill(~keep, float("-inf"))
    return {"bool": keep, "float": additive}


@pytest.mark.facts("X6")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
@pytest.mark.parametrize("enable_gqa", [None, True, False], ids=["auto", "native", "repeat"])
@pytest.mark.parametrize("case", ["causal", "bool-mask", "float-mask", "full", "decode"])
def test_sdpa_matches_eager(dtype, shape, enable_gqa, case):
    heads, kv_heads = SHAPES[shape]
    q_len = 1 if case == "decode" else 7
    q, k, v = _inputs(heads, kv_heads, dtype, q_len=q_len)
    kwargs = {}
    if case == "causal":
        kwargs["is_causal"] = True
    elif case.endswith("mask"):
        mask = _masks()[case.split("-")[0]]
        kwargs["attn_mask"] = mask if mask.dtype == torch.bool else mask.to(dtype)
    got = sdpa(q, k, v, enable_gqa=enable_gqa, **kwargs)
    want = eager_attention(q, k, v, **kwargs)
    assert got.shape == (2, heads, q_len, 16) and got.dtype == dtype
    error = (got.float() - want.float()).abs().max().item()
    assert error <= TOLERANCE[dtype], error


def test_scale_is_honoured():
    q, k, v = _inputs(8, 2, torch.float32)
    got = sdpa(q, k, v, scale=0.05, enable_gqa=True)
    assert torch.allclose(got, eager_attention(q, k, v, scale=0.05), atol=2e-5)
    assert not torch.allclose(got, sdpa(q, k, v), atol=1e-3)


def test_both_paths_really_differ_in_what_reaches_torch(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append((k.shape[1], kwargs.get("enable_gqa", False)))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = _inputs(8, 2, torch.float32)
    sdpa(q, k, v, enable_gqa=True)
    sdpa(q, k, v, enable_gqa=False)
    sdpa(q, k, v)  # CPU, no mask: native (Transformers' rule)
    sdpa(q, k, v, attn_mask=_masks()["bool"])  # CPU with a mask: repeat
    assert calls == [(2, True), (8, False), (2, True), (8, False)]


def test_repeat_kv_matches_transformers():
    from transformers.integrations.sdpa_attention import repeat_kv

    _, k, _ = _inputs(8, 2, torch.float32)
    assert torch.equal(hwattn.repeat_kv(k, 4), repeat_kv(k, 4))
    assert torch.equal(hwattn.repeat_kv(k, 4), k.repeat_interleave(4, dim=1))


@pytest.mark.parametrize("q_shape, kv_shape, pattern", [
    ((2, 6, 5, 16), (2, 4, 5, 16), "multiple of KV heads"),
    ((2, 4, 5, 16), (2, 4, 5, 8), "head dim"),
    ((2, 5, 16), (2, 4, 5, 16), "4-D"),
])
def test_bad_shapes(q_shape, kv_shape, pattern):
    with pytest.raises(ShapeError, match=pattern):
        sdpa(torch.zeros(q_shape), torch.zeros(kv_shape), torch.zeros(kv_shape))


def test_bad_enable_gqa():
    q, k, v = _inputs(8, 2, torch.float32)
    with pytest.raises(ShapeError, match="enable_gqa"):
        sdpa(q, k, v, enable_gqa="yes")
