"""Which modules LoRA adapts, per architecture, and the PEFT `LoraConfig` built from that choice."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import TrainingConfigError

logger = logging.getLogger(__name__)

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")

# All four attention projections (the common recipe, and what the benchmark uses); PEFT's own
# default is only q_proj/v_proj, which adapts less and learns slower for the same cost class.
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _ATTENTION,
    "mistral": _ATTENTION,
    "mixtral": _ATTENTION,
    "qwen2": _ATTENTION,
    "qwen3": _ATTENTION,
    "qwen2_moe": _ATTENTION,
    "gemma": _ATTENTION,
    "gemma2": _ATTENTION,
    "gemma3_text": _ATTENTION,
    "phi3": ("qkv_proj", "o_proj"),
    "phi": ("q_proj", "k_proj", "v_proj", "dense"),
    "gpt2": ("c_attn", "c_proj"),
    "gpt_neox": ("query_key_value", "dense"),
    "falcon": ("query_key_value", "dense"),
    "bloom": ("query_key_value", "dense"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj"),
}


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters; `target_modules=None` means "choose by architecture"."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.r < 1:
            raise TrainingConfigError(f"LoRA r={self.r} is invalid; the rank must be >= 1. Fix: use e.g. r=16.")
        if not 0.0 <= self.dropout < 1.0:
            raise TrainingConfigError(f"LoRA dropout={self.dropout} is invalid; it must be in [0, 1).")


def target_modules_for(model_type: str, override: Sequence[str] | None = None) -> tuple[tuple[str, ...], str]:
    """Return (module names, reason) for LoRA on `model_type`; `override` wins when given."""
    if override:
        return tuple(override), "target modules given explicitly"
    if model_type in TARGET_MODULES:
        return TARGET_MODULES[model_type], f"{model_type}: the attention projections"
    try:
        from peft.utils.constants import (
            TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_map,
        )
    except ImportError:  # pragma: no cover - peft is a dependency
        peft_map = {}
    if model_type in peft_map:
        modules = tuple(peft_map[model_type])
        logger.info("LoRA targets for %s come from PEFT's defaults: %s", model_type, modules)
        return modules, f"{model_type}: PEFT's default target modules"
    raise TrainingConfigError(
        f"No LoRA target modules are known for model_type={model_type!r}; hwrun knows "
        f"{', '.join(sorted(TARGET_MODULES))}. Fix: pass them, e.g. "
        "LoraSettings(target_modules=('q_proj', 'v_proj')) or --lora-targets q_proj,v_proj."
    )


def lora_config(model_config: Any, settings: LoraSettings | None = None):
    """Build a PEFT `LoraConfig` (task CAUSAL_LM) for a model with this `model_config`."""
    from peft import LoraConfig

    settings = settings or LoraSettings()
    model_type = getattr(model_config, "model_type", "")
    modules, reason = target_modules_for(model_type, settings.target_modules)
    logger.info("LoRA r=%d on %s (%s)", settings.r, ",".join(modules), reason)
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(modules),
        task_type="CAUSAL_LM",
        **dict(settings.extra),
    )
