"""When SDPA runs grouped-query attention natively (`enable_gqa=True`) instead of repeating KV heads.

Mirrors Transformers' `use_gqa_in_sdpa` (`integrations/sdpa_attention.py`), so hwattn's
decisions and Transformers' own SDPA path agree; a test runs both on the same inputs.
"""

from __future__ import annotations

from hwenv import at_least

from .capabilities import GQA, GqaRule, gqa_rule_for_device_type

#: torch from which SDPA's `enable_gqa` handles masked GQA on XPU (X6) and on MPS (the `GQA` rows).
XPU_GQA_MIN_TORCH = GQA["xpu"].masked_from
MPS_GQA_MIN_TORCH = GQA["mps"].masked_from
#: torch from which `scaled_dot_product_attention` has the `enable_gqa` argument at all.
ENABLE_GQA_MIN_TORCH = (2, 5)
#: Largest head dim for which CUDA/CPU SDPA keeps a fused kernel with `enable_gqa` (Transformers' rule).
MAX_GQA_HEAD_DIM = 256


def _rule(kind: str) -> GqaRule:
    """The `GQA` row of a kind, else the rule of the platforms with that torch device type."""
    return GQA[kind] if kind in GQA else gqa_rule_for_device_type(kind)


def native_gqa(
    kind: str,
    torch_version: str | None,
    *,
    has_mask: bool,
    key_head_dim: int,
    value_head_dim: int,
) -> bool:
    """Whether SDPA should get `enable_gqa=True` for one call (same rule as `use_gqa_in_sdpa`).

    `kind` is a platform kind (`capabilities.GQA`) or a torch device type (`cuda` covers ROCm too).
    """
    if not at_least(torch_version, ENABLE_GQA_MIN_TORCH):
        return False
    rule = _rule(kind)
    if rule.masked_from is not None:
        return at_least(torch_version, rule.masked_from)
    # CUDA, ROCm, CPU, Gaudi: no mask and equal head dims <= 256, else SDPA would use the math kernel.
    return not has_mask and key_head_dim == value_head_dim <= MAX_GQA_HEAD_DIM


def native_gqa_reason(kind: str, torch_version: str | None, *, has_mask: bool, key_head_dim: int,
                      value_head_dim: int) -> str:
    """One line saying why `native_gqa` decided what it decided."""
    native = native_gqa(kind, torch_version, has_mask=has_mask, key_head_dim=key_head_dim,
                        value_head_dim=value_head_dim)
    verb = "enable_gqa=True" if native else "repeat KV heads"
    if not at_least(torch_version, ENABLE_GQA_MIN_TORCH):
        return f"{verb}: torch {torch_version} has no enable_gqa (needs >= 2.5)"
    rule = _rule(kind)
    if rule.masked_from is not None:
        return f"{verb}: {rule.reason}, torch is {torch_version}"
    return (f"{verb}: on {kind} enable_gqa is used only without a mask and with equal head dims <= "
            f"{MAX_GQA_HEAD_DIM} (mask={'yes' if has_mask else 'no'}, head dims {key_head_dim}/{value_head_dim})")


def model_head_dim(model_config: object) -> int | None:
    """The attention head dim of a Transformers config (`head_dim`, else hidden_size // heads), or None."""
    head_dim = getattr(model_config, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    hidden, heads = getattr(model_config, "hidden_size", None), getattr(model_config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def model_kv_groups(model_config: object) -> int | None:
    """Query heads per KV head of a config (1 = no GQA), or None when the config does not say."""
    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or kv_heads <= 0:
        return None
    return heads // kv_heads
