"""What a resume must match (issue 42 point 1): the run recorded in the checkpoint's manifest against this run.

Every checkpoint's manifest holds `run`: the kind (lora / qlora / full), the model (as given, its identity
and the sha256 of its config.json), the data (sha256 of the documents read), the block size and the LoRA
shape (r, alpha, targets). A resume compares each before anything loads and refuses on any difference,
naming each and the fix: before, a `--resume` into another model's run folder trained on, replaced that
run's final adapter, and checkpoint rotation deleted its last checkpoints.

Checkpoints written before a field was recorded are compared on what they hold (the kind and the model as
given; the LoRA r, alpha and targets from the checkpoint's own adapter_config.json), and the reason names what
could not be compared.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import TrainingConfigError

logger = logging.getLogger(__name__)

#: config.json keys that change when the same model is saved again (they do not change a weight).
VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path", "_commit_hash")
#: The identity of the model that ships inside hwrun (its path moves with the install).
SHIPPED_MODEL = "hwrun:tiny-llama"
#: The fields a resume compares, in the order a refusal names them, with the option that sets each.
FIELDS = {"kind": "--lora / --qlora", "model_id": "--model", "config_sha256": "--model", "data_sha256": "--data",
          "block_size": "--block-size", "lora_r": "--lora-r", "lora_alpha": "--lora-alpha",
          "lora_targets": "--lora-targets", "quantization": "--quantize / --qlora"}
_LABELS = {"kind": "run kind", "model_id": "model", "config_sha256": "model config.json (sha256)",
           "data_sha256": "training data (sha256 of the documents)", "block_size": "block size",
           "lora_r": "LoRA r", "lora_alpha": "LoRA alpha", "lora_targets": "LoRA targets",
           "quantization": "quantization of the base"}


def model_identity(reference: str) -> str:
    """A model reference as a resume compares it: a local folder as its absolute path (symlinks kept, so a
    model that moved can be passed through a link at its old path), the shipped tiny model as
    `hwrun:tiny-llama` (its path changes with the install), a Hub id as it is."""
    from ..model.source import DEFAULT_MODEL

    text = os.fspath(reference)
    path = Path(text).expanduser()
    if os.path.realpath(path) == os.path.realpath(DEFAULT_MODEL):
        return SHIPPED_MODEL
    if path.exists() or text.startswith((".", "/", "~")):
        return os.path.abspath(path)
    return text


def config_sha256(config: Mapping[str, Any] | None) -> str | None:
    """sha256 of a config.json's settings (keys sorted; the keys a re-save changes left out), or None."""
    if not isinstance(config, Mapping):
        return None
    kept = {key: value for key, value in config.items() if key not in VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def data_sha256(texts: Iterable[str]) -> str:
    """sha256 over the training documents in their order (each length-prefixed, so a document boundary that
    moves changes the hash)."""
    digest = hashlib.sha256()
    for text in texts:
        raw = text.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def _targets(names: Any) -> str | None:
    if names is None:
        return None
    if isinstance(names, str):
        return names
    return ",".join(sorted({str(name) for name in names}))


def run_record(plan: Any, kind: str, settings: Any, block_size: int | None) -> dict[str, Any]:
    """The record stamped into every checkpoint's manifest (`data_sha256` is added once the data is read)."""
    from ..model.source import resolve_source

    config = resolve_source(plan.model).config
    record: dict[str, Any] = {"kind": kind, "model": plan.model, "model_id": model_identity(plan.model),
                              "config_sha256": config_sha256(config), "block_size": block_size,
                              "quantization": getattr(plan, "quantization", None) or "none"}
    if settings is not None:
        from .lora import lora_targets

        model_type = (config or {}).get("model_type")
        targets = (lora_targets(model_type, settings.target_modules).modules if model_type
                   else settings.target_modules)
        record.update(lora_r=settings.r, lora_alpha=settings.alpha,
                      lora_targets=_targets(targets) if targets is not None else "peft's default")
    return record


def _from_adapter_config(folder: Path) -> dict[str, Any]:
    """r, alpha and targets of a LoRA checkpoint written before hwrun recorded them (its adapter_config.json)."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    found = {"lora_r": config.get("r"), "lora_alpha": config.get("lora_alpha")}
    targets = config.get("target_modules")
    if isinstance(targets, (list, str)):
        found["lora_targets"] = _targets(targets)
    return {key: value for key, value in found.items() if value is not None}


def _show(name: str, value: Any) -> str:
    if name in ("config_sha256", "data_sha256") and isinstance(value, str):
        return value[:12]
    if name == "model_id" and value == SHIPPED_MODEL:
        return "hwrun's shipped tiny-llama (no --model)"
    return repr(value) if not isinstance(value, str) else value


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any], folder: str | Path,
                fields: Iterable[str] = FIELDS) -> tuple[list[str], dict[str, str]]:
    """(what differs, {field: why it could not be compared}) between a checkpoint's run record and this run's."""
    recorded = dict(recorded)
    if "model_id" not in recorded and isinstance(recorded.get("model"), str):
        recorded["model_id"] = model_identity(recorded["model"])  # written before identities were recorded
    if current.get("kind") in ("lora", "qlora") and "lora_r" not in recorded:
        recorded.update(_from_adapter_config(Path(folder)))
    differ, unknown = [], {}
    for name in fields:
        if current.get(name) is None:
            if name in current:
                unknown[name] = "not known for this run"
            continue
        if recorded.get(name) is None:
            unknown[name] = "not recorded in the checkpoint"
            continue
        if recorded[name] != current[name]:
            differ.append(f"{_LABELS[name]}: the checkpoint has {_show(name, recorded[name])}, this run "
                          f"{_show(name, current[name])} ({FIELDS[name]})")
    return differ, unknown


def check_resume_matches(folder: str | Path, recorded: Mapping[str, Any], current: Mapping[str, Any],
                         fields: Iterable[str] = FIELDS) -> str:
    """Refuse (TrainingConfigError) a resume from `folder` whose recorded run differs from `current` in any of
    `fields`, naming each difference and the fix; else return what was compared (for the run's reasons)."""
    fields = [name for name in fields if name in current]
    differ, unknown = differences(recorded, current, folder, fields)
    if differ:
        raise TrainingConfigError(
            f"Cannot resume from {str(folder)!r}: it was written by another run ({'; '.join(differ)}). Resuming "
            "would load its weights and optimizer state into a different run, replace that run's final model and "
            "rotate its checkpoints away. Fix: resume with the checkpoint's values of the options named, or start "
            "this run in a new output_dir (--output)."
        )
    summary = "same " + ", ".join(_LABELS[name] for name in fields if name not in unknown) + " as the checkpoint"
    if unknown:
        summary += "; not compared: " + ", ".join(f"{_LABELS[name]} ({why})" for name, why in unknown.items())
        logger.warning("Resuming from %s: %s.", folder, summary)
    return summary
