"""resolve_attention: every rule of the issue, on explicit Accelerators and on hwenv.testing fakes."""

from __future__ import annotations

import logging

import hwattn
import pytest
from hwattn import (
    AttentionEnvironment,
    AttentionUnsupportedError,
    KernelsMissingError,
    UnknownAttentionError,
    resolve_attention,
)
from hwenv import Accelerator

KERNELS = AttentionEnvironment(kernels_available=True, torch_version="2.8.0")
NO_KERNELS = AttentionEnvironment(kernels_available=False, torch_version="2.8.0")
WITH_FA = AttentionEnvironment(kernels_available=True, torch_version="2.8.0",
                               flash_packages=frozenset({"flash_attention_2", "flash_attention_3", "flash_attention_4"}))
XPU = Accelerator("xpu", torch_version="2.8.0")
H200 = Accelerator("cuda", capability=(9, 0), torch_version="2.8.0")
A100 = Accelerator("cuda", capability=(8, 0), torch_version="2.8.0")
T4 = Accelerator("cuda", capability=(7, 5), torch_version="2.8.0")
HPU = Accelerator("hpu", torch_version="2.8.0")
CPU = Accelerator("cpu", torch_version="2.8.0")
MPS = Accelerator("mps", torch_version="2.8.0")


@pytest.mark.facts("X6")
@pytest.mark.parametrize("accel", [XPU, H200, HPU, CPU, MPS], ids=lambda a: a.kind)
def test_auto_is_sdpa_everywhere(accel):
    choice = resolve_attention(accel, environment=KERNELS)
    assert (choice.implementation, choice.requested, choice.kernel_repo, choice.fallback) == ("sdpa", "auto", None, False)
    assert "X6" in choice.reason


@pytest.mark.parametrize("name", ["eager", "sdpa"])
@pytest.mark.parametrize("accel", [XPU, H200, HPU, CPU], ids=lambda a: a.kind)
def test_eager_and_sdpa_pass_through(accel, name):
    choice = resolve_attention(accel, name, environment=NO_KERNELS)
    assert choice.implementation == name and choice.kernel_repo is None


@pytest.mark.facts("X7")
def test_fa2_on_xpu_is_the_hub_kernel():
    choice = resolve_attention(XPU, "flash_attention_2", environment=WITH_FA)
    assert choice.implementation == choice.kernel_repo == "kernels-community/flash-attn2"
    assert choice.gqa_native is True and "X7" in choice.reason


@pytest.mark.facts("X7")
def test_fa2_on_xpu_without_kernels_says_how_to_install():
    with pytest.raises(KernelsMissingError, match=r'pip install "hwattn\[kernels\]"') as info:
        resolve_attention(XPU, "flash_attention_2", environment=NO_KERNELS)
    assert isinstance(info.value, ImportError) and "flash_attention_2" in str(info.value)


def test_fa2_on_cuda_kernel_unless_flash_attn_installed():
    assert resolve_attention(H200, "flash_attention_2", environment=KERNELS).implementation == "kernels-community/flash-attn2"
    package = resolve_attention(H200, "flash_attention_2", environment=WITH_FA)
    assert package.implementation == "flash_attention_2" and package.kernel_repo is None
    no_kernel = AttentionEnvironment(kernels_available=False, flash_packages=frozenset({"flash_attention_2"}))
    assert resolve_attention(H200, "flash_attention_2", environment=no_kernel).implementation == "flash_attention_2"
    with pytest.raises(KernelsMissingError, match=r"flash-attn.*hwattn\[kernels\]"):
        resolve_attention(H200, "flash_attention_2", environment=NO_KERNELS)


@pytest.mark.facts("X8")
@pytest.mark.parametrize("name", ["flash_attention_3", "flash_attention_4"])
def test_fa3_fa4_on_xpu_raise_naming_device_and_alternatives(name):
    for fallback in (False, True):
        with pytest.raises(AttentionUnsupportedError) as info:
            resolve_attention(XPU, name, environment=KERNELS, fallback=fallback)
        message = str(info.value)
        assert name in message and "XPU" in message and "NVIDIA" in message
        assert "'flash_attention_2'" in message and "'sdpa'" in message and "X8" in message


@pytest.mark.facts("X8")
def test_fa3_fa4_on_cuda_follow_compute_capability():
    assert resolve_attention(H200, "flash_attention_3", environment=KERNELS).implementation == "kernels-community/vllm-flash-attn3"
    assert resolve_attention(H200, "flash_attention_4", environment=KERNELS).implementation == "kernels-community/flash-attn4"
    assert resolve_attention(A100, "flash_attention_3", environment=KERNELS).implementation == "kernels-community/vllm-flash-attn3"
    assert resolve_attention(H200, "flash_attention_4", environment=WITH_FA).implementation == "flash_attention_4"
    with pytest.raises(AttentionUnsupportedError, match=r">= 9\.0.*8\.0.*'flash_attention_3'"):
        resolve_attention(A100, "flash_attention_4", environment=KERNELS)
    with pytest.raises(AttentionUnsupportedError, match=r">= 8\.0.*7\.5"):
        resolve_attention(T4, "flash_attention_3", environment=WITH_FA)
    with pytest.raises(AttentionUnsupportedError, match=r">= 9\.0"):
        resolve_attention(T4, "kernels-community/flash-attn4", environment=KERNELS)


def test_unknown_capability_is_said_in_the_reason():
    choice = resolve_attention(Accelerator("cuda"), "flash_attention_4", environment=KERNELS)
    assert "capability unknown" in choice.reason


@pytest.mark.parametrize("accel", [CPU, HPU, MPS], ids=lambda a: a.kind)
@pytest.mark.parametrize("name", ["flash_attention_2", "flash_attention_3", "flash_attention_4",
                                  "kernels-community/flash-attn2"])
def test_flash_on_cpu_gaudi_mps_raise_without_fallback(accel, name):
    with pytest.raises(AttentionUnsupportedError, match="fallback=True") as info:
        resolve_attention(accel, name, environment=KERNELS)
    assert name in str(info.value) and accel.name in str(info.value)


@pytest.mark.parametrize("accel", [CPU, HPU], ids=lambda a: a.kind)
def test_fallback_true_gives_sdpa_logged_once(accel, caplog):
    caplog.set_level(logging.WARNING, logger="hwattn.resolve")
    first = resolve_attention(accel, "flash_attention_2", fallback=True, environment=KERNELS)
    second = resolve_attention(accel, "flash_attention_2", fallback=True, environment=KERNELS)
    assert first == second
    assert (first.implementation, first.fallback, first.requested) == ("sdpa", True, "flash_attention_2")
    assert "fallback=True -> sdpa" in first.reason and accel.name in first.reason
    records = [r for r in caplog.records if "attention fallback" in r.getMessage()]
    assert len(records) == 1 and accel.name in records[0].getMessage()


def test_fallback_does_not_touch_decisions_that_work(caplog):
    caplog.set_level(logging.WARNING, logger="hwattn.resolve")
    choice = resolve_attention(XPU, "flash_attention_2", fallback=True, environment=KERNELS)
    assert choice.fallback is False and choice.implementation == "kernels-community/flash-attn2"
    assert not caplog.records


@pytest.mark.parametrize("bad, pattern", [
    ("flash-attention-2", r"'flash-attention-2'.*Did you mean 'flash_attention_2'"),
    (None, r"None.*'auto'"),
    ("", r"not an attention implementation"),
    (2, r"must be a string"),
    ("paged|sdpa", r"deprecated.*'sdpa'"),
    ("kernels-community/flash-attn2:a:b", r"not an attention implementation"),
])
def test_unknown_names_raise_listing_valid_ones(bad, pattern):
    with pytest.raises(UnknownAttentionError, match=pattern) as info:
        resolve_attention(CPU, bad, environment=KERNELS)
    assert isinstance(info.value, ValueError)
    for valid in ("'auto'", "'eager'", "'sdpa'", "'flash_attention_2'", "kernels-community/flash-attn2"):
        assert valid in str(info.value)


def test_names_are_the_installed_transformers_names():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert set(hwattn.valid_names()) == {"auto", "eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    for name in ALL_ATTENTION_FUNCTIONS.valid_keys():
        hwattn.check_name(name)


def test_kernel_strings_follow_transformers_is_kernel():
    from transformers.integrations.hub_kernels import is_kernel

    for text in ("kernels-community/flash-attn2", "org/repo@v1", "org/repo:fn", "org/repo@main:fn",
                 "flash-attn2", "org/repo/sub", "a:b/c", "org/repo:a:b", "/abs/path"):
        assert hwattn.is_kernel_string(text) == is_kernel(text), text


def test_kernel_repo_tables_match_transformers():
    from hwattn.names import FLASH_KERNEL_DEVICES, FLASH_KERNEL_REPO
    from transformers.modeling_flash_attention_utils import (
        FLASH_ATTN_KERNEL_DEVICES,
        FLASH_ATTN_KERNEL_FALLBACK,
    )

    assert FLASH_KERNEL_REPO == FLASH_ATTN_KERNEL_FALLBACK  # non-ROCm platform here
    for repo, devices in FLASH_KERNEL_DEVICES.items():
        assert FLASH_ATTN_KERNEL_DEVICES[repo] == devices


def test_hub_kernel_strings():
    assert resolve_attention(XPU, "kernels-community/flash-attn2", environment=KERNELS).kernel_repo == "kernels-community/flash-attn2"
    with pytest.raises(AttentionUnsupportedError, match="cuda only"):
        resolve_attention(XPU, "kernels-community/vllm-flash-attn3", environment=KERNELS)
    other = resolve_attention(H200, "someorg/my-attn@v2:attn", environment=KERNELS)
    assert other.kernel_repo == "someorg/my-attn" and "allow_all_kernels=True" in other.reason
    assert other.gqa_native is None
    with pytest.raises(KernelsMissingError, match=r"hwattn\[kernels\]"):
        resolve_attention(H200, "someorg/my-attn", environment=NO_KERNELS)


def test_flex_and_paged_eager_pass_through():
    assert resolve_attention(CPU, "flex_attention", environment=KERNELS).implementation == "flex_attention"
    paged = resolve_attention(XPU, "paged|eager", environment=KERNELS)
    assert paged.implementation == "paged|eager" and "continuous batching" in paged.reason


@pytest.mark.facts("X6")
def test_gqa_native_answers(make_config):
    assert resolve_attention(XPU, environment=KERNELS).gqa_native is True
    assert resolve_attention(Accelerator("xpu", torch_version="2.7.1"), environment=KERNELS).gqa_native is False
    assert resolve_attention(MPS, environment=KERNELS).gqa_native is False
    assert resolve_attention(Accelerator("mps", torch_version="2.13.0"), environment=KERNELS).gqa_native is True
    assert resolve_attention(H200, environment=KERNELS).gqa_native is None  # decided per call by the mask
    assert resolve_attention(CPU, "eager", environment=KERNELS).gqa_native is False
    big = make_config(head_dim=512)
    assert resolve_attention(H200, model_config=big, environment=KERNELS).gqa_native is False
    mha = make_config(num_key_value_heads=4)
    choice = resolve_attention(XPU, model_config=mha, environment=KERNELS)
    assert choice.gqa_native is None and "no grouped-query" in choice.reason


def test_bad_accelerator_and_fallback_values():
    with pytest.raises(hwattn.AcceleratorTypeError, match="hwenv.Accelerator"):
        resolve_attention("xpu")
    with pytest.raises(UnknownAttentionError, match="fallback"):
        resolve_attention(CPU, "sdpa", fallback="yes")


def test_real_environment_has_usable_kernels():
    from transformers.utils import is_kernels_available

    env = hwattn.current_environment()
    assert env.kernels_available is is_kernels_available() is True
    assert env.torch_version is not None


@pytest.mark.facts("X7")
def test_fake_xpu_detected_then_resolved(fake_xpu):
    fake_xpu(count=2)
    import hwenv

    accel = hwenv.detect()
    assert accel.kind == "xpu"
    assert resolve_attention(accel, "flash_attention_2").implementation == "kernels-community/flash-attn2"
    with pytest.raises(AttentionUnsupportedError):
        resolve_attention(accel, "flash_attention_3")


@pytest.mark.facts("X8")
def test_fake_cuda_capability_is_used(fake_cuda):
    fake_cuda(capability=(8, 6))
    import hwenv

    accel = hwenv.detect()
    assert accel.kind == "cuda" and accel.capability == (8, 6)
    assert resolve_attention(accel, "flash_attention_3").implementation == "kernels-community/vllm-flash-attn3"
    with pytest.raises(AttentionUnsupportedError, match="8.6"):
        resolve_attention(accel, "flash_attention_4")


@pytest.mark.facts("G1")
def test_fake_gaudi_flash_raises_or_falls_back(fake_gaudi, caplog):
    fake_gaudi(count=8)
    import hwenv

    accel = hwenv.detect()
    assert accel.kind == "hpu"
    with pytest.raises(AttentionUnsupportedError, match="Gaudi"):
        resolve_attention(accel, "flash_attention_2")
    caplog.set_level(logging.WARNING, logger="hwattn.resolve")
    choice = resolve_attention(accel, "flash_attention_2", fallback=True)
    assert choice.implementation == "sdpa" and choice.fallback
    assert sum("attention fallback" in r.getMessage() for r in caplog.records) == 1


def test_choice_is_frozen():
    choice = resolve_attention(CPU, environment=KERNELS)
    with pytest.raises(AttributeError):
        choice.implementation = "eager"
    assert choice.to_dict()["implementation"] == "sdpa"
