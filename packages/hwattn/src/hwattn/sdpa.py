"""`sdpa`: grouped-query attention through torch SDPA, natively where the device allows, else repeated KV.

`enable_gqa=None` decides per call with the rule Transformers uses (`gqa.native_gqa`, X6): on
XPU from torch 2.8 always native, on CUDA/ROCm/CPU only without a mask. `eager_attention` is the
plain reference the tests and the benchmark compare against.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .errors import ShapeError
from .gqa import ENABLE_GQA_MIN_TORCH, native_gqa

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate (batch, heads, seq, dim) shapes; return query heads per KV head."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ShapeError(
            f"q, k, v must be 4-D (batch, heads, seq, head_dim); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}. Transpose (batch, seq, heads, dim) inputs with .transpose(1, 2)."
        )
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ShapeError(
            f"k and v must share batch, heads and seq, and q and k the head dim; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ShapeError(
            f"query heads ({heads}) must be a multiple of KV heads ({kv_heads}) for grouped-query attention."
        )
    return heads // kv_heads


def repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, kv_heads, seq, dim) -> (batch, kv_heads * n_rep, seq, dim), as Transformers' `repeat_kv`."""
    if n_rep == 1:
        return hidden
    batch, kv_heads, seq, dim = hidden.shape
    return hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim).reshape(batch, kv_heads * n_rep, seq, dim)


def uses_native_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    attn_mask: torch.Tensor | None = None) -> bool:
    """What `sdpa(..., enable_gqa=None)` decides for these tensors (Transformers' `use_gqa_in_sdpa` rule)."""
    import torch

    return native_gqa(q.device.type, torch.__version__, has_mask=attn_mask is not None,
                      key_head_dim=k.shape[-1], value_head_dim=v.shape[-1])


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention for MHA/GQA/MQA with (batch, heads, seq, dim) tensors.

    `enable_gqa=None` picks native GQA where supported (see `uses_native_gqa`); True forces
    `enable_gqa=True` (torch >= 2.5), False forces the repeat-KV path.
    """
    import torch
    import torch.nn.functional as F
    from hwenv import at_least

    n_rep = _check_shapes(q, k, v)
    if enable_gqa is not None and not isinstance(enable_gqa, bool):
        raise ShapeError(f"enable_gqa must be None, True or False, got {enable_gqa!r}.")
    if n_rep == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    native = uses_native_gqa(q, k, v, attn_mask) if enable_gqa is None else enable_gqa
    if native:
        if not at_least(torch.__version__, ENABLE_GQA_MIN_TORCH):
            raise ShapeError(f"enable_gqa=True needs torch >= 2.5, this is torch {torch.__version__}; "
                             "pass enable_gqa=False to repeat KV heads.")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=attn_mask,
                                          is_causal=is_causal, scale=scale)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    upcast: bool = True,
) -> torch.Tensor:
    """Reference attention written out (repeat KV, matmul, mask, softmax, matmul); the same semantics as SDPA.

    A bool mask keeps True positions, a float mask is added; `is_causal` is top-left aligned as in
    torch. `upcast=True` computes in float32 (a reference); False keeps the input dtype (a baseline).
    """
    import torch

    n_rep = _check_shapes(q, k, v)
    dtype = q.dtype
    work = torch.float32 if upcast else dtype
    qf, kf, vf = q.to(work), repeat_kv(k, n_rep).to(work), repeat_kv(v, n_rep).to(work)
    scores = qf @ kf.transpose(-2, -1) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(work)
    return (torch.softmax(scores, dim=-1) @ vf).to(dtype)
