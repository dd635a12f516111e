"""What compiling on Gaudi needs: eager mode (G2), a registered `hpu_backend`, and only the options it takes.

Layer-rule exception (listed in tests/test_workspace_layers.py): `ensure_hpu_backend` imports
the Gaudi plugin, lazily, because importing it is the only way `hpu_backend` gets registered.
Lazy or eager is `hwenv.gaudi.execution_mode()`'s answer (the bridge's own rule: unset means
lazy up to Gaudi software 1.20 and eager from 1.21.0; any value but "0" is lazy).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from typing import Any

import hwenv
from hwenv.gaudi import LAZY_MODE_VARIABLE, PLUGIN_INSTALL_HINT, GaudiMode, execution_mode

from .errors import CompileBackendMissingError, HpuBackendMissingError, LazyModeError
from .routing import HPU_BACKEND

logger = logging.getLogger(__name__)

#: Importing this registers `hpu_backend`: its `__init__` imports
#: `habana_frameworks.torch.dynamo.compile_backend.backends` (gaudi-pytorch-bridge,
#: python_packages/habana_frameworks/torch/core/__init__.py), whose `@register_backend` does it.
PLUGIN_CORE_MODULE = "habana_frameworks.torch.core"  # platform-boundary: importing it registers hpu_backend (G13)
PLUGIN_BACKENDS_MODULE = "habana_frameworks.torch.dynamo.compile_backend.backends"  # platform-boundary: hpu_backend's home
PLUGIN_CONFIG_MODULE = "habana_frameworks.torch.dynamo.compile_backend.config"  # platform-boundary: hpu_backend's options
#: Per platform compile backend: the modules whose import registers it (in order).
BACKEND_MODULES: dict[str, tuple[str, ...]] = {HPU_BACKEND: (PLUGIN_CORE_MODULE, PLUGIN_BACKENDS_MODULE)}

#: The keys `hpu_backend` accepts in `options` (it applies them with `hpu_backend_config.patch`,
#: which rejects unknown keys): the 18 module-level settings of gaudi-pytorch-bridge 1.19.0
#: (commit 5a56187 "Publish 1.19.0"), python_packages/habana_frameworks/torch/dynamo/compile_backend/
#: config.py. 1.19 has no `verbose` (older bridges had it). When the real plugin is loaded its config
#: module's own key list is used instead (see `hpu_backend_options`).
HPU_BACKEND_OPTIONS = frozenset({
    "use_compiled_recipes", "decomposition_mode", "keep_input_mutations", "use_eager_fallback",
    "use_graph_freezing", "discard_frozen_params", "remove_unnecessary_clones", "use_inplace_allreduce",
    "use_inplace_index_copy", "inference", "enable_sfg", "use_cpp_partitioner", "enable_allreduce_graph_split",
    "force_static_compile", "reinplace_add", "reassign_full_copy", "reassign_copy_", "use_boxed_input",
})
#: Options torch.compile itself consumes for every backend (popped before the backend sees them).
DYNAMO_OPTIONS = frozenset({"guard_filter_fn"})


def gaudi_mode(environ: Mapping[str, str] | None = None, *, plugin_version: str | None = None) -> GaudiMode:
    """Lazy or eager, and why: `hwenv.gaudi.execution_mode` (the installed plugin's default when unset)."""
    return execution_mode(environ, plugin_version=plugin_version)


def lazy_mode(environ: Mapping[str, str] | None = None, *, plugin_version: str | None = None) -> bool:
    """True when Gaudi runs in lazy mode: `PT_HPU_LAZY_MODE` set to anything but "0", or unset on
    Gaudi software 1.20 and older (G2; the same answer as `hwenv doctor`).
    """
    return gaudi_mode(environ, plugin_version=plugin_version).lazy


def check_eager_mode(environ: Mapping[str, str] | None = None, *, plugin_version: str | None = None) -> GaudiMode:
    """Raise `LazyModeError` (with the reason) when Gaudi runs lazy: torch.compile there needs eager mode.

    Returns the (eager) mode otherwise.
    """
    mode = gaudi_mode(environ, plugin_version=plugin_version)
    if mode.lazy:
        raise LazyModeError(
            f"Gaudi runs in lazy mode ({mode.reason}), but torch.compile (hpu_backend) runs only in eager mode "
            f"(G2). Run with {LAZY_MODE_VARIABLE}=0 (e.g. `{LAZY_MODE_VARIABLE}=0 python train.py`; it is read "
            f"once, when habana_frameworks.torch is imported), or do not compile; `hwenv doctor` shows the mode."
        )
    logger.debug("hwcompile: Gaudi runs in eager mode (%s)", mode.reason)
    return mode


def check_compile_mode(platform: hwenv.Platform, environ: Mapping[str, str] | None = None) -> GaudiMode | None:
    """For a platform with a lazy mode (`Platform.lazy_mode_variable`), refuse to compile in it.

    Gaudi's variable is read with `check_eager_mode`; a platform with another lazy-mode variable
    (a plug-in) is not checked (its rule is unknown here) and None is returned, as off Gaudi.
    """
    if platform.lazy_mode_variable is None:
        return None
    if platform.lazy_mode_variable != LAZY_MODE_VARIABLE:
        logger.info("hwcompile: %s has lazy-mode variable %s, whose rule hwcompile does not know; not checked",
                    platform.display_name, platform.lazy_mode_variable)
        return None
    return check_eager_mode(environ)


def backend_registered(name: str) -> bool:
    """Whether torch._dynamo knows a backend named `name` (the plugin's, or a test stand-in)."""
    import torch._dynamo

    return name in torch._dynamo.list_backends(exclude_tags=())


def hpu_backend_registered() -> bool:
    """Whether torch._dynamo knows a backend named `hpu_backend` (the plugin's, or a test stand-in)."""
    return backend_registered(HPU_BACKEND)


def _missing(name: str, message: str) -> CompileBackendMissingError:
    error = HpuBackendMissingError if name == HPU_BACKEND else CompileBackendMissingError
    return error(message)


def ensure_backend(platform: hwenv.Platform) -> None:
    """Make sure the platform's compile backend is registered, importing its plugin only if it is not yet.

    The modules come from `BACKEND_MODULES` (Gaudi), else the platform's `plugin_module`. Raises
    `CompileBackendMissingError` (`HpuBackendMissingError` for `hpu_backend`; an ImportError).
    """
    name = platform.compile_backend
    if backend_registered(name):
        return
    hint = PLUGIN_INSTALL_HINT if name == HPU_BACKEND else f"Install the plugin of {platform.display_name}."
    modules = BACKEND_MODULES.get(name) or ((platform.plugin_module,) if platform.plugin_module else ())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise _missing(name, (
                f"torch.compile backend {name!r} is not registered and importing {module} failed "
                f"({error}). It comes with the {platform.display_name} PyTorch plugin. {hint}"
            )) from error
        if backend_registered(name):
            logger.info("registered torch.compile backend %r by importing %s", name, module)
            return
    raise _missing(name, (
        f"imported {' and '.join(modules) or 'nothing'}, but no torch.compile backend named {name!r} was "
        f"registered; the installed {platform.display_name} plugin does not match this torch. {hint}"
    ))


def ensure_hpu_backend() -> None:
    """Make sure `hpu_backend` is registered, importing the Gaudi plugin only if it is not yet.

    Raises `HpuBackendMissingError` (an ImportError) with the install hint when it cannot be.
    """
    ensure_backend(hwenv.get_platform("hpu"))


def hpu_backend_options() -> frozenset[str]:
    """Option keys `hpu_backend` accepts: the loaded plugin's config keys, else the recorded list."""
    config = sys.modules.get(PLUGIN_CONFIG_MODULE)
    keys = getattr(config, "_config", None)
    if isinstance(keys, Mapping) and keys:
        return frozenset(keys)
    return HPU_BACKEND_OPTIONS


def translate_kwargs(backend: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`torch.compile` keywords for a Gaudi backend: drop `mode` and the `options` it does not take.

    `hpu_backend` ignores `mode` (inductor's `reduce-overhead`, `max-autotune`, ...) and rejects
    unknown option keys; `eager` ignores both. Each dropped item is named in one warning.
    """
    out = dict(kwargs)
    dropped: list[str] = []
    mode = out.get("mode")
    if mode not in (None, "default"):
        dropped.append(f"mode={mode!r}")
        out.pop("mode")
    options = out.get("options")
    if options:
        accepted = (hpu_backend_options() if backend == HPU_BACKEND else frozenset()) | DYNAMO_OPTIONS
        kept = {key: value for key, value in options.items() if key.replace("-", "_") in accepted}
        dropped += [f"options[{key!r}]" for key in options if key not in kept]
        out["options"] = kept or None
        if out["options"] is None:
            out.pop("options")
    if dropped:
        logger.warning(
            "torch.compile on Gaudi with backend=%r: dropped %s, which %r does not take (inductor-only "
            "settings); accepted options are %s.",
            backend, ", ".join(dropped), backend,
            ", ".join(sorted((hpu_backend_options() if backend == HPU_BACKEND else frozenset()) | DYNAMO_OPTIONS)),
        )
    return out
