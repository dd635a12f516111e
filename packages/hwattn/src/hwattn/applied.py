"""`kernelized_layers`: which layers of a loaded model hub kernels replaced, read with kernels' public API.

kernels >= 0.18 (Transformers >= 5.23) exports `get_kernelized_layers(model)`: every replaced layer
and kernel function with the repository it came from. kernels 0.17 (Transformers 5.22) records no
repository: there a replaced layer is one whose `forward` is no longer its class's (what `kernelize`
does to it), its repository is unknown, and kernel functions (`rotary_pos_emb`) are not seen.
"""

from __future__ import annotations

from typing import Any

from .kernel_map import registered_layers
from .plan import LayerKernel


def kernelized_layers(model: Any) -> tuple[LayerKernel, ...]:
    """The hub-kernel layers `use_kernels=True` / `kernelize` actually replaced in `model`, in module order."""
    import kernels

    names = registered_layers(model)
    if hasattr(kernels, "get_kernelized_layers"):
        from .kernels_compat import kernels_internals

        describe = kernels_internals().describe
        found = kernels.get_kernelized_layers(model)
        entries: dict[str, Any] = {name: item.repo for name, item in found.layers.items()}
        entries.update({f"{owner}.{func}" if owner else func: item.repo for (owner, func), item in found.funcs.items()})
        order = [name for name, _ in model.named_modules()]
        rank = {name: i for i, name in enumerate(order)}
        result = []
        for module in sorted(entries, key=lambda m: (rank.get(m, rank.get(m.rsplit(".", 1)[0], len(order))), m)):
            repo, repo_layer = describe(entries[module])
            result.append(LayerKernel(module=module, layer=names.get(module, "?"), replaced=True, repo=repo,
                                      repo_layer=repo_layer, source=None,
                                      reason=f"kernels.get_kernelized_layers (kernels {kernels.__version__})"))
        return tuple(result)
    from types import MethodType

    result = []
    for module_name, module in model.named_modules():
        bound = module.__dict__.get("forward")
        if module_name not in names or not isinstance(bound, MethodType) or bound.__func__ is type(module).forward:
            continue
        kernel_class = bound.__func__.__qualname__.rsplit(".", 2)[-2]
        result.append(LayerKernel(
            module=module_name, layer=names.get(module_name, "?"), replaced=True, repo=None, repo_layer=kernel_class,
            source=None, reason=(f"forward replaced by {kernel_class}; kernels {kernels.__version__} records no "
                                 "repository and no kernel functions (get_kernelized_layers is in kernels >= 0.18)")))
    return tuple(result)
