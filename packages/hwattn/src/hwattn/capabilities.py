"""What each device kind runs for attention: tables keyed by `hwenv` platform kind, a reason per row.

Every device decision in hwattn reads a row here (or a `Platform` fact such as `vendor`); no
module compares a kind to a string. `test_hwattn_capabilities` asserts every table has a row for
every `hwenv.platforms()` kind, so a new kind (a plug-in) cannot be forgotten silently; asking for
a kind without a row is a `KindNotCoveredError` naming the table.

Sources: Transformers 5.22 (unchanged through 5.25; the tests read them from the installed release)
`modeling_flash_attention_utils.py` (`FLASH_ATTN_KERNEL_FALLBACK`,
`FLASH_ATTN_KERNEL_DEVICES`, `FLASH_ATTENTION_COMPATIBILITY_MATRIX`), `integrations/sdpa_attention.py`
(`use_gqa_in_sdpa`), `utils/kernel_config.py` (`KERNELS_SUPPORTED_DEVICE_TYPES`), `utils/import_utils.py`
(`get_device_type`: a HIP build's `cuda` device is `rocm`); kernels 0.17 `layer/kernelize.py`
(`_find_device`) and `layer/repos.py` (`_CUDARepos`/`_ROCMRepos` select by capability).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import KindNotCoveredError
from .names import FLASH_KERNEL_REPO, ROCM_FLASH_KERNEL_REPO

#: FlashAttention versions that run only on NVIDIA GPUs (X8); only rows of an NVIDIA-vendor platform may offer them.
NVIDIA_ONLY_FLASH: tuple[str, ...] = ("flash_attention_3", "flash_attention_4")


@dataclass(frozen=True)
class FlashSupport:
    """Which FlashAttention versions a kind runs and through what; what to say where it runs none.

    `kernels`: flash name -> the hub kernel Transformers loads for it on this kind (when its
    package is missing, or always where `packages` is False). A name missing here is refused:
    with `fallback=True` -> sdpa where `fallback_allowed`, else always (a GPU with its own flash
    kernel: the user should ask for that one, named by `label`/`source` in the error).
    """

    kernels: Mapping[str, str] = field(default_factory=dict)
    packages: bool = False
    capability_checked: bool = False
    fallback_allowed: bool = False
    label: str = ""
    source: str = ""
    why_not: str = ""
    refusal_note: str = ""
    reason: str = ""


@dataclass(frozen=True)
class HubKernels:
    """How hub kernels (`kernels`, `use_kernels`, `KernelConfig`) name this kind.

    `kernels_device`: the kernels library's device type (the key of its mapping, `kernelize`'s
    `Device.type`); None where hub kernels are never used. `config_key`: the `KernelConfig`
    device key; None where KernelConfig has none. `capability`: what kernels selects by on this
    kind (its mapping is keyed by compute capability there), for the plan's note; None if not.
    `refused`: why a hub-kernel attention string cannot run, where `kernels_device` is None.
    """

    kernels_device: str | None
    config_key: str | None
    capability: str | None = None
    reason: str = ""
    refused: str = ""


@dataclass(frozen=True)
class GqaRule:
    """When SDPA gets `enable_gqa=True` on this kind (Transformers' `use_gqa_in_sdpa`).

    `masked_from`: the torch version from which masked GQA runs natively (then always native);
    None: native only without a mask and with equal head dims <= 256 (else the math kernel).
    """

    masked_from: tuple[int, int] | None
    reason: str


#: FlashAttention per kind.
FLASH: dict[str, FlashSupport] = {
    "hpu": FlashSupport(
        fallback_allowed=True, label="Gaudi",
        why_not="Gaudi runs neither the flash_attn packages nor hub kernels (kernels has no 'hpu' device type)",
        reason="no FlashAttention on Gaudi: flash requests raise, or become sdpa with fallback=True"),
    "xpu": FlashSupport(
        kernels={"flash_attention_2": FLASH_KERNEL_REPO["flash_attention_2"]}, label="XPU", source="X7",
        reason="flash_attention_2 is the hub kernel kernels-community/flash-attn2 (XPU build, X7) even when "
               "flash-attn is installed; FlashAttention-3/4 are NVIDIA-only (X8)"),
    "rocm": FlashSupport(
        kernels={"flash_attention_2": ROCM_FLASH_KERNEL_REPO}, packages=True, label="ROCm",
        source="Transformers' ROCm fallback",
        refusal_note=" Transformers itself would load kernels-community/aiter-flash-attn for 'flash_attention_3' "
                     "on ROCm: that is the kernel 'flash_attention_2' gives here.",
        reason="flash_attention_2 is the flash-attn package (ROCm build) when installed, else the hub kernel "
               "kernels-community/aiter-flash-attn (Transformers' ROCm fallback, FLASH_ATTN_KERNEL_DEVICES: "
               "rocm); kernels-community/flash-attn2 ships cuda/xpu builds only; FlashAttention-3/4 are "
               "NVIDIA-only (X8)"),
    "cuda": FlashSupport(
        kernels=dict(FLASH_KERNEL_REPO), packages=True, capability_checked=True, label="CUDA",
        reason="flash_attention_2/3/4: the flash-attn packages when installed, else Transformers' hub kernels; "
               "FA3 needs compute capability >= 8.0, FA4 >= 9.0"),
    "mps": FlashSupport(
        fallback_allowed=True, label="MPS",
        why_not="no FlashAttention build targets Apple GPUs (kernels-community/flash-attn2: CUDA and XPU only)",
        reason="no FlashAttention on Apple GPUs: flash requests raise, or become sdpa with fallback=True"),
    "cpu": FlashSupport(
        fallback_allowed=True, label="CPU",
        why_not="FlashAttention is GPU-only and kernels-community/flash-attn2 ships CUDA and XPU builds only",
        reason="FlashAttention is GPU-only: flash requests raise, or become sdpa with fallback=True"),
}

#: Hub-kernel device names per kind.
HUB_KERNELS: dict[str, HubKernels] = {
    "hpu": HubKernels(None, None, reason=(
        "hub kernels are not used on Gaudi: the kernels library has no 'hpu' device type and KernelConfig "
        "accepts no 'hpu' key"), refused="hub kernels ship no Gaudi builds (kernels has no 'hpu' device type)"),
    "xpu": HubKernels("xpu", "xpu", reason="kernels and KernelConfig call it 'xpu'"),
    "rocm": HubKernels("rocm", "rocm", capability="ROCm capability", reason=(
        "kernels (kernelize._find_device) and Transformers (get_device_type) call a cuda device of a HIP "
        "build 'rocm'; kernels selects ROCm kernels by capability")),
    "cuda": HubKernels("cuda", "cuda", capability="CUDA capability", reason=(
        "kernels and KernelConfig call it 'cuda'; kernels selects CUDA kernels by compute capability")),
    "mps": HubKernels("mps", "mps", reason="kernels and KernelConfig call it 'mps'"),
    "cpu": HubKernels("cpu", None, reason=(
        "kernels has a 'cpu' device type, KernelConfig no 'cpu' key: only Transformers' default mapping can "
        "give a CPU kernel")),
}

#: SDPA's grouped-query rule per kind.
GQA: dict[str, GqaRule] = {
    "hpu": GqaRule(None, "Transformers' rule for every device but XPU and MPS"),
    "xpu": GqaRule((2, 8), "XPU SDPA handles GQA natively from torch 2.8 (X6)"),
    "rocm": GqaRule(None, "Transformers' CUDA rule (a HIP build's device is cuda; use_gqa_in_sdpa)"),
    "cuda": GqaRule(None, "Transformers' CUDA rule (use_gqa_in_sdpa)"),
    "mps": GqaRule((2, 13), "MPS SDPA handles GQA natively from torch 2.13"),
    "cpu": GqaRule(None, "Transformers' rule for every device but XPU and MPS"),
}

#: The rule for a torch device type no registered platform has (`meta`, ...): Transformers' default branch.
UNLISTED_GQA = GqaRule(None, "Transformers' rule for every device but XPU and MPS")

#: Every per-kind table, by name (the coverage test walks these).
TABLES: dict[str, Mapping[str, object]] = {"FLASH": FLASH, "HUB_KERNELS": HUB_KERNELS, "GQA": GQA}

_Row = TypeVar("_Row")


def row(table: Mapping[str, _Row], kind: str) -> _Row:
    """`table[kind]`, or a `KindNotCoveredError` naming the table and how to add the row."""
    found = table.get(kind)
    if found is None:
        name = next((n for n, t in TABLES.items() if t is table), "a capability table")
        raise KindNotCoveredError(
            f"device kind {kind!r} has no row in hwattn.capabilities.{name}, so hwattn cannot decide attention "
            f"there (rows: {', '.join(table)}). Add a row for {kind!r} to hwattn/capabilities.py (the coverage "
            "test lists every table missing one), or decide for Accelerator('cpu')."
        )
    return found


def flash_support(kind: str) -> FlashSupport:
    """The `FLASH` row of `kind`."""
    return row(FLASH, kind)


def hub_kernels(kind: str) -> HubKernels:
    """The `HUB_KERNELS` row of `kind`."""
    return row(HUB_KERNELS, kind)


def gqa_rule(kind: str) -> GqaRule:
    """The `GQA` row of `kind`."""
    return row(GQA, kind)


def gqa_rule_for_device_type(device_type: str) -> GqaRule:
    """The GQA rule for tensors on `device_type`: the rows of the kinds with that torch device type.

    `cuda` is both NVIDIA and ROCm (their rules agree; a test keeps it so); a device type no
    registered platform has gets Transformers' default branch (`UNLISTED_GQA`).
    """
    from hwenv import platforms

    rules = [GQA[p.kind] for p in platforms() if p.device_type == device_type and p.kind in GQA]
    if not rules:
        return UNLISTED_GQA
    if len({r.masked_from for r in rules}) > 1:
        kinds = [p.kind for p in platforms() if p.device_type == device_type]
        raise KindNotCoveredError(
            f"kinds {kinds} share the torch device type {device_type!r} but their GQA rows disagree, so a tensor "
            "cannot say which applies; give them one masked_from in hwattn.capabilities.GQA."
        )
    return rules[0]
