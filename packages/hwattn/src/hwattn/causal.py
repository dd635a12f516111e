"""`hwattn_causal_sdpa`: Transformers' own SDPA attention, with no mask built for unpadded batches.

Why: a batch without an `attention_mask` (fixed-length packed blocks, as `hwrun train` makes) needs
only the causal mask, which SDPA applies itself (`is_causal=True`) with its fused causal kernels
(flash / cuDNN: about half the work of a full square). Transformers skips building the mask only
outside tracing on torch < 2.14: under `torch.compile` there, `_ignore_causal_mask_sdpa`
(masking_utils.py) always materialises a (batch, 1, seq, seq) boolean mask, and SDPA then runs a
masked kernel over the full square. This name keeps the skip under `torch.compile` for exactly
that case (no 2D mask, plain causal mask function, no cache offset, square attention) and hands
every other case (padding, packed-sequence or sliding-window masks, decoding) to Transformers'
`sdpa_mask` unchanged.

Registering adds one name to Transformers' attention and mask registries (no existing entry is
changed); `unregister_causal_sdpa()` removes it.
"""

from __future__ import annotations

from typing import Any

#: The `attn_implementation` name (`model.set_attn_implementation(CAUSAL_SDPA)` after registering).
CAUSAL_SDPA = "hwattn_causal_sdpa"


def causal_sdpa_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                     mask_function: Any = None, attention_mask: Any = None, allow_is_causal_skip: bool = True,
                     **kwargs: Any) -> Any:
    """None (SDPA's `is_causal`) when the mask is the plain causal square, else Transformers' `sdpa_mask`."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    plain_causal = (attention_mask is None and allow_is_causal_skip and mask_function is causal_mask_function
                    and kwargs.get("local_size") is None and isinstance(q_offset, int) and q_offset == 0
                    and kv_offset == 0 and q_length == kv_length)
    if plain_causal:
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def register_causal_sdpa() -> str:
    """Add `CAUSAL_SDPA` to Transformers' attention and mask registries (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(CAUSAL_SDPA, causal_sdpa_mask)
    return CAUSAL_SDPA


def unregister_causal_sdpa() -> None:
    """Remove `CAUSAL_SDPA` from both registries (idempotent); models set to it must switch back first."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface._global_mapping.pop(CAUSAL_SDPA, None)
    AttentionMaskInterface._global_mapping.pop(CAUSAL_SDPA, None)


def is_causal_sdpa_registered() -> bool:
    """Whether `register_causal_sdpa()` is in effect."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return (AttentionInterface._global_mapping.get(CAUSAL_SDPA) is not None
            and AttentionMaskInterface._global_mapping.get(CAUSAL_SDPA) is causal_sdpa_mask)
