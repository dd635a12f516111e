"""`training_arguments()`: the `TrainingArguments` keywords that compile the model right for the device (G14)."""

from __future__ import annotations

from typing import Any

from .routing import AcceleratorLike, Backend, resolve_accelerator, route_backend


def training_arguments(accel: AcceleratorLike, compile: bool = True, *, backend: Backend | None = None,
                       mode: str | None = None) -> dict[str, Any]:
    """Keywords for `transformers.TrainingArguments`: on Gaudi `torch_compile=True,
    torch_compile_backend="hpu_backend"` (G14); elsewhere the requested or default backend.

    `compile=False` gives `{"torch_compile": False}` (Gaudi runs eager by default, G2). On Gaudi,
    compiling under `PT_HPU_LAZY_MODE=1` raises `LazyModeError` now rather than in Trainer.
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
    if acc.kind == "hpu":
        from .gaudi import check_eager_mode

        check_eager_mode()
    decision = route_backend(acc, backend)
    keywords: dict[str, Any] = {"torch_compile": True, "torch_compile_backend": decision.backend}
    if mode is not None:
        if decision.backend == "hpu_backend" and mode != "default":
            import logging

            logging.getLogger(__name__).warning(
                "torch_compile_mode=%r is an inductor mode; hpu_backend ignores it, so it is left out.", mode,
            )
        else:
            keywords["torch_compile_mode"] = mode
    return keywords
