"""Saving a fine-tuned model (LoRA adapter alone, or merged into the base weights, safetensors
either way) and loading an adapter folder back as base model + adapter."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainingConfigError

if TYPE_CHECKING:
    from hwrun.model.plan import RunPlan

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """True when `path` is a PEFT adapter folder (adapter_config.json, no full config.json)."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def adapter_base_model(path: str | os.PathLike) -> str:
    """The base model an adapter folder was trained on (`base_model_name_or_path`)."""
    config_path = Path(path) / ADAPTER_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrainingConfigError(
            f"{config_path} is unreadable ({error}); an adapter folder needs a valid adapter_config.json. "
            "Fix: re-save the adapter with `hwrun train`."
        ) from None
    base = config.get("base_model_name_or_path")
    if not base:
        raise TrainingConfigError(
            f"{config_path} names no base_model_name_or_path; hwrun cannot tell which model the adapter "
            "belongs to. Fix: add the base model's path to it."
        )
    return str(base)


def save_adapter(model: Any, tokenizer: Any, output_dir: str | os.PathLike,
                 state_dict: dict[str, Any] | None = None) -> Path:
    """Save only the LoRA adapter (adapter_config.json + adapter_model.safetensors) and the tokenizer;
    `state_dict` (e.g. gathered from FSDP shards) replaces the model's own parameters when given."""
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir, safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return output_dir


def save_merged(model: Any, tokenizer: Any, output_dir: str | os.PathLike) -> Path:
    """Merge the LoRA weights into the base weights and save a plain model (config.json +
    model.safetensors) that loads with no PEFT at all."""
    output_dir = Path(output_dir)
    merged = model.merge_and_unload()
    merged.save_pretrained(output_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    stale = output_dir / ADAPTER_CONFIG
    if stale.exists():
        stale.unlink()
    return output_dir


def merge_adapter_folder(adapter_dir: str | os.PathLike, output_dir: str | os.PathLike, plan: RunPlan) -> Path:
    """Load base (unquantized, plan dtype) + adapter from `adapter_dir`, merge, save to `output_dir`
    (used after QLoRA: merging into 4-bit weights would lose precision)."""
    model, tokenizer = load_adapter_model(adapter_dir, plan, quantized=False)
    return save_merged(model, tokenizer, output_dir)


def load_adapter_model(path: str | os.PathLike, plan: RunPlan | None = None, *, quantized: bool | None = None):
    """Load the base model named in `path`'s adapter_config.json (with `plan`'s device, dtype and
    attention via `hwrun.from_pretrained_kwargs`) and attach the adapter; returns (model, tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from .load import from_pretrained_kwargs, load_tokenizer
    from .plan import plan as make_plan

    base = adapter_base_model(path)
    if plan is None:
        plan = make_plan(base)
    elif plan.model != base:
        plan = make_plan(base, device=plan.accelerator, dtype=plan.dtype,
                         attention=plan.attention.requested, trust_remote_code=plan.trust_remote_code)
    kwargs = dict(from_pretrained_kwargs(plan))
    if quantized is False:
        kwargs.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    model = PeftModel.from_pretrained(model, os.fspath(path), is_trainable=False)
    model.eval()
    tokenizer_source = path if (Path(path) / "tokenizer_config.json").is_file() else base
    tokenizer = load_tokenizer(plan, tokenizer_source)
    logger.info("Loaded %s + LoRA adapter %s", base, path)
    return model, tokenizer
