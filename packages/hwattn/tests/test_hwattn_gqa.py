"""hwattn's GQA rule side by side with Transformers' own `use_gqa_in_sdpa`, on the same inputs."""

from __future__ import annotations

import itertools

import pytest
import torch
from hwattn import AttentionEnvironment, native_gqa, resolve_attention, uses_native_gqa
from hwenv import Accelerator, at_least

KINDS = ("xpu", "mps", "cuda", "rocm", "cpu", "hpu")
TORCH_VERSIONS = ("2.7.1", "2.8.0", "2.12.0", "2.13.0")
HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (512, 512), (192, 128))


def _transformers_rule(monkeypatch, kind, version):
    """Transformers' `use_gqa_in_sdpa`, with the device/torch facts it read at import time set to ours."""
    from transformers.integrations import sdpa_attention as module

    monkeypatch.setattr(module, "_is_torch_xpu_available", kind == "xpu")
    monkeypatch.setattr(module, "_is_torch_mps_available", kind == "mps")
    monkeypatch.setattr(module, "_is_torch_greater_or_equal_than_2_8", at_least(version, (2, 8)))
    monkeypatch.setattr(module, "_is_torch_greater_or_equal_than_2_13", at_least(version, (2, 13)))
    return module.use_gqa_in_sdpa


@pytest.mark.facts("X6")
def test_native_gqa_agrees_with_use_gqa_in_sdpa(monkeypatch):
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    checked = 0
    for kind, version in itertools.product(KINDS, TORCH_VERSIONS):
        rule = _transformers_rule(monkeypatch, kind, version)
        for (kd, vd), has_mask in itertools.product(HEAD_DIMS, (False, True)):
            key, value = torch.zeros(1, 2, 3, kd), torch.zeros(1, 2, 3, vd)
            theirs = rule(mask if has_mask else None, key, value)
            ours = native_gqa(kind, version, has_mask=has_mask, key_head_dim=kd, value_head_dim=vd)
            assert ours == theirs, (kind, version, kd, vd, has_mask)
            checked += 1
    assert checked == len(KINDS) * len(TORCH_VERSIONS) * len(HEAD_DIMS) * 2


@pytest.mark.facts("X6")
def test_sdpa_auto_decision_agrees_on_real_cpu_tensors():
    from transformers.integrations.sdpa_attention import use_gqa_in_sdpa

    q, k, v = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    assert uses_native_gqa(q, k, v, None) == use_gqa_in_sdpa(None, k, v) is True
    assert uses_native_gqa(q, k, v, mask) == use_gqa_in_sdpa(mask, k, v) is False


@pytest.mark.facts("X6")
@pytest.mark.parametrize("version", TORCH_VERSIONS)
def test_resolve_gqa_agrees_on_xpu_and_mps(monkeypatch, version):
    env = AttentionEnvironment(kernels_available=True)
    for kind in ("xpu", "mps"):
        rule = _transformers_rule(monkeypatch, kind, version)
        key = torch.zeros(1, 2, 3, 64)
        choice = resolve_attention(Accelerator(kind, torch_version=version), environment=env)
        # On XPU/MPS the answer does not depend on the mask, so it is fixed at load time.
        assert choice.gqa_native == rule(None, key, key) == rule(torch.ones(1, 1, 3, 3), key, key)


def test_resolve_gqa_on_cuda_is_per_call_like_transformers(monkeypatch, make_config):
    rule = _transformers_rule(monkeypatch, "cuda", "2.8.0")
    key = torch.zeros(1, 2, 3, 16)
    assert rule(None, key, key) != rule(torch.ones(1, 1, 3, 3), key, key)  # the mask decides per call
    choice = resolve_attention(Accelerator("cuda", torch_version="2.8.0"), model_config=make_config(),
                               environment=AttentionEnvironment(kernels_available=True))
    assert choice.gqa_native is None and "without an attention mask" in choice.reason
