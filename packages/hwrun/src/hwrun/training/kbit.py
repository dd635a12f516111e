"""Preparing a 4-bit (QLoRA) base for training without peft's float32 copies of the unquantized weights.

peft's `prepare_model_for_kbit_training` casts every bfloat16/float16 parameter that bitsandbytes did not
quantize to float32: on a Llama-3.2-1B-shaped model that is the 128256 x 2048 embedding (tied to the
output head), 0.26 B parameters, 0.53 GB more than in bfloat16 — about 12 % of QLoRA's whole peak in
docs/benchmarks/train.md (4.3 GiB) — and the loss's output-head matmuls then run in float32. The cast
exists for float16 training, where frozen half-precision norms lose precision; these weights are frozen
here and LoRA's own weights train in float32 either way, so hwrun keeps them in the plan's dtype, as its
LoRA path does. The rest of what peft does is kept: every base parameter frozen, activation checkpointing
with `use_reentrant=False` (no input-gradient hook needed then).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def prepare_kbit_base(model: Any) -> str:
    """Freeze `model`'s parameters and turn on activation checkpointing (non-reentrant), keeping the
    unquantized weights in their dtype; return the reason line for `train()`'s reasons."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.25 (the old name warns there)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    kept = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                   if p.__class__.__name__ != "Params4bit" and p.is_floating_point()})
    reason = (f"4-bit base frozen, activation checkpointing on (non-reentrant); unquantized weights kept in "
              f"{', '.join(kept) or 'their dtype'} (peft's prepare_model_for_kbit_training would copy them to float32)")
    logger.info("QLoRA: %s", reason)
    return reason
