"""`compile()`: `torch.compile` with the backend routed for the accelerator's platform (G2, G13).

It returns exactly what `torch.compile` returns (no wrapper around the compiled callable), so
a compiled call costs the same as with plain `torch.compile`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from .errors import CompileArgumentError
from .gaudi import check_compile_mode, ensure_backend, translate_kwargs
from .layers import torch_function
from .routing import (
    EAGER_BACKEND,
    AcceleratorLike,
    Backend,
    own_backend,
    resolve_accelerator,
    route_backend,
    validate_backend,
)

logger = logging.getLogger(__name__)


#: The keyword-only parameters of `torch.compile` in torch 2.15, used only when torch's own function
#: cannot be found under the wrappers at `torch.compile` (a test compares it with the installed torch).
TORCH_COMPILE_KEYWORDS = frozenset({
    "fullgraph", "dynamic", "backend", "mode", "options", "name", "disable", "recompile_limit",
    "isolate_recompiles", "dynamic_shapes",
})


def original_torch_compile() -> Any:
    """The `torch.compile` under hwcompile's patch (the function itself when not patched).

    This is what hwcompile calls: other libraries' wrappers (Transformers') stay in the call path.
    """
    import torch

    from . import patch

    return patch.unpatched(torch.compile)


def torch_compile_function() -> Any | None:
    """torch's own `torch.compile` function, under every wrapper now at `torch.compile`, or None if hidden."""
    import torch

    return torch_function(torch.compile)


@functools.cache
def _keywords(function: Any) -> frozenset[str]:
    parameters = inspect.signature(function).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def torch_compile_keywords() -> frozenset[str]:
    """The keyword arguments torch's own `torch.compile` accepts (`fullgraph`, `dynamic`, `mode`, ...).

    Read from torch's function under any wrappers (Transformers' `hpu_backend_compile(*args,
    **kwargs)`, hwcompile's patch), never from the signature of whatever sits at `torch.compile`;
    `TORCH_COMPILE_KEYWORDS` when a wrapper hides it.
    """
    function = torch_compile_function()
    if function is None:
        logger.debug("hwcompile: torch's own torch.compile is hidden under a wrapper; using the recorded keywords")
        return TORCH_COMPILE_KEYWORDS
    return _keywords(function)


def check_kwargs(kwargs: dict[str, Any]) -> None:
    """Reject keywords `torch.compile` would reject, before anything is compiled."""
    unknown = sorted(set(kwargs) - torch_compile_keywords())
    if unknown:
        raise CompileArgumentError(
            f"torch.compile takes no keyword {', '.join(map(repr, unknown))}; accepted keywords are "
            f"{', '.join(sorted(torch_compile_keywords()))} (backend is hwcompile's own argument)."
        )
    if kwargs.get("mode") is not None and kwargs.get("options") is not None:
        raise CompileArgumentError(
            f"mode={kwargs['mode']!r} and options={kwargs['options']!r} were both given; torch.compile takes "
            f"either mode or options, not both. Put the settings in one of them."
        )
    options = kwargs.get("options")
    if options is not None and not isinstance(options, dict):
        raise CompileArgumentError(f"options={options!r} must be a dict of backend settings, or None.")
    bad_keys = [key for key in options or () if not isinstance(key, str)]
    if bad_keys:
        raise CompileArgumentError(f"options keys {bad_keys!r} are not strings; torch.compile options are named "
                                   f"settings such as {{'triton.cudagraphs': False}}.")


def compile(obj: Any = None, backend: Backend | None = None, *, accel: AcceleratorLike = None,
            **kwargs: Any) -> Any:
    """`torch.compile(obj, backend=<routed>, **kwargs)`: the platform's own backend where it has one
    (Gaudi: `hpu_backend`, G13), else as asked.

    Keeps `mode`, `fullgraph`, `dynamic`, `options` (on Gaudi, `mode` and options `hpu_backend`
    does not take are dropped with a warning naming them). On Gaudi it raises `LazyModeError`
    when Gaudi runs lazy (`hwenv.gaudi.execution_mode`) and `HpuBackendMissingError` when
    `hpu_backend` cannot be registered. With `obj=None` it returns a decorator, like `torch.compile`.
    """
    validate_backend(backend)
    check_kwargs(kwargs)
    acc = resolve_accelerator(accel)
    if obj is None:
        return lambda fn: compile(fn, backend, accel=acc, **kwargs)
    platform = acc.platform
    target = own_backend(platform)
    check_compile_mode(platform)
    if target is not None and backend != EAGER_BACKEND:  # everything but eager runs on it: it must exist
        ensure_backend(platform)
    decision = route_backend(acc, backend)
    call_kwargs = dict(kwargs)
    if target is not None:
        call_kwargs = translate_kwargs(decision.backend, call_kwargs)
    if backend is not None or target is not None:
        call_kwargs["backend"] = decision.backend
    logger.debug("hwcompile.compile(%s): %s", type(obj).__name__, decision.reason)
    return original_torch_compile()(obj, **call_kwargs)
