"""Where a model comes from (local folder or Hub id) and how big its weights are, without loading it.

`resolve_source()` checks a local path before anything loads (missing path, no config.json,
no *.safetensors are errors); `weight_bytes()` reads only the safetensors JSON headers, or
estimates from config.json, so `plan()` can choose a device_map (X9) in milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelSourceError

logger = logging.getLogger(__name__)

#: The tiny Llama that ships inside the package (trained by tools/train_tiny_model.py).
DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "models" / "tiny-llama")

#: Bytes per element of each dtype name that safetensors headers use.
_SAFETENSORS_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}
#: Bytes per parameter after loading, by the dtype the plan chose; quantized linear layers are smaller.
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
QUANT_BYTES = {"8bit": 1.0, "4bit": 0.5}


@dataclass(frozen=True)
class ModelSource:
    """A model reference after checking: `local` path or Hub `repo_id`, its config.json as a dict if readable."""

    reference: str
    local: bool
    path: Path | None
    config: dict | None
    safetensors: tuple[Path, ...] = ()


def _looks_like_hub_id(reference: str) -> bool:
    parts = reference.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not reference.startswith((".", "/", "~"))
        and not any(ch in reference for ch in ("\\", " ", ":"))
    )


def resolve_source(reference: str) -> ModelSource:
    """Check a model reference before loading: a local folder must hold config.json and *.safetensors.

    Anything that is not an existing path and does not look like `org/name` is a missing path.
    A Hub id is accepted here (its config is read from the local Hub cache if present, never
    downloaded); whether it is reachable is decided by `load()`.
    """
    if not isinstance(reference, (str, os.PathLike)) or not str(reference).strip():
        raise ModelSourceError(
            f"model={reference!r} is not a model reference; pass a local folder with config.json and "
            "*.safetensors, or a Hub id such as 'org/name' (or nothing, for the shipped tiny model)."
        )
    text = os.fspath(reference)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelSourceError(
                f"model={text!r} is a file, but a model is a folder holding config.json and *.safetensors; "
                "pass the folder that contains it."
            )
        files = tuple(sorted(path.glob("*.safetensors")))
        if not files:
            found = sorted(p.name for p in path.iterdir())[:8]
            bins = [n for n in found if n.endswith((".bin", ".pt", ".pth"))]
            hint = (
                f" It holds {', '.join(bins)}: hwrun loads safetensors only (pickle files can run code); convert "
                "them with `model.save_pretrained(dir, safe_serialization=True)`." if bins else ""
            )
            raise ModelSourceError(
                f"model={text!r} has no *.safetensors weights (found: {', '.join(found) or 'nothing'}).{hint} "
                "Point at a folder written by save_pretrained()."
            )
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelSourceError(
                f"model={text!r} has weights but no config.json; save the model with save_pretrained() so "
                "the config sits next to the weights."
            )
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"model={text!r}: config.json is not readable JSON ({exc}); re-save the model.") from exc
        check_config(config, f"model={text!r}: config.json")
        return ModelSource(text, True, path.resolve(), config, files)
    if path == Path(DEFAULT_MODEL):
        raise ModelSourceError(
            f"the shipped tiny model is missing from this install ({text}); reinstall hwrun "
            "(`uv sync` / `pip install --force-reinstall hwrun`) or pass --model PATH."
        )
    if _looks_like_hub_id(text):
        return ModelSource(text, False, None, _cached_hub_config(text), ())
    raise ModelSourceError(
        f"model={text!r} does not exist: it is neither a local folder nor a Hub id of the form 'org/name'. "
        "Check the path, or omit --model to use the shipped tiny model."
    )


def check_config(config: object, where: str) -> None:
    """A config.json must be a JSON object naming its `model_type` (what Transformers' Auto classes read)."""
    if not isinstance(config, dict):
        raise ModelSourceError(f"{where} holds a JSON {type(config).__name__}, not an object with the model's "
                               "settings; re-save the model with save_pretrained().")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelSourceError(f"{where} has no `model_type` (found {model_type!r}); Transformers needs it to pick the "
                               "model class. Re-save the model with save_pretrained(), or add the right model_type.")
    for section, values in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(values, dict) or "max_position_embeddings" not in values:
            continue
        length = values["max_position_embeddings"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ModelSourceError(f"{where}: {section}max_position_embeddings={length!r} must be a positive integer "
                                   "(the longest context the model was built for: no prompt would fit). Fix the "
                                   "value in config.json, or re-save the model with save_pretrained().")


def needs_remote_code(config: dict | None) -> str | None:
    """Why loading needs the model's own Python code (`auto_map` for a model_type Transformers lacks), or None."""
    if not config or not config.get("auto_map"):
        return None
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING_NAMES:
        return None
    return (f"model_type {model_type!r} is not one of Transformers' built-in models and config.json's auto_map "
            f"names the model's own code ({', '.join(sorted(config['auto_map'].values()))})")


def _cached_hub_config(repo_id: str) -> dict | None:
    """config.json of a Hub model from the local Hub cache only (no network), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception as exc:  # noqa: BLE001 - a cache miss of any kind means "unknown"
        logger.debug("no cached config for %s: %s", repo_id, exc)
        return None
    if isinstance(found, str) and os.path.isfile(found):
        try:
            return json.loads(Path(found).read_text())
        except (OSError, ValueError):
            return None
    return None


def safetensors_tensors(files: tuple[Path, ...]) -> list[tuple[str, int]]:
    """(tensor name, number of elements) of every tensor in safetensors headers (headers only; the files were checked
    whole by `safetensors_elements` when the plan read them)."""
    tensors = []
    for file in files:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            count = 1
            for dim in info.get("shape", ()):
                count *= int(dim)
            tensors.append((name, count))
    return tensors


def safetensors_elements(files: tuple[Path, ...]) -> tuple[int, int]:
    """(number of elements, bytes on disk) summed over the tensors in safetensors headers (header only)."""
    elements = 0
    nbytes = 0
    for file in files:
        with open(file, "rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise ModelSourceError(f"{file} is not a safetensors file (shorter than its 8-byte header length).")
            (length,) = struct.unpack("<Q", raw)
            if length > 100_000_000:
                raise ModelSourceError(f"{file}: safetensors header length {length} is implausible; the file is damaged.")
            try:
                header = json.loads(handle.read(length))
            except ValueError as exc:
                raise ModelSourceError(f"{file}: its safetensors header is not valid JSON ({exc}); the file is damaged "
                                       "or truncated: download or save it again.") from exc
        if not isinstance(header, dict):
            raise ModelSourceError(f"{file}: its safetensors header is not a JSON object; the file is damaged.")
        size = file.stat().st_size
        data_end = max((int(info["data_offsets"][1]) for name, info in header.items()
                        if name != "__metadata__" and isinstance(info, dict) and "data_offsets" in info), default=0)
        if 8 + length + data_end != size:
            raise ModelSourceError(
                f"{file} is {size:,} bytes but its header describes {8 + length + data_end:,}: the file is "
                f"{'truncated' if size < 8 + length + data_end else 'longer than its tensors'}; download or save it again.")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            elements += count
            nbytes += count * _SAFETENSORS_BYTES.get(info["dtype"], 4)
    return elements, nbytes


def config_parameters(config: dict) -> int | None:
    """Parameter count of a decoder-only transformer estimated from config.json, or None if fields are missing."""
    cfg = config.get("text_config", config)
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
        inter = int(cfg.get("intermediate_size", 4 * hidden))
        heads = int(cfg.get("num_attention_heads", 1))
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    mlp = 3 * hidden * inter
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return layers * per_layer + embeddings + hidden


def weight_bytes(source: ModelSource, dtype: str, quantization: str | None = None) -> tuple[int | None, str]:
    """Estimated bytes of the weights once loaded in `dtype` (or quantized), and how it was estimated."""
    per_param = QUANT_BYTES[quantization] if quantization else DTYPE_BYTES[dtype]
    if source.safetensors:
        elements, on_disk = safetensors_elements(source.safetensors)
        return int(elements * per_param), f"safetensors headers: {elements:,} parameters ({on_disk:,} bytes on disk)"
    if source.config:
        params = config_parameters(source.config)
        if params is not None:
            return int(params * per_param), f"config.json: about {params:,} parameters"
    return None, "unknown (no local weights or cached config.json to read)"


def model_config(source: ModelSource) -> dict | None:
    """The model's config.json as read by `resolve_source` (no weights, no model code), or None: what
    hwattn reads for the model class's declared attention (`architectures` / `model_type` at the top
    level) and the GQA head counts (its `text_config` for multimodal models)."""
    return source.config or None
