"""Adapter folders: saving a fine-tuned model (LoRA adapter alone, or merged into the base weights, safetensors
either way), checking a folder before it loads, and translating PEFT's refusals. Loading one (base model +
adapter) is `hwrun.model.load.load_adapter_model`: this module imports nothing else of `hwrun.model`, so
planning (which checks adapter folders) and loading import it without a circle."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import AdapterFormatError, ModelIntegrityError, ModelSourceError, TrainingConfigError
from .integrity import safetensors_header, verify_output

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
#: PEFT's adapter weight files (peft.utils.constants SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME).
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """True when `path` is a PEFT adapter folder (adapter_config.json, no full config.json)."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def _read_adapter_config(path: str | os.PathLike, error_class: type[Exception]) -> tuple[Path, Any]:
    """(path of `path`'s adapter_config.json, its parsed JSON); an unreadable file raises `error_class`."""
    config_path = Path(path) / ADAPTER_CONFIG
    try:
        return config_path, json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise error_class(
            f"{config_path} is unreadable ({error}); an adapter folder needs a valid adapter_config.json. "
            "Fix: re-save the adapter with `hwrun train`."
        ) from None


def adapter_base_model(path: str | os.PathLike) -> str:
    """The base model an adapter folder was trained on (`base_model_name_or_path`)."""
    config_path, config = _read_adapter_config(path, TrainingConfigError)
    base = config.get("base_model_name_or_path")
    if not base:
        raise TrainingConfigError(
            f"{config_path} names no base_model_name_or_path; hwrun cannot tell which model the adapter "
            "belongs to. Fix: add the base model's path to it."
        )
    _check_base(config_path, str(base))
    return str(base)


def _check_base(config_path: Path, base: str) -> None:
    """The base an adapter names must be usable: a missing or broken one is this adapter_config.json's field, not
    the user's --model (before: "model='/gone' does not exist ... omit --model", issue 42.8)."""
    from .source import _looks_like_hub_id, resolve_source

    fix = (f"Fix: put the base model there, or set base_model_name_or_path in {config_path} to the folder or Hub id "
           "of the model the adapter was trained on.")
    if not Path(base).expanduser().exists() and not _looks_like_hub_id(base):
        raise AdapterFormatError(f"the adapter's base model {base!r} (base_model_name_or_path in {config_path}) does "
                                 f"not exist: no such folder here, and not a Hub id of the form 'org/name'. {fix}")
    try:
        resolve_source(base)
    except ModelSourceError as error:
        raise AdapterFormatError(f"the adapter's base model (base_model_name_or_path in {config_path}) cannot be "
                                 f"used: {error} {fix}") from None


def check_adapter_weights(path: str | os.PathLike, *, allow_pickle: bool = False) -> Path:
    """The adapter weight file PEFT will read from `path`: adapter_model.safetensors. A folder holding only
    adapter_model.bin (a pickle, which can run code while it loads) is refused unless `allow_pickle=True`."""
    if not isinstance(allow_pickle, bool):
        raise TrainingConfigError(f"allow_pickle={allow_pickle!r} must be True or False.")
    folder = Path(path)
    if (folder / ADAPTER_SAFETENSORS).is_file():
        check_adapter_config(folder)
        _whole(folder / ADAPTER_SAFETENSORS)
        verify_output(folder)  # hwrun's own adapter: every byte against the sha256 it recorded (issue 42)
        check_finite(folder / ADAPTER_SAFETENSORS)  # a NaN adapter generated nothing, exit 0 (issue 42.8)
        return folder / ADAPTER_SAFETENSORS
    if (folder / ADAPTER_PICKLE).is_file():
        if allow_pickle:
            check_adapter_config(folder)
            logger.warning("Loading %s, a pickle file (allow_pickle=True): only do this for files you trust.",
                           folder / ADAPTER_PICKLE)
            return folder / ADAPTER_PICKLE
        raise AdapterFormatError(
            f"Adapter folder {str(folder)!r} holds its weights only as {ADAPTER_PICKLE}, a pickle file that can run "
            f"code while it loads; hwrun loads {ADAPTER_SAFETENSORS} only. Fix: convert it once where you trust it "
            "(PeftModel.from_pretrained(...).save_pretrained(folder, safe_serialization=True)), or opt in with "
            "load_adapter_model(folder, plan, allow_pickle=True) if you trust its source."
        )
    raise AdapterFormatError(
        f"Adapter folder {str(folder)!r} has {ADAPTER_CONFIG} but no {ADAPTER_SAFETENSORS}: there are no adapter "
        "weights to load. Fix: point at the folder `hwrun train` wrote (it holds both files), or re-save the adapter."
    )


def _whole(file: Path) -> None:
    """The adapter's safetensors header is whole (a damaged one is named here, not by safetensors' own error)."""
    try:
        safetensors_header(file)
    except ModelIntegrityError as error:
        raise AdapterFormatError(f"Adapter weights {error}") from None


#: safetensors float dtypes: (bytes per value, the exponent bits; all of them set is an inf or a NaN).
_FLOAT_EXPONENTS = {"F64": (8, 0x7FF0000000000000), "F32": (4, 0x7F800000), "F16": (2, 0x7C00), "BF16": (2, 0x7F80)}
_UNSIGNED = {8: "<u8", 4: "<u4", 2: "<u2"}


def check_finite(file: str | os.PathLike) -> None:
    """Every float value in the adapter weights `file` is finite; else an AdapterFormatError naming the tensor and
    how many values are NaN or infinite (PEFT loads such an adapter and the model then generates nothing, exit 0).
    Reads the bytes once through a memory map (numpy, no torch): an adapter is small, this costs milliseconds."""
    import mmap

    import numpy as np

    file = Path(file)
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        tensors = json.loads(handle.read(length))
        if file.stat().st_size == 8 + length:
            return  # no tensor data
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for name, info in tensors.items():
                if name == "__metadata__" or info.get("dtype") not in _FLOAT_EXPONENTS:
                    continue
                width, mask = _FLOAT_EXPONENTS[info["dtype"]]
                start, end = (8 + length + int(offset) for offset in info["data_offsets"])
                bits = np.frombuffer(data, dtype=_UNSIGNED[width], count=(end - start) // width, offset=start)
                bad = int(np.count_nonzero((bits & mask) == mask))
                del bits  # the mmap closes only once no view of it is left
                if bad:
                    raise AdapterFormatError(
                        f"{file}: tensor {name!r} holds {bad:,} NaN or infinite value(s) of {(end - start) // width:,};"
                        " a model with this adapter generates nothing useful. The training that wrote it diverged "
                        "(or the file was damaged). Fix: use an earlier checkpoint, or train again with a lower --lr "
                        "(hwrun train stops a diverging run before it saves).")


#: adapter_config.json fields PEFT's LoRA reads, with the rule each must follow.
_LORA_FIELDS = {
    "r": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
    "lora_alpha": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "target_modules": (lambda v: v is None or isinstance(v, str) or (isinstance(v, list) and v and all(
        isinstance(name, str) and name for name in v)), "a module name, a non-empty list of names, or null"),
    "base_model_name_or_path": (lambda v: isinstance(v, str) and v.strip(), "the base model's folder or Hub id"),
}


def check_adapter_config(path: str | os.PathLike) -> dict:
    """`path`'s adapter_config.json, checked before PEFT reads it: a JSON object whose LoRA fields (r, lora_alpha,
    target_modules, base_model_name_or_path) have the types PEFT needs; else an AdapterFormatError naming the
    file, the field and the rule (before: PEFT's TypeError surfaced as an internal error)."""
    config_path, config = _read_adapter_config(path, AdapterFormatError)
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{config_path} holds a JSON {type(config).__name__}, not an object of adapter "
                                 "settings. Fix: re-save the adapter with `hwrun train`.")
    if config.get("peft_type", "LORA") == "LORA":
        for name, (valid, rule) in _LORA_FIELDS.items():
            if name in config and not valid(config[name]):
                raise AdapterFormatError(f"{config_path}: {name}={config[name]!r} must be {rule}. Fix: correct it, "
                                         "or re-save the adapter with `hwrun train`.")
    return config


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


def adapter_load_error(path: str | os.PathLike, base: str, error: BaseException) -> AdapterFormatError:
    """PEFT's, torch's or safetensors' refusal of an adapter as an AdapterFormatError naming the file, what is
    wrong and the fix. A pickle that torch's weights-only loader refused is named as such, without relaying
    torch's advice to turn that protection off."""
    folder = Path(path)
    text = " ".join(str(error).split())
    name = type(error).__name__
    if "weights_only" in text or name == "UnpicklingError":
        return AdapterFormatError(
            f"{folder / ADAPTER_PICKLE} was refused by torch's safe (weights-only) loader: the pickle holds more than "
            "tensors, which can run code while it loads. Fix: use adapter_model.safetensors from the adapter's "
            "source, or convert the file where you trust it."
        )
    if "size mismatch" in text:
        return AdapterFormatError(
            f"Adapter {str(folder)!r} does not fit its base model {base!r}: its weights have other shapes "
            f"({text[:240]}). Fix: load it on the model it was trained on (base_model_name_or_path in "
            f"{ADAPTER_CONFIG}).")
    if name == "NoMatchingPeftModuleError" or "not found in the base model" in text:
        return AdapterFormatError(
            f"{folder / ADAPTER_CONFIG}: target_modules names no module of the base model {base!r} ({text[:200]}). "
            "Fix: load it on the model it was trained on, or correct target_modules.")
    if name == "SafetensorError" or "safetensors" in text.lower() or "header" in text.lower():
        return AdapterFormatError(f"{folder / ADAPTER_SAFETENSORS} cannot be read as safetensors ({text[:200]}): the "
                                  "file is damaged. Fix: save or download the adapter again.")
    return AdapterFormatError(f"Adapter {str(folder)!r} could not be loaded onto {base!r} ({name}: {text[:240]}). "
                              "Fix: check adapter_config.json and the adapter weights, or re-save the adapter with "
                              "`hwrun train`.")
