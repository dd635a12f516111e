"""The attention names hwattn accepts: Transformers' own list, hub-kernel strings, and `auto`.

The list is read from the installed Transformers (`ALL_ATTENTION_FUNCTIONS`, the registry that
`PreTrainedModel.get_correct_attn_implementation` validates against) so hwattn accepts
exactly what `from_pretrained(attn_implementation=...)` accepts.
"""

from __future__ import annotations

import difflib
import re

from .errors import UnknownAttentionError

AUTO = "auto"
EAGER = "eager"
SDPA = "sdpa"
FLASH_NAMES: tuple[str, ...] = ("flash_attention_2", "flash_attention_3", "flash_attention_4")

#: Hub kernel each FlashAttention version falls back to when its package is not installed
#: (transformers `modeling_flash_attention_utils.FLASH_ATTN_KERNEL_FALLBACK`, non-ROCm; X7).
FLASH_KERNEL_REPO: dict[str, str] = {
    "flash_attention_2": "kernels-community/flash-attn2",
    "flash_attention_3": "kernels-community/vllm-flash-attn3",
    "flash_attention_4": "kernels-community/flash-attn4",
}
#: The hub kernel Transformers loads for `flash_attention_2` on ROCm (`FLASH_ATTN_KERNEL_FALLBACK` when
#: `is_rocm_platform()`); it ships ROCm builds only (`FLASH_ATTN_KERNEL_DEVICES`).
ROCM_FLASH_KERNEL_REPO = "kernels-community/aiter-flash-attn"

#: Devices each hub flash kernel ships builds for, as kernels device types (`rocm` is AMD)
#: (transformers `modeling_flash_attention_utils.FLASH_ATTN_KERNEL_DEVICES`).
FLASH_KERNEL_DEVICES: dict[str, tuple[str, ...]] = {
    "kernels-community/flash-attn2": ("cuda", "xpu"),
    "kernels-community/flash-attn3": ("cuda",),
    "kernels-community/vllm-flash-attn3": ("cuda",),
    "kernels-community/aiter-flash-attn": ("rocm",),
    "kernels-community/flash-attn4": ("cuda",),
    "kernels-community/metal-flash-sdpa": ("mps",),
}

#: Distribution that provides each original FlashAttention package, and the minimum CUDA
#: compute capability major it needs (transformers `FLASH_ATTENTION_COMPATIBILITY_MATRIX`).
FLASH_DISTRIBUTION: dict[str, str] = {
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
    "flash_attention_4": "flash-attn-4",
}
FLASH_MIN_CAPABILITY: dict[str, int] = {"flash_attention_3": 8, "flash_attention_4": 9}

#: The org whose kernels Transformers loads without `allow_all_kernels=True`.
TRUSTED_KERNEL_ORG = "kernels-community"

# transformers `integrations/hub_kernels.is_kernel`: org/repo[@revision][:function]
_KERNEL_PATTERN = re.compile(r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")


def transformers_attention_names() -> tuple[str, ...]:
    """Names the installed Transformers accepts: `eager` plus `ALL_ATTENTION_FUNCTIONS.valid_keys()`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return (EAGER, *ALL_ATTENTION_FUNCTIONS.valid_keys())


def valid_names() -> tuple[str, ...]:
    """Every name `resolve_attention` accepts (hub-kernel strings `org/repo[@rev][:fn]` aside)."""
    return (AUTO, *transformers_attention_names())


def is_kernel_string(name: str) -> bool:
    """True for a hub-kernel attention string such as `kernels-community/flash-attn2` (Transformers' rule)."""
    return _KERNEL_PATTERN.match(name) is not None


def kernel_repo_id(name: str) -> str:
    """`"org/repo@rev:fn"` -> `"org/repo"`."""
    return name.split(":", 1)[0].split("@", 1)[0].strip()


def check_name(requested: object) -> str:
    """Return `requested` when Transformers accepts it, else raise `UnknownAttentionError` listing the valid names."""
    if requested in (AUTO, EAGER):  # always valid (see valid_names): no need to import transformers' modeling code
        return requested
    names = valid_names()
    hint = (
        f"Valid names: {', '.join(repr(n) for n in names)}, or a hub kernel 'org/repo[@revision][:function]' "
        f"such as {FLASH_KERNEL_REPO['flash_attention_2']!r}."
    )
    if requested is None:
        raise UnknownAttentionError(
            "requested attention is None; hwattn needs an explicit name (Transformers would silently pick "
            f"its default). Pass 'auto' for the default (SDPA, X6). {hint}"
        )
    if not isinstance(requested, str):
        raise UnknownAttentionError(
            f"requested attention must be a string, got {type(requested).__name__} {requested!r}. {hint}"
        )
    if requested in names or is_kernel_string(requested):
        return requested
    if requested.startswith("paged|") and requested.removeprefix("paged|") in names:
        raise UnknownAttentionError(
            f"{requested!r}: the 'paged|' prefix is deprecated in Transformers (removed in 5.23) except for "
            f"'paged|eager'; pass {requested.removeprefix('paged|')!r} instead. {hint}"
        )
    close = difflib.get_close_matches(requested, [*names, *FLASH_KERNEL_REPO.values()], n=1, cutoff=0.6)
    suggestion = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownAttentionError(
        f"{requested!r} is not an attention implementation the installed Transformers accepts.{suggestion} {hint}"
    )
