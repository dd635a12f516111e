"""Quantized bases for training: which ones hwrun trains LoRA on (the table's training column, checked before load),
and preparing a 4-bit (QLoRA) base without peft's float32 copies of the unquantized weights.

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


def check_quantized_base(quantization: str | None, *, lora: bool, qlora: bool = False) -> str | None:
    """Refuse, before the model loads, training on a base quantized with a method hwrun does not train through
    (QuantizedTrainingError naming the method, why, and what to use instead); for one it trains, the reason line for
    `train()`'s reasons; None for an unquantized plan. `lora`: the run trains LoRA adapters (else every weight);
    `qlora`: qlora=True was asked for (a 4-bit bitsandbytes base, so no other method)."""
    if not quantization:
        return None
    from ..errors import QuantizedTrainingError
    from ..model.quantization_table import METHODS, lora_training, method_name

    name = method_name(quantization)
    row, library = lora_training(name), METHODS[name].library
    if qlora and name != "bnb-4bit":
        raise QuantizedTrainingError(
            f"qlora=True (--qlora) loads a 4-bit bitsandbytes base, but the plan quantizes with {name} ({library}); "
            f"pass one of them (--qlora alone, or --lora with --quantize {name}).")
    if not lora:
        lora_here = ("train LoRA adapters on it (--lora, train(..., lora=True))" if row.trains
                     else f"train LoRA on a base hwrun trains through ({row.instead})")
        raise QuantizedTrainingError(
            f"full fine-tuning on a base quantized with {name} ({library}): quantized weights cannot be updated by the "
            f"optimizer. Instead {lora_here}, or fine-tune the unquantized model (no --quantize).")
    if not row.trains:
        raise QuantizedTrainingError(
            f"LoRA training on a base quantized with {name} ({library}) is refused before loading: {row.reason}. Use "
            f"instead: {row.instead}.")
    return f"{name} ({library}) base, frozen, LoRA on top: {row.reason}"


def fusion_blocker(quantization: str | None) -> str | None:
    """Why LoRA's gate/up (and q/k/v) projections stay separate on a quantized base, or None for an unquantized one:
    quantized weights are tensor subclasses or custom layers that cannot be concatenated into one matrix."""
    if not quantization:
        return None
    from ..model.quantization_table import method_name

    return f"not fused: the base weights are quantized ({method_name(quantization)}), not plain Linear weights"
