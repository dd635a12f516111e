"""`kernel_mapping`: a validated `transformers.KernelConfig` from `{layer: {device: "org/repo:Layer"}}` (X12, X13).

Validation follows `KernelConfig.sanitize_kernel_mapping` (transformers `utils/kernel_config.py`)
but fails earlier and says more: device keys are the ones the installed Transformers accepts
(`KERNELS_SUPPORTED_DEVICE_TYPES`: no `cpu`, no `gpu`, no `hpu`), repo ids are `org/name[:Layer]`,
and with `model=` every layer name must be one the model registers for hub kernels.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from .errors import KernelMappingError

if TYPE_CHECKING:
    from transformers import KernelConfig

#: Used only when the installed transformers does not expose its list (it does in 5.20-5.22).
_FALLBACK_DEVICE_KEYS = ("cuda", "rocm", "xpu", "npu", "neuron", "tpu", "mps")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_LAYER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METADATA_KEYS = {"version", "revision", "trust_remote_code"}
#: Hints for keys users write that are not KernelConfig keys (user spellings, not device kinds).
_KEY_HINTS = {"gpu": "'cuda' (NVIDIA), 'rocm' (AMD) or 'xpu' (Intel GPU)", "intel": "'xpu'", "nvidia": "'cuda'",
              "amd": "'rocm'", "hip": "'rocm'",
              "hpu": "none: hub kernels are not used on Gaudi", "cpu": "none: KernelConfig has no CPU key"}


def device_keys() -> tuple[str, ...]:
    """Device keys `KernelConfig` accepts, read from the installed transformers."""
    try:
        from transformers.utils.kernel_config import KERNELS_SUPPORTED_DEVICE_TYPES
    except ImportError:  # pragma: no cover - older transformers
        return _FALLBACK_DEVICE_KEYS
    return tuple(KERNELS_SUPPORTED_DEVICE_TYPES)


def registered_layers(model: Any) -> dict[str, str]:
    """`{module path: kernel layer name}` of a model, exactly as `KernelConfig.store_registered_layer_names` sees them."""
    from transformers import KernelConfig

    probe = KernelConfig()
    probe.store_registered_layer_names(model)
    return dict(probe.registered_layer_names)


def _check_repo(layer: str, where: str, value: Any, use_local_kernel: bool) -> str:
    if not isinstance(value, str):
        raise KernelMappingError(
            f"kernel for {layer!r}{where} must be a string 'org/repo:Layer' (or a tuple of it and "
            f"{{'version': N}}), got {type(value).__name__} {value!r}."
        )
    repo, sep, layer_name = value.rpartition(":") if ":" in value else (value, "", "")
    if not sep:
        repo, layer_name = value, layer
    if use_local_kernel:
        if not PurePath(repo).is_absolute():
            raise KernelMappingError(
                f"kernel for {layer!r}{where} is {value!r}; with use_local_kernel=True it must be '/abs/path:Layer' "
                "(an absolute path to a kernel checkout)."
            )
    elif not _REPO_ID.match(repo):
        fix = f" e.g. 'kernels-community/{repo}:{layer_name}'" if "/" not in repo else ""
        raise KernelMappingError(
            f"kernel for {layer!r}{where} is {value!r}: the repo id {repo!r} is not 'org/name' (a Hub repo id with "
            f"its organisation); write 'org/name:Layer',{fix} or a local '/abs/path:Layer' with use_local_kernel=True."
        )
    if not _LAYER.match(layer_name):
        raise KernelMappingError(
            f"kernel for {layer!r}{where} is {value!r}: the layer name {layer_name!r} after ':' is not an identifier."
        )
    return f"{repo}:{layer_name}"


def _check_value(layer: str, where: str, value: Any, use_local_kernel: bool) -> Any:
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], Mapping):
            raise KernelMappingError(
                f"kernel for {layer!r}{where} is {value!r}; a tuple must be ('org/repo:Layer', {{'version': N}})."
            )
        repo, metadata = value
        unknown = set(metadata) - _METADATA_KEYS
        if unknown:
            raise KernelMappingError(
                f"kernel metadata for {layer!r}{where} has unknown keys {sorted(unknown)}; allowed: {sorted(_METADATA_KEYS)}."
            )
        if ("version" in metadata) == ("revision" in metadata):
            raise KernelMappingError(
                f"kernel metadata for {layer!r}{where} is {dict(metadata)!r}; give exactly one of 'version' or 'revision'."
            )
        trust = metadata.get("trust_remote_code", False)
        if not isinstance(trust, bool):
            raise KernelMappingError(f"trust_remote_code for {layer!r}{where} must be a bool, got {trust!r}.")
        return (_check_repo(layer, where, repo, use_local_kernel), dict(metadata))
    return _check_repo(layer, where, value, use_local_kernel)


def _check_device(layer: str, key: Any, keys: tuple[str, ...]) -> None:
    if key in keys:
        return
    hint = _KEY_HINTS.get(str(key).lower())
    if hint is None:
        close = difflib.get_close_matches(str(key).lower(), keys, n=1)
        hint = repr(close[0]) if close else "one of the valid keys"
    raise KernelMappingError(
        f"device key {key!r} for layer {layer!r} is not one KernelConfig accepts ({', '.join(keys)}); use {hint}."
    )


def validate_mapping(mapping: Any, *, model: Any = None, use_local_kernel: bool = False) -> dict[str, Any]:
    """Check a kernel mapping and return a normalised copy (`:Layer` filled in); raise `KernelMappingError`."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise KernelMappingError(
            f"kernel mapping must be a non-empty dict {{layer_name: {{device: 'org/repo:Layer'}}}}, got {mapping!r}."
        )
    keys = device_keys()
    layers = set(registered_layers(model).values()) if model is not None else None
    normalised: dict[str, Any] = {}
    for layer, kernel in mapping.items():
        if not isinstance(layer, str) or not layer:
            raise KernelMappingError(f"layer names must be non-empty strings, got {layer!r}.")
        if layers is not None and layer not in layers:
            raise KernelMappingError(
                f"layer {layer!r} is not in the model {type(model).__name__}: its hub-kernel layers are "
                f"{', '.join(sorted(layers)) or 'none'}. Map one of those, or drop {layer!r}."
            )
        if isinstance(kernel, Mapping):
            if not kernel:
                raise KernelMappingError(f"layer {layer!r} maps to an empty dict; give {{device: 'org/repo:Layer'}}.")
            for device in kernel:
                _check_device(layer, device, keys)
            normalised[layer] = {d: _check_value(layer, f" on {d!r}", v, use_local_kernel) for d, v in kernel.items()}
        else:
            normalised[layer] = _check_value(layer, "", kernel, use_local_kernel)
    return normalised


def kernel_mapping(mapping: Any, *, model: Any = None, use_local_kernel: bool = False,
                   inherit_mapping: bool = True) -> KernelConfig:
    """Validate `mapping` and return the `transformers.KernelConfig` for `from_pretrained(kernel_config=...)`.

    A value without `:Layer` takes the mapping's layer name (`"org/rmsnorm"` for `"RMSNorm"` means
    `"org/rmsnorm:RMSNorm"`). With `model=`, Transformers' own `sanitize_kernel_mapping` runs too.
    """
    from transformers import KernelConfig

    normalised = validate_mapping(mapping, model=model, use_local_kernel=use_local_kernel)
    config = KernelConfig(kernel_mapping=normalised, use_local_kernel=use_local_kernel,
                          inherit_mapping=inherit_mapping)
    if model is not None:
        try:
            config.sanitize_kernel_mapping(model)
        except ValueError as error:  # Transformers' own rules, should we have missed one
            raise KernelMappingError(f"KernelConfig rejected the mapping: {error}") from error
    return config
