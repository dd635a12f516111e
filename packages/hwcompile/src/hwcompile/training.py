"""`training_arguments()`: the `TrainingArguments` keywords that compile the model right for the device (G14)."""

from __future__ import annotations

from typing import Any

from .gaudi import check_compile_mode
from .routing import AcceleratorLike, Backend, own_backend, resolve_accelerator, route_backend


def training_arguments(accel: AcceleratorLike, compile: bool = True, *, backend: Backend | None = None,
                       mode: str | None = None) -> dict[str, Any]:
    """Keywords for `transformers.TrainingArguments`: on Gaudi `torch_compile=True,
    torch_compile_backend="hpu_backend"` (G14; the platform's own backend); elsewhere the
    requested or default backend.

    `compile=False` gives `{"torch_compile": False}` (nothing is compiled unless asked, G2). On
    Gaudi in lazy mode (`hwenv.gaudi.execution_mode`) it raises `LazyModeError` now, not in Trainer.
    """
    acc = resolve_accelerator(accel)
    if not compile:
        return {"torch_compile": False}
    if not isinstance(backend, (str, type(None))):
        from .errors import CompileArgumentError

        raise CompileArgumentError(
            f"backend={backend!r}: TrainingArguments.torch_compile_backend takes a backend name (str), "
            f"such as 'inductor' or 'hpu_backend'."
        )
    check_compile_mode(acc.platform)
    decision = route_backend(acc, backend)
    keywords: dict[str, Any] = {"torch_compile": True, "torch_compile_backend": decision.backend}
    if mode is not None:
        if decision.backend == own_backend(acc.platform) and mode != "default":
            import logging

            logging.getLogger(__name__).warning(
                "torch_compile_mode=%r is an inductor mode; %s ignores it, so it is left out.", mode,
                decision.backend,
            )
        else:
            keywords["torch_compile_mode"] = mode
    return keywords
