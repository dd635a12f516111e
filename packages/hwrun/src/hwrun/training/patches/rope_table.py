"""RoPE cos/sin read from a table computed once, for training on fixed-length packed blocks.

Transformers' rotary module recomputes cos/sin from the positions on every forward, and under
`torch.compile` inductor inlines that into each layer's RoPE kernel (forward and backward): every
element of q and k then evaluates a float32 cos and sin. On the H200 benchmark those kernels took
about 90 µs (forward) and 75 µs (backward) per layer where moving the data takes about 20 µs. The
table is the rotary module's own output for positions 0..n-1, so the values are the same."""

from __future__ import annotations

import logging
import types
from typing import Any

from .record import ModelPatch

logger = logging.getLogger(__name__)

_FLAG = "_hwrun_rope_table"


def rotary_module(model: Any) -> Any | None:
    """The decoder's Transformers rotary embedding module (`decoder.rotary_emb`), or None."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return getattr(decoder, "rotary_emb", None)


def rope_table_support(model: Any) -> str | None:
    """None when `model`'s rotary embedding can be served from a fixed table, else the reason not."""
    rotary = rotary_module(model)
    if rotary is None or not hasattr(rotary, "inv_freq") or not hasattr(rotary, "attention_scaling"):
        return "the model has no Transformers rotary module (decoder.rotary_emb with inv_freq)"
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if "dynamic" in rope_type or rope_type == "longrope":
        return f"rope_type {rope_type!r} changes its frequencies with the sequence length"
    return None


def apply_rope_table(model: Any, positions: int) -> ModelPatch:
    """Serve `model`'s RoPE cos/sin for positions < `positions` from a table (explicit, idempotent,
    reversible with `.undo()`). A longer sequence falls back to the module's own computation."""
    import torch

    rotary = rotary_module(model)
    if rotary is not None and getattr(rotary, _FLAG, False):
        return ModelPatch(True, "already applied")
    reason = rope_table_support(model)
    if reason is not None:
        logger.info("RoPE table not used: %s; cos/sin are computed per step.", reason)
        return ModelPatch(False, reason)
    original = rotary.forward
    device = rotary.inv_freq.device
    with torch.no_grad():
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        cos_table, sin_table = original(probe, torch.arange(positions, device=device).unsqueeze(0))
    cos_table, sin_table = cos_table[0].float(), sin_table[0].float()

    def forward(self, x, position_ids):
        if position_ids.shape[-1] > cos_table.shape[0]:  # static under torch.compile: no sync
            return original(x, position_ids)
        return cos_table[position_ids].to(x.dtype), sin_table[position_ids].to(x.dtype)

    rotary.forward = types.MethodType(forward, rotary)
    setattr(rotary, _FLAG, True)

    def undo() -> None:
        del rotary.forward
        delattr(rotary, _FLAG)

    logger.info("RoPE cos/sin from a table of %d positions (computed once, not in every layer).", positions)
    return ModelPatch(True, f"RoPE cos/sin from a precomputed table of {positions} positions", [undo])
