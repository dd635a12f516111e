"""load() / from_pretrained_kwargs(): safetensors only, no remote code, local paths never ask the Hub,
a Hub id without network gives a clear error, quantized loading gets a BitsAndBytesConfig."""

from __future__ import annotations

import hwrun
import pytest
from hwrun.errors import ModelSourceError
from hwrun.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-load")))


def test_from_pretrained_kwargs_for_a_local_cpu_plan(tiny):
    import torch

    kwargs = hwrun.from_pretrained_kwargs(hwrun.plan(tiny, device="cpu"))
    assert kwargs["use_safetensors"] is True and kwargs["trust_remote_code"] is False
    assert kwargs["local_files_only"] is True
    assert kwargs["dtype"] is torch.float32 and kwargs["device_map"] == "cpu"
    assert kwargs["attn_implementation"] == "sdpa" and "quantization_config" not in kwargs


@pytest.mark.facts("X14", "X15")
def test_quantized_plan_passes_a_bitsandbytes_config(tiny):
    from transformers import BitsAndBytesConfig

    four = hwrun.from_pretrained_kwargs(hwrun.plan(tiny, device="cpu", quantization="4bit"))["quantization_config"]
    assert isinstance(four, BitsAndBytesConfig) and four.load_in_4bit and four.bnb_4bit_quant_type == "nf4"
    eight = hwrun.from_pretrained_kwargs(hwrun.plan(tiny, device="cpu", quantization="8bit"))["quantization_config"]
    assert eight.load_in_8bit


def test_load_returns_an_eval_model_and_left_padding_tokenizer(tiny):
    model, tokenizer = hwrun.load(hwrun.plan(tiny, device="cpu", dtype="bfloat16"))
    import torch

    assert model.dtype == torch.bfloat16 and not model.training and model.device.type == "cpu"
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None


def test_load_refuses_pickle_only_folders(tmp_path, tiny):
    import shutil

    target = tmp_path / "converted"
    shutil.copytree(tiny, target)
    plan = hwrun.plan(str(target), device="cpu")
    (target / "model.safetensors").rename(target / "pytorch_model.bin")
    with pytest.raises(ModelSourceError, match="safetensors only"):
        hwrun.load(plan)


def test_hub_id_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    plan = hwrun.plan("someorg/not-cached-model", device="cpu")
    assert hwrun.from_pretrained_kwargs(plan)["local_files_only"] is True
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE is set") as info:
        hwrun.load(plan)
    assert "someorg/not-cached-model" in str(info.value)


@pytest.mark.facts("G4")
def test_gaudi_env_is_applied_without_overriding_the_user(monkeypatch, fake_gaudi, tiny):
    from hwrun.model.load import apply_env

    fake_gaudi(8)
    plan = hwrun.plan(tiny)
    monkeypatch.delenv("PT_ENABLE_INT64_SUPPORT", raising=False)
    assert apply_env(plan) == {"PT_ENABLE_INT64_SUPPORT": "1"}
    assert apply_env(plan) == {}  # idempotent
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "0")
    assert apply_env(plan) == {}
