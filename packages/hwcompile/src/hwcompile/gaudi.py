"""What compiling on Gaudi needs: eager mode (G2), a registered `hpu_backend`, and only the options it takes.

Layer-rule exception (listed in tests/test_workspace_layers.py): `ensure_hpu_backend` imports
the Gaudi plugin, lazily, because importing it is the only way `hpu_backend` gets registered.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from hwenv.gaudi import LAZY_MODE_VARIABLE, PLUGIN_INSTALL_HINT

from .errors import HpuBackendMissingError, LazyModeError
from .routing import HPU_BACKEND

logger = logging.getLogger(__name__)

#: Importing this registers `hpu_backend`: its `__init__` imports
#: `habana_frameworks.torch.dynamo.compile_backend.backends` (gaudi-pytorch-bridge,
#: python_packages/habana_frameworks/torch/core/__init__.py), whose `@register_backend` does it.
PLUGIN_CORE_MODULE = "habana_frameworks.torch.core"
PLUGIN_BACKENDS_MODULE = "habana_frameworks.torch.dynamo.compile_backend.backends"
PLUGIN_CONFIG_MODULE = "habana_frameworks.torch.dynamo.compile_backend.config"

#: The keys `hpu_backend` accepts in `options` (it applies them with `hpu_backend_config.patch`,
#: which rejects unknown keys). Read from gaudi-pytorch-bridge's
#: habana_frameworks/torch/dynamo/compile_backend/config.py; when the real plugin is loaded its
#: config module's own key list is used instead (see `hpu_backend_options`).
HPU_BACKEND_OPTIONS = frozenset({
    "use_compiled_recipes", "decomposition_mode", "verbose", "keep_input_mutations", "use_eager_fallback",
    "use_graph_freezing", "discard_frozen_params", "remove_unnecessary_clones", "use_inplace_allreduce",
    "inference",
})
#: Options torch.compile itself consumes for every backend (popped before the backend sees them).
DYNAMO_OPTIONS = frozenset({"guard_filter_fn"})


def lazy_mode(environ: Mapping[str, str] | None = None) -> bool:
    """True when `PT_HPU_LAZY_MODE=1` selects Gaudi's lazy mode (unset means eager, G2; as `hwenv doctor`)."""
    env = os.environ if environ is None else environ
    return env.get(LAZY_MODE_VARIABLE, "").strip() == "1"


def check_eager_mode(environ: Mapping[str, str] | None = None) -> None:
    """Raise `LazyModeError` when lazy mode is on: torch.compile on Gaudi needs eager mode."""
    if lazy_mode(environ):
        raise LazyModeError(
            f"{LAZY_MODE_VARIABLE}=1 selects Gaudi lazy mode, but torch.compile (hpu_backend) runs only in "
            f"eager mode (G2). Run with {LAZY_MODE_VARIABLE}=0 (e.g. `{LAZY_MODE_VARIABLE}=0 python train.py`), "
            f"or do not compile; `hwenv doctor` shows the mode."
        )


def hpu_backend_registered() -> bool:
    """Whether torch._dynamo knows a backend named `hpu_backend` (the plugin's, or a test stand-in)."""
    import torch._dynamo

    return HPU_BACKEND in torch._dynamo.list_backends(exclude_tags=())


def ensure_hpu_backend() -> None:
    """Make sure `hpu_backend` is registered, importing the Gaudi plugin only if it is not yet.

    Raises `HpuBackendMissingError` (an ImportError) with the install hint when it cannot be.
    """
    if hpu_backend_registered():
        return
    for module in (PLUGIN_CORE_MODULE, PLUGIN_BACKENDS_MODULE):
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise HpuBackendMissingError(
                f"torch.compile backend 'hpu_backend' is not registered and importing {module} failed "
                f"({error}). It comes with the Gaudi PyTorch plugin. {PLUGIN_INSTALL_HINT}"
            ) from error
        if hpu_backend_registered():
            logger.info("registered torch.compile backend 'hpu_backend' by importing %s", module)
            return
    raise HpuBackendMissingError(
        f"imported {PLUGIN_CORE_MODULE} and {PLUGIN_BACKENDS_MODULE}, but no torch.compile backend named "
        f"'hpu_backend' was registered; the installed Gaudi plugin does not match this torch. {PLUGIN_INSTALL_HINT}"
    )


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
