"""`kernel_plan`: which layers of a model `use_kernels=True` would replace on a device, without loading any kernel.

It builds the same table `kernels.kernelize` consults — Transformers' default mapping
(`get_kernel_mapping_transformers`) merged with the user's `KernelConfig` through the real
`kernels.use_kernel_mapping` — and selects per layer with kernels' own mode priority (X12, X13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwenv import Accelerator

from .capabilities import hub_kernels
from .errors import AcceleratorTypeError, KernelMappingError
from .kernel_map import device_keys, kernel_mapping, registered_layers


@dataclass(frozen=True)
class LayerKernel:
    """One hub-kernel layer of the model and what happens to it."""

    module: str
    layer: str
    replaced: bool
    repo: str | None = None
    repo_layer: str | None = None
    source: str | None = None  # "mapping" (the user's) or "transformers" (the default mapping)
    reason: str = ""


@dataclass(frozen=True)
class KernelPlan:
    """What `use_kernels=True` would do on `device`: replaced and unchanged layers, and why."""

    device: str
    used: bool
    mode: str
    reason: str
    replaced: tuple[LayerKernel, ...] = ()
    unchanged: tuple[LayerKernel, ...] = ()

    def summary(self) -> str:
        """A few lines for a printed plan."""
        lines = [f"hub kernels on {self.device} ({self.mode}): {self.reason}"]
        lines += [f"  replace {k.module} ({k.layer}) <- {k.repo}:{k.repo_layer} [{k.source}]" for k in self.replaced]
        lines += [f"  keep    {k.module} ({k.layer}): {k.reason}" for k in self.unchanged]
        return "\n".join(lines)


def _user_entries(config: Any, kind: str, mode: Any) -> dict[str, Any]:
    """The user's KernelConfig entries for `kind`, as kernels repositories (like `create_compatible_mapping`)."""
    from kernels import LayerRepository, LocalLayerRepository

    entries: dict[str, Any] = {}
    hub = hub_kernels(kind)
    key = hub.config_key
    bindable = key is not None and key in device_keys()  # an entry without device keys binds to the model's device
    for layer, kernel in (config.kernel_mapping or {}).items():
        value = (kernel.get(key) if key is not None else None) if isinstance(kernel, dict) else (
            kernel if bindable else None)
        if value is None:
            continue
        repo_name, metadata = value if isinstance(value, tuple) else (value, {})
        repo, _, repo_layer = repo_name.rpartition(":")
        if config.use_local_kernel:
            from pathlib import Path

            repository = LocalLayerRepository(repo_path=Path(repo), layer_name=repo_layer)
        else:
            revision = metadata.get("revision")
            repository = LayerRepository(repo, layer_name=repo_layer, revision=revision,
                                         version=None if revision else metadata.get("version", 1),
                                         trust_remote_code=metadata.get("trust_remote_code", False))
        entries[layer] = {hub.kernels_device: {mode: repository}}
    return entries


def kernel_plan(model: Any, accel: Accelerator, mapping: Any = None, *, allowed_orgs: Any = (),
                allow_repos: Any = (), trust_remote_code: bool = False) -> KernelPlan:
    """Report which registered layers of `model` hub kernels would replace on `accel`, loading nothing.

    `mapping` is None (Transformers' defaults only), a dict for `kernel_mapping`, or a `KernelConfig`;
    `allowed_orgs` / `allow_repos` / `trust_remote_code` as for `kernel_mapping`.
    """
    if not isinstance(accel, Accelerator):
        raise AcceleratorTypeError(f"accel must be an hwenv.Accelerator, got {type(accel).__name__} {accel!r}.")
    from transformers import KernelConfig

    from .environment import kernels_available

    trust = {"allowed_orgs": allowed_orgs, "allow_repos": allow_repos, "trust_remote_code": trust_remote_code}
    if mapping is None or isinstance(mapping, KernelConfig):
        config = mapping
        if config is not None:
            kernel_mapping(config.kernel_mapping, model=model, use_local_kernel=config.use_local_kernel, **trust)
    elif isinstance(mapping, dict):
        config = kernel_mapping(mapping, model=model, **trust)
    else:
        raise KernelMappingError(f"mapping must be None, a dict or a KernelConfig, got {type(mapping).__name__}.")
    layers = registered_layers(model)
    mode_name = "training" if getattr(model, "training", False) else "inference"
    kind = accel.kind

    def keep_all(reason: str, used: bool = False) -> KernelPlan:
        kept = tuple(LayerKernel(module=m, layer=n, replaced=False, reason=reason) for m, n in layers.items())
        return KernelPlan(device=kind, used=used, mode=mode_name, reason=reason, unchanged=kept)

    hub = hub_kernels(kind)
    if hub.kernels_device is None:
        return keep_all(f"{hub.reason}; every layer keeps its PyTorch forward")
    if not kernels_available():
        return keep_all("the kernels package is not usable (transformers.utils.is_kernels_available() is False); "
                        'pip install "hwattn[kernels]"')
    if not layers:
        return keep_all(f"{type(model).__name__} registers no hub-kernel layers")
    replaced, unchanged, cap_note = _select(layers, config, accel, mode_name)
    if replaced:
        reason = f"{len(replaced)} of {len(layers)} hub-kernel layers have a kernel for {kind}{cap_note}"
    elif hub.config_key is None:  # only Transformers' default mapping could give a kernel here
        label = accel.name
        reason = (f"hub kernels are not used on {label} for this model: KernelConfig accepts no {kind!r} key "
                  f"({', '.join(device_keys())}) and Transformers' default mapping has no {label} kernel for its layers")
    else:
        reason = f"no kernel in the mapping for these layers on {kind}{cap_note}"
    return KernelPlan(device=kind, used=bool(replaced), mode=mode_name, reason=reason,
                      replaced=tuple(replaced), unchanged=tuple(unchanged))


def default_kernels(accel: Accelerator, *, training: bool = False) -> dict[str, str]:
    """Transformers' default hub kernels on `accel` as the installed release maps them: `{layer: "repo:layer"}`.

    What `use_kernels=True` without a mapping gives each registered layer name in that mode (loading
    nothing); `{}` where hub kernels are not used (Gaudi). Raises `KernelsMissingError` without `kernels`.
    """
    if not isinstance(accel, Accelerator):
        raise AcceleratorTypeError(f"accel must be an hwenv.Accelerator, got {type(accel).__name__} {accel!r}.")
    from .environment import kernels_available

    if hub_kernels(accel.kind).kernels_device is None:
        return {}
    if not kernels_available():
        from .errors import KernelsMissingError
        from .resolve import KERNELS_INSTALL_HINT, _kernels_problem

        raise KernelsMissingError(f"Transformers' default kernel mapping needs `kernels`: {_kernels_problem()}. "
                                  f"Fix: {KERNELS_INSTALL_HINT}.")
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    names = {layer: layer for layer in get_kernel_mapping_transformers()}
    replaced, _, _ = _select(names, None, accel, "training" if training else "inference")
    return {k.layer: f"{k.repo}:{k.repo_layer}" for k in replaced}


def _select(layers: dict[str, str], config: Any, accel: Accelerator,
            mode_name: str) -> tuple[list[LayerKernel], list[LayerKernel], str]:
    from kernels import Mode, use_kernel_mapping
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    from .kernels_compat import kernels_internals

    internals = kernels_internals()  # the one place hwattn reads kernels internals (version-checked)
    kind, hub = accel.kind, hub_kernels(accel.kind)
    mode = Mode.TRAINING if mode_name == "training" else Mode.INFERENCE
    user = _user_entries(config, kind, mode) if config is not None else {}
    inherit = config is None or (config.inherit_mapping and not config.use_local_kernel)
    capability = accel.capability[0] * 10 + accel.capability[1] if accel.capability else 0
    cap_note = (f"; {hub.capability} unknown: only kernels for every capability considered"
                if hub.capability and not accel.capability else "")
    with use_kernel_mapping(get_kernel_mapping_transformers() if inherit else {}, inherit_mapping=False), \
            use_kernel_mapping(user, inherit_mapping=True):
        table = internals.current_mapping()
        replaced, unchanged = [], []
        for module, layer in layers.items():
            device_repos = table.get(layer, {}).get(hub.kernels_device)
            if device_repos is None:
                why = "no kernel for this layer" if layer not in table else f"no {kind} kernel for this layer"
                unchanged.append(LayerKernel(module=module, layer=layer, replaced=False, reason=why))
                continue
            repos = internals.repos_for(device_repos, capability)
            chosen = internals.select(repos, mode) if repos else None
            if chosen is None:
                unchanged.append(LayerKernel(module=module, layer=layer, replaced=False,
                                             reason=f"no {kind} kernel for {mode_name} mode"
                                             + (" at this compute capability" if hub.capability else "")))
                continue
            repo, repo_layer = internals.describe(chosen[0])
            replaced.append(LayerKernel(module=module, layer=layer, replaced=True, repo=repo, repo_layer=repo_layer,
                                        source="mapping" if layer in user else "transformers",
                                        reason=f"kernels selects it for {mode_name} ({chosen[1]})"))
    return replaced, unchanged, cap_note
