"""`kernel_mapping`: a validated `transformers.KernelConfig` from `{layer: {device: "org/repo:Layer"}}` (X12, X13).

Validation follows `KernelConfig.sanitize_kernel_mapping` (transformers `utils/kernel_config.py`)
but fails earlier and says more: device keys are the ones the installed Transformers accepts
(`KERNELS_SUPPORTED_DEVICE_TYPES`: no `cpu`, no `gpu`, no `hpu`), repo ids are `org/name[:Layer]`,
and with `model=` every layer name must be one the model registers for hub kernels.

Trust (issue 27 point 8): a hub kernel is native code. A repository outside the trusted
organisations (`kernels-community`, the one Transformers loads without `allow_all_kernels`) is
refused unless the caller allows it (`allowed_orgs=("myorg",)` or `allow_repos=("myorg/repo",)`),
and `trust_remote_code: True` in a mapping's metadata (which lets `kernels` load a repository
from a publisher the Hub does not mark as trusted, without asking) is refused unless the caller
passed `trust_remote_code=True` itself. Both raise `KernelTrustError`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from .errors import KernelMappingError, KernelTrustError
from .names import TRUSTED_KERNEL_ORG

if TYPE_CHECKING:
    from transformers import KernelConfig

#: Organisations whose hub kernels a mapping may name without an explicit allow.
TRUSTED_KERNEL_ORGS: tuple[str, ...] = (TRUSTED_KERNEL_ORG,)
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


def _names(value: Any, what: str, pattern: re.Pattern[str]) -> frozenset[str]:
    """`allowed_orgs` / `allow_repos` as a set: one string or an iterable of strings, each well formed."""
    items = (value,) if isinstance(value, str) else value
    try:
        names = tuple(items)
    except TypeError:
        raise KernelMappingError(f"{what} must be a string or a list of strings, got {value!r}.") from None
    for name in names:
        if not isinstance(name, str) or not pattern.match(name):
            example = "'myorg'" if what == "allowed_orgs" else "'myorg/my-kernel'"
            raise KernelMappingError(f"{what} entry {name!r} is not a Hub {what[:-1].split('_')[-1]} name; "
                                     f"write e.g. {what}=({example},).")
    return frozenset(names)


_ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _entries(mapping: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """`(layer, where, value)` for every kernel of a mapping (per device, or one value for every device)."""
    found = []
    for layer, kernel in mapping.items():
        if isinstance(kernel, Mapping):
            found += [(layer, f" on {device!r}", value) for device, value in kernel.items()]
        else:
            found.append((layer, "", kernel))
    return found


def check_trust(mapping: Mapping[str, Any], *, use_local_kernel: bool = False, allowed_orgs: Any = (),
                allow_repos: Any = (), trust_remote_code: bool = False) -> None:
    """Refuse, with `KernelTrustError`, a kernel repository outside `TRUSTED_KERNEL_ORGS` + `allowed_orgs` /
    `allow_repos`, and `trust_remote_code: True` in the mapping unless `trust_remote_code=True` is passed here.

    Local kernels (`use_local_kernel=True`: paths the user named) have no organisation to check.
    """
    if not isinstance(trust_remote_code, bool):
        raise KernelMappingError(f"trust_remote_code must be True or False, got {trust_remote_code!r}.")
    orgs = set(TRUSTED_KERNEL_ORGS) | _names(allowed_orgs, "allowed_orgs", _ORG)
    repos = _names(allow_repos, "allow_repos", _REPO_ID)
    for layer, where, value in _entries(mapping):
        name, metadata = value if isinstance(value, tuple) and len(value) == 2 else (value, {})
        if not isinstance(name, str):
            continue  # the shape is validate_mapping's to refuse
        repo = name.rpartition(":")[0] if ":" in name else name
        if isinstance(metadata, Mapping) and metadata.get("trust_remote_code") is True and not trust_remote_code:
            raise KernelTrustError(
                f"kernel for {layer!r}{where} is {name!r} with trust_remote_code=True in the mapping: that lets "
                f"`kernels` load {repo!r} even when the Hub does not mark its publisher as a trusted kernel publisher, "
                f"and a mapping may not ask for it by itself. Pass trust_remote_code=True yourself (to kernel_mapping, "
                f"load_kwargs or kernel_plan) if you trust {repo!r}, or drop trust_remote_code from the mapping."
            )
        if use_local_kernel:
            continue
        org = repo.partition("/")[0]
        if org not in orgs and repo not in repos:
            allowed = ", ".join(sorted(orgs))
            raise KernelTrustError(
                f"kernel for {layer!r}{where} is {name!r}: organisation {org!r} is not one the mapping may use "
                f"without an explicit allow (allowed: {allowed}). Hub kernels are native code run at load; allow it "
                f"with allowed_orgs=({org!r},) or allow_repos=({repo!r},) (kernel_mapping, load_kwargs, kernel_plan), "
                f"or use a {TRUSTED_KERNEL_ORG} kernel."
            )


def validate_mapping(mapping: Any, *, model: Any = None, use_local_kernel: bool = False, allowed_orgs: Any = (),
                     allow_repos: Any = (), trust_remote_code: bool = False) -> dict[str, Any]:
    """Check a kernel mapping and return a normalised copy (`:Layer` filled in); raise `KernelMappingError`
    (`KernelTrustError` for the trust rules: `check_trust`)."""
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
    check_trust(normalised, use_local_kernel=use_local_kernel, allowed_orgs=allowed_orgs, allow_repos=allow_repos,
                trust_remote_code=trust_remote_code)
    return normalised


def kernel_mapping(mapping: Any, *, model: Any = None, use_local_kernel: bool = False,
                   inherit_mapping: bool = True, allowed_orgs: Any = (), allow_repos: Any = (),
                   trust_remote_code: bool = False) -> KernelConfig:
    """Validate `mapping` and return the `transformers.KernelConfig` for `from_pretrained(kernel_config=...)`.

    A value without `:Layer` takes the mapping's layer name (`"org/rmsnorm"` for `"RMSNorm"` means
    `"org/rmsnorm:RMSNorm"`). With `model=`, Transformers' own `sanitize_kernel_mapping` runs too.
    Repositories outside `kernels-community` need `allowed_orgs` / `allow_repos`; `trust_remote_code`
    in the mapping needs `trust_remote_code=True` here (`check_trust`).
    """
    from transformers import KernelConfig

    normalised = validate_mapping(mapping, model=model, use_local_kernel=use_local_kernel, allowed_orgs=allowed_orgs,
                                  allow_repos=allow_repos, trust_remote_code=trust_remote_code)
    config = KernelConfig(kernel_mapping=normalised, use_local_kernel=use_local_kernel,
                          inherit_mapping=inherit_mapping)
    if model is not None:
        try:
            config.sanitize_kernel_mapping(model)
        except ValueError as error:  # Transformers' own rules, should we have missed one
            raise KernelMappingError(f"KernelConfig rejected the mapping: {error}") from error
    return config
