"""Which modules LoRA adapts, and the PEFT `LoraConfig` built from that choice.

The targets are PEFT's, not a table of ours: PEFT's own per-architecture mapping where it has a
row for the model type, else `target_modules="all-linear"` (PEFT's shorthand for every linear
layer but the output head). An explicit list always wins.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TrainingConfigError
from .booleans import check_booleans

logger = logging.getLogger(__name__)

#: PEFT's name for its per-architecture LoRA target table (peft.utils.constants, 0.21 and later).
PEFT_MAPPING = "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"
#: PEFT's shorthand for "every linear layer except the output head" (peft.utils.constants).
ALL_LINEAR = "all-linear"

#: Where a target choice came from: `LoraTargets.source`.
GIVEN, PEFT, ALL_LINEAR_SOURCE = "given", "peft", "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters; `target_modules=None` means "PEFT's choice for the architecture"."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise TrainingConfigError(f"LoRA r={self.r!r} is invalid; the rank must be an int >= 1. Fix: use e.g. r=16.")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < math.inf:
            raise TrainingConfigError(f"LoRA alpha={self.alpha!r} is invalid; it must be a finite number > 0 (the "
                                      "adapter's scale is alpha / r). Fix: use e.g. alpha=32.")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise TrainingConfigError(f"LoRA dropout={self.dropout!r} is invalid; it must be a number in [0, 1).")
        if self.target_modules is not None:
            _target_names(self.target_modules)  # an empty list is refused before anything loads


@dataclass(frozen=True)
class LoraTargets:
    """The modules LoRA adapts: names, or PEFT's `"all-linear"`; `source` is given / peft / all-linear."""

    modules: tuple[str, ...] | str
    source: str
    reason: str

    def for_peft(self) -> list[str] | str:
        """The `LoraConfig(target_modules=...)` value: a list of names, or the `"all-linear"` string."""
        return self.modules if isinstance(self.modules, str) else list(self.modules)


def _target_names(override: Sequence[str]) -> tuple[str, ...]:
    if isinstance(override, str):
        override = (override,)
    names = tuple(str(name).strip() for name in override if str(name).strip())
    if not names:
        raise TrainingConfigError(
            f"LoRA target_modules={tuple(override)!r} names no module. Fix: pass names such as "
            "('q_proj', 'v_proj'), ('all-linear',), or None for PEFT's choice for the architecture."
        )
    return names


def peft_target_mapping() -> Mapping[str, Sequence[str]]:
    """PEFT's own model_type -> LoRA target modules table, read from the installed peft."""
    from peft.utils import constants

    mapping = getattr(constants, PEFT_MAPPING, None)
    if not isinstance(mapping, Mapping):
        import peft

        raise TrainingConfigError(
            f"peft {peft.__version__} has no peft.utils.constants.{PEFT_MAPPING}, the per-architecture LoRA "
            "targets hwrun defaults to. Fix: install a peft hwrun supports (pyproject), or pass the targets "
            "yourself: LoraSettings(target_modules=('q_proj', 'v_proj')) or --lora-targets q_proj,v_proj."
        )
    return mapping


def lora_targets(model_type: str, override: Sequence[str] | None = None) -> LoraTargets:
    """The LoRA targets for `model_type`: `override` when given (`("all-linear",)` is PEFT's shorthand),
    else PEFT's mapping for the model type, else `"all-linear"`."""
    if override is not None:
        names = _target_names(override)
        if len(names) == 1 and names[0].lower() == ALL_LINEAR:
            return LoraTargets(ALL_LINEAR, GIVEN, "given: all-linear (PEFT's every linear layer but the output head)")
        return LoraTargets(names, GIVEN, f"given: {', '.join(names)}")
    mapping = peft_target_mapping()
    if model_type in mapping:
        modules = tuple(mapping[model_type])
        return LoraTargets(modules, PEFT, f"peft's mapping for {model_type}: {', '.join(modules)}")
    return LoraTargets(ALL_LINEAR, ALL_LINEAR_SOURCE,
                       f"all-linear: PEFT's every linear layer but the output head ({model_type or 'this model type'} "
                       "has no row in peft's mapping)")


def check_rank(settings: LoraSettings, config: Mapping[str, Any] | None) -> None:
    """LoRA's rank is bounded by the model's hidden size (from its config.json, before anything loads): a rank above
    a layer's smaller dimension adapts nothing a full-rank update would not, while A and B hold more numbers than the
    weight itself (issue 42: --lora-r was unbounded). Extra PEFT settings typed bool must be True/False."""
    text = (config or {}).get("text_config") if isinstance((config or {}).get("text_config"), Mapping) else config
    hidden = next((text.get(key) for key in ("hidden_size", "n_embd", "d_model") if text and
                   isinstance(text.get(key), int) and not isinstance(text.get(key), bool)), None)
    if hidden is not None and settings.r > hidden:
        raise TrainingConfigError(
            f"LoRA r={settings.r} (--lora-r) exceeds the model's hidden size {hidden}: a rank above a layer's smaller "
            "dimension adapts nothing a full-rank update would not, while its A and B matrices hold more numbers "
            f"than the weight itself. Fix: --lora-r {min(16, hidden)} (ranks of 8-64 are usual), at most {hidden}."
        )
    if settings.extra:
        from peft import LoraConfig

        check_booleans(settings.extra, LoraConfig, "lora={{..., {name!r}: {value!r}}}")


def lora_config(model_config: Any, settings: LoraSettings | None = None, targets: LoraTargets | None = None):
    """Build a PEFT `LoraConfig` (task CAUSAL_LM) for a model with this `model_config`; `targets` as
    `lora_targets` chose them (chosen here from the config and `settings` when not given)."""
    from peft import LoraConfig

    settings = settings or LoraSettings()
    if targets is None:
        targets = lora_targets(getattr(model_config, "model_type", "") or "", settings.target_modules)
    logger.info("LoRA r=%d: %s", settings.r, targets.reason)
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets.for_peft(),
        task_type="CAUSAL_LM",
        **dict(settings.extra),
    )
