"""`load_kwargs` (the `from_pretrained` keywords) and `load_kernel` (a hub kernel, with an offline-aware error).

Nothing here downloads at import time; `load_kernel` is the only function that may reach the
Hub, and when it cannot (offline, `HF_HUB_OFFLINE=1`, no network) its error says how to use a
local kernel checkout instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from hwenv import Accelerator

from .capabilities import hub_kernels
from .errors import KernelsMissingError, KernelsUnsupportedError, KernelUnavailableError
from .kernel_map import check_trust, device_keys, kernel_mapping
from .resolve import KERNELS_INSTALL_HINT, _kernels_problem, resolve_attention

logger = logging.getLogger(__name__)


def load_kwargs(
    accel: Accelerator,
    attention: str = "auto",
    use_kernels: bool = False,
    mapping: Any = None,
    *,
    model_config: object | None = None,
    fallback: bool = False,
    allowed_orgs: Any = (),
    allow_repos: Any = (),
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Keywords for `from_pretrained`: always `attn_implementation` and `use_kernels` (False unless kernels are
    used: Transformers 5.25 turns hub kernels on when it is absent); `kernel_config` when asked.

    A `mapping` (dict for `kernel_mapping`, or a `KernelConfig`) implies `use_kernels=True` (as in
    Transformers) and always goes as `kernel_config`, narrowed to `accel`'s device (`for_device`), on
    every device alike: so its `inherit_mapping` / `use_local_kernel` decide what the layers without an
    entry get, never Transformers' default mapping by omission. Where the narrowed mapping is empty
    and inherits nothing, no kernel could be used: kernels are not asked for, and a warning says so.
    Where hub kernels are not used (Gaudi: `capabilities.HUB_KERNELS`) they are refused, or dropped with a logged note when `fallback=True`.
    A mapping (a `KernelConfig` too) naming a repository outside `kernels-community` needs `allowed_orgs` /
    `allow_repos`, and `trust_remote_code` in it needs `trust_remote_code=True` here (`KernelTrustError`).
    """
    from transformers import KernelConfig

    from .environment import kernels_available

    choice = resolve_attention(accel, attention, model_config=model_config, fallback=fallback)
    # use_kernels is always said: from transformers 5.25 an absent use_kernels means True (hub kernels on
    # by default, fetched from the Hub at load), so "off" must be passed to keep the model's own layers
    kwargs: dict[str, Any] = {"attn_implementation": choice.implementation, "use_kernels": False}
    if not isinstance(use_kernels, bool):
        raise KernelsUnsupportedError(f"use_kernels must be True or False, got {use_kernels!r}.")
    if not use_kernels and mapping is None:
        return kwargs
    hub = hub_kernels(accel.kind)
    if hub.kernels_device is None:
        why = hub.reason
        if not fallback:
            raise KernelsUnsupportedError(
                f"use_kernels={use_kernels}, mapping={'given' if mapping is not None else None} on {accel.name}: "
                f"{why}. Drop use_kernels/mapping, or pass fallback=True to load without them."
            )
        logger.warning("hub kernels dropped: %s; loading with the PyTorch layers", why)
        return kwargs
    narrowed = None
    if mapping is not None:
        trust = {"allowed_orgs": allowed_orgs, "allow_repos": allow_repos, "trust_remote_code": trust_remote_code}
        if isinstance(mapping, KernelConfig):
            check_trust(mapping.kernel_mapping or {}, use_local_kernel=mapping.use_local_kernel, **trust)
            config = mapping
        else:
            config = kernel_mapping(mapping, **trust)
        narrowed = for_device(config, accel.kind)
        if narrowed is None:
            narrowed = _like(config, {})
        if not narrowed.kernel_mapping and not _inherits(narrowed):
            logger.warning(
                "kernel mapping has no entry usable on %s and inherits no defaults (%s): no layer would get a hub "
                "kernel; loading without hub kernels (use_kernels not set)", accel.kind, _inherit_flags(narrowed))
            return kwargs
    if not kernels_available():
        raise KernelsMissingError(
            f"use_kernels=True needs `kernels` (X12): {_kernels_problem()}. Fix: {KERNELS_INSTALL_HINT}."
        )
    kwargs["use_kernels"] = True
    if narrowed is not None:
        kwargs["kernel_config"] = narrowed
    return kwargs


def _inherits(config: Any) -> bool:
    """Whether kernelize adds Transformers' default mapping (`hub_kernels.kernelize`: not for local kernels)."""
    return bool(config.inherit_mapping) and not config.use_local_kernel


def _inherit_flags(config: Any) -> str:
    return ("use_local_kernel=True" if config.use_local_kernel and config.inherit_mapping
            else f"inherit_mapping={config.inherit_mapping}")


def _like(config: Any, kernel_mapping: dict[str, Any]) -> Any:
    from transformers import KernelConfig

    return KernelConfig(kernel_mapping=kernel_mapping, use_local_kernel=config.use_local_kernel,
                        inherit_mapping=config.inherit_mapping)


def for_device(config: Any, kind: str) -> Any:
    """The `KernelConfig` with only `kind`'s entry per layer, or None when no layer has one.

    `from_pretrained` (transformers 5.22, `register_kernel_replacements_and_fusions`) accepts
    exactly one repo per layer, so a multi-device mapping must be narrowed to the device loaded on.
    An entry without device keys is kept where Transformers can bind it to the model's device
    (`KernelConfig.create_compatible_mapping` -> `add_to_mapping`, which accepts only
    `KERNELS_SUPPORTED_DEVICE_TYPES`): not on CPU. Dropped layers are logged with what they get instead.
    """
    narrowed, dropped, unbound = {}, [], []
    key = hub_kernels(kind).config_key  # KernelConfig's name for this kind (None on CPU and Gaudi)
    bindable = key is not None and key in device_keys()
    for layer, kernel in config.kernel_mapping.items():
        if not isinstance(kernel, dict):
            if bindable:
                narrowed[layer] = kernel
            else:
                unbound.append(layer)
        elif key is not None and key in kernel:
            narrowed[layer] = {key: kernel[key]}
        else:
            dropped.append(layer)
    if _inherits(config):
        instead = (f"get Transformers' default mapping for {kind} where it has a kernel (inherit_mapping=True), "
                   "else keep their PyTorch forward")
    else:
        instead = f"keep their PyTorch forward ({_inherit_flags(config)}: no defaults inherited)"
    if dropped:
        logger.warning("kernel mapping has no %r entry for %s; those layers %s", kind, ", ".join(dropped), instead)
    if unbound:
        logger.warning("kernel mapping entries for %s have no device key, and Transformers binds such entries to the "
                       "model's device, which must be one of KernelConfig's keys (%s), not %r; those layers %s",
                       ", ".join(unbound), ", ".join(device_keys()), kind, instead)
    if not narrowed:
        return None
    return _like(config, narrowed)


def local_kernel_hint(repo_id: str, layer: str = "Layer") -> str:
    """How to use a local checkout of `repo_id` instead of the Hub (three ways the libraries support)."""
    name = repo_id.split("/")[-1]
    return (
        f"To use a local kernel checkout: clone it while online (git clone https://huggingface.co/{repo_id} "
        f"/path/to/{name}); then either set LOCAL_KERNELS=\"{repo_id}=/path/to/{name}\" (kernels reads it for "
        f"every load), or pass KernelConfig({{...: \"/path/to/{name}:{layer}\"}}, use_local_kernel=True) to "
        f"from_pretrained, or use kernels.LocalLayerRepository(repo_path=Path(\"/path/to/{name}\"), "
        f"layer_name=\"{layer}\") / hwattn.load_kernel(\"{repo_id}\", local_path=\"/path/to/{name}\"). "
        "Or download it once while online so the Hub cache has it (HF_HUB_OFFLINE=1 then reads the cache)."
    )


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def load_kernel(
    repo_id: str,
    *,
    version: int | None = None,
    revision: str | None = None,
    local_path: str | Path | None = None,
    layer: str = "Layer",
) -> ModuleType:
    """Load a hub kernel through `kernels.get_kernel` (or `get_local_kernel` for `local_path`).

    Without `version`/`revision`, the version Transformers uses for attention kernels
    (`get_attn_kernel_version`, 1 for others). Failures raise `KernelUnavailableError` with the
    local-checkout instructions.
    """
    from .environment import kernels_available

    if not kernels_available():
        raise KernelsMissingError(f"loading {repo_id!r} needs `kernels`: {_kernels_problem()}. Fix: {KERNELS_INSTALL_HINT}.")
    import kernels

    if local_path is not None:
        path = Path(local_path)
        if not path.is_dir():
            raise KernelUnavailableError(
                f"local_path={str(local_path)!r} for {repo_id!r} is not a directory; point it at a kernel checkout. "
                + local_kernel_hint(repo_id, layer)
            )
        try:
            return kernels.get_local_kernel(path)
        except Exception as error:
            raise KernelUnavailableError(f"could not load the local kernel at {str(path)!r}: {error}") from error
    if version is None and revision is None:
        from transformers.integrations.hub_kernels import get_attn_kernel_version

        version = get_attn_kernel_version(repo_id)
    try:
        return kernels.get_kernel(repo_id, version=version, revision=revision)
    except Exception as error:
        where = ("the Hub is in offline mode (HF_HUB_OFFLINE=1) and the kernel is not in the local cache"
                 if _hub_offline() else "the Hub could not serve it (no network, or no build for this device)")
        raise KernelUnavailableError(
            f"could not load hub kernel {repo_id!r} (version={version}, revision={revision}): {where}: {error}. "
            + local_kernel_hint(repo_id, layer)
        ) from error
