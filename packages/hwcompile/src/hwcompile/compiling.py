"""`compile()`: `torch.compile` with the backend routed for the accelerator (G2, G13).

It returns exactly what `torch.compile` returns (no wrapper around the compiled callable), so
a compiled call costs the same as with plain `torch.compile`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from .errors import CompileArgumentError
from .routing import (
    AcceleratorLike,
    Backend,
    resolve_accelerator,
    route_backend,
    validate_backend,
)

logger = logging.getLogger(__name__)


def original_torch_compile() -> Any:
    """The `torch.compile` under hwcompile's patch (the function itself when not patched)."""
    import torch

    from . import patch

    return patch.unpatched(torch.compile)


@functools.cache
def _keywords(function: Any) -> frozenset[str]:
    parameters = inspect.signature(function).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def torch_compile_keywords() -> frozenset[str]:
    """The keyword arguments the installed `torch.compile` accepts (`fullgraph`, `dynamic`, `mode`, ...)."""
    return _keywords(inspect.unwrap(original_torch_compile()))


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


def compile(obj: Any = None, backend: Backend | None = None, *, accel: AcceleratorLike = None,
            **kwargs: Any) -> Any:
    """`torch.compile(obj, backend=<routed>, **kwargs)`: `hpu_backend` on Gaudi (G13), else as asked.

    Keeps `mode`, `fullgraph`, `dynamic`, `options` (on Gaudi, `mode` and options `hpu_backend`
    does not take are dropped with a warning naming them). On Gaudi it raises `LazyModeError`
    under `PT_HPU_LAZY_MODE=1` and `HpuBackendMissingError` when `hpu_backend` cannot be
    registered. With `obj=None` it returns a decorator, like `torch.compile`.
    """
    validate_backend(backend)
    check_kwargs(kwargs)
    acc = resolve_accelerator(accel)
    if obj is None:
        return lambda fn: compile(fn, backend, accel=acc, **kwargs)
    if acc.kind == "hpu":
        from .gaudi import check_eager_mode, ensure_hpu_backend, translate_kwargs

        check_eager_mode()
        if backend != "eager":  # everything but eager runs on hpu_backend: make sure it exists first
            ensure_hpu_backend()
    decision = route_backend(acc, backend)
    call_kwargs = dict(kwargs)
    if acc.kind == "hpu":
        call_kwargs = translate_kwargs(decision.backend, call_kwargs)
    if backend is not None or acc.kind == "hpu":
        call_kwargs["backend"] = decision.backend
    logger.debug("hwcompile.compile(%s): %s", type(obj).__name__, decision.reason)
    return original_torch_compile()(obj, **call_kwargs)
