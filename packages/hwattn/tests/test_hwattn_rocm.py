"""ROCm (AMD GPUs) as its own kind: named as AMD, SDPA by default, flash_attention_2 through the flash-attn
package or Transformers' ROCm kernel, FlashAttention-3/4 refused, hub kernels keyed 'rocm'."""

from __future__ import annotations

import logging

import hwattn
import pytest
from hwattn import (
    AttentionEnvironment,
    AttentionUnsupportedError,
    KernelsMissingError,
    resolve_attention,
)
from hwattn.names import ROCM_FLASH_KERNEL_REPO
from hwenv import Accelerator

MI300X = Accelerator("rocm", capability=(9, 4), torch_version="2.8.0")
KERNELS = AttentionEnvironment(kernels_available=True)
NO_KERNELS = AttentionEnvironment(kernels_available=False)
FLASH_ATTN = AttentionEnvironment(kernels_available=False, flash_packages=frozenset({"flash_attention_2"}))


def test_rocm_is_named_amd_and_defaults_to_sdpa(make_config):
    assert MI300X.name == "AMD GPU (ROCm)" and MI300X.device_type == "cuda"
    choice = resolve_attention(MI300X, model_config=make_config(), environment=KERNELS)
    assert choice.implementation == "sdpa" and "X6" in choice.reason
    assert choice.gqa_native is None and "SDPA on rocm uses enable_gqa only in calls without an attention mask" \
        in choice.reason  # Transformers' CUDA rule: a HIP build's device is cuda
    assert resolve_attention(MI300X, "eager", environment=KERNELS).implementation == "eager"


def test_flash_attention_2_is_the_package_or_transformers_rocm_kernel():
    hub = resolve_attention(MI300X, "flash_attention_2", environment=KERNELS)
    assert hub.implementation == hub.kernel_repo == ROCM_FLASH_KERNEL_REPO == "kernels-community/aiter-flash-attn"
    assert hub.gqa_native is True and "compute capability" not in hub.reason  # no CUDA capability rule on AMD
    package = resolve_attention(MI300X, "flash_attention_2", environment=FLASH_ATTN)
    assert package.implementation == "flash_attention_2" and package.kernel_repo is None
    with pytest.raises(KernelsMissingError, match=r"AMD GPU \(ROCm\) needs the flash-attn package or the hub "
                                                  r"kernel 'kernels-community/aiter-flash-attn'.*hwattn\[kernels\]"):
        resolve_attention(MI300X, "flash_attention_2", environment=NO_KERNELS)


@pytest.mark.facts("X8")
@pytest.mark.parametrize("name", ["flash_attention_3", "flash_attention_4"])
@pytest.mark.parametrize("fallback", [False, True])
def test_flash_attention_3_and_4_are_refused_naming_the_alternatives(name, fallback):
    for env in (KERNELS, NO_KERNELS, AttentionEnvironment(True, frozenset({name}))):
        with pytest.raises(AttentionUnsupportedError) as info:
            resolve_attention(MI300X, name, fallback=fallback, environment=env)
        message = str(info.value)
        assert message.startswith(f"{name!r} runs only on NVIDIA GPUs (X8), not on AMD GPU (ROCm). On ROCm use "
                                  "'flash_attention_2' (the flash-attn package, else the hub kernel "
                                  "kernels-community/aiter-flash-attn")
        assert "'sdpa'" in message and "'eager'" in message


def test_hub_kernels_follow_their_rocm_builds():
    with pytest.raises(AttentionUnsupportedError, match=r"flash-attn2 ships builds for cuda, xpu only.*"
                                                        r"'flash_attention_2'"):
        resolve_attention(MI300X, "kernels-community/flash-attn2", fallback=True, environment=KERNELS)
    with pytest.raises(AttentionUnsupportedError, match="vllm-flash-attn3 ships builds for cuda only"):
        resolve_attention(MI300X, "kernels-community/vllm-flash-attn3", environment=KERNELS)
    aiter = resolve_attention(MI300X, "kernels-community/aiter-flash-attn", environment=KERNELS)
    assert aiter.kernel_repo == ROCM_FLASH_KERNEL_REPO and "does not list" not in aiter.reason
    other = resolve_attention(MI300X, "someorg/my-attn", environment=KERNELS)
    assert "has no rocm build" in other.reason
    for elsewhere in (Accelerator("xpu"), Accelerator("cuda", capability=(9, 0))):
        with pytest.raises(AttentionUnsupportedError, match="aiter-flash-attn ships builds for rocm only"):
            resolve_attention(elsewhere, "kernels-community/aiter-flash-attn", environment=KERNELS)


def test_decision_tables_have_rocm():
    row = next(line for line in hwattn.decision_table().splitlines() if line.startswith("| ROCm gfx942 (MI300X) |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
    assert cells[:4] == ["`sdpa` (GQA per call)", "`eager` (KV repeated)", "`sdpa` (GQA per call)",
                         "`kernels-community/aiter-flash-attn` (GQA native)"]
    assert cells[4:] == ["error `AttentionUnsupportedError`"] * 3  # FA3, FA4, kernels-community/flash-attn2
    software = hwattn.software_table().splitlines()
    assert software[0].endswith("| ROCm: `flash_attention_2` |")
    assert software[-1].endswith("| `flash_attention_2` (GQA native) |")  # no kernels, flash-attn installed


def test_load_kwargs_narrows_a_mapping_to_the_rocm_key(caplog):
    mapping = {"RMSNorm": {"rocm": "kernels-community/rmsnorm:RMSNorm", "cuda": "kernels-community/liger:Norm"}}
    kwargs = hwattn.load_kwargs(MI300X, "sdpa", mapping=mapping)
    assert kwargs["use_kernels"] is True
    assert kwargs["kernel_config"].kernel_mapping == {"RMSNorm": {"rocm": "kernels-community/rmsnorm:RMSNorm"}}
    caplog.set_level(logging.WARNING, logger="hwattn.loading")
    cuda_only = hwattn.load_kwargs(MI300X, "sdpa", mapping={"RMSNorm": {"cuda": "kernels-community/liger:Norm"}})
    assert cuda_only["kernel_config"].kernel_mapping == {}
    assert any("no 'rocm' entry for RMSNorm" in r.getMessage() for r in caplog.records)


def test_kernel_plan_reads_the_rocm_entries(tiny_config):
    import torch
    from transformers import LlamaForCausalLM
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config).eval()
    defaults = get_kernel_mapping_transformers()
    plan = hwattn.kernel_plan(model, MI300X)
    assert plan.device == "rocm" and plan.used
    replaced = {k.layer for k in plan.replaced}
    assert replaced and all("rocm" in defaults[layer] for layer in replaced)
    assert all(k.source == "transformers" for k in plan.replaced)
    kept = {k.layer: k.reason for k in plan.unchanged}
    assert all("rocm" not in defaults.get(layer, {}) for layer in kept)
    assert "ROCm capability unknown" in hwattn.kernel_plan(model, Accelerator("rocm")).reason
    mine = hwattn.kernel_plan(model, MI300X, {"RMSNorm": {"rocm": "kernels-community/rmsnorm:RMSNorm"}})
    assert {(k.repo, k.source) for k in mine.replaced if k.layer == "RMSNorm"} == {
        ("kernels-community/rmsnorm", "mapping")}
