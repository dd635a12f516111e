"""Every error hwrun raises: one base, `HwrunError`, and a subclass per kind of bad input.

Each also subclasses the builtin Transformers raises for the same input (ValueError, OSError,
RuntimeError), so `except ValueError` code keeps working.
"""

from __future__ import annotations


class HwrunError(Exception):
    """Base of every hwrun error."""


class PlanError(HwrunError, ValueError):
    """A `plan()` argument is invalid for this device or this model (bad device, dtype, attention...)."""


class QuantizationError(PlanError):
    """The requested quantization is unknown, or bitsandbytes cannot run it on the chosen device."""


class ModelSourceError(HwrunError, OSError):
    """The model cannot be found or read: missing path, no safetensors, Hub not reachable."""


class GenerateError(HwrunError, ValueError):
    """A `generate()` argument is invalid: no prompts, empty prompt, max_new_tokens <= 0, ..."""


class ContinuousBatchingError(GenerateError):
    """Transformers' continuous batching (`generate_batch`) failed for this model; `batching='auto'`
    falls back to static batching, an explicit `batching='continuous'` raises it."""


class FastDecodeError(HwrunError, RuntimeError):
    """The graph decode path cannot run this model or input (see `hwrun.fastdecode`)."""


__all__ = [
    "ContinuousBatchingError", "FastDecodeError", "GenerateError", "HwrunError", "ModelSourceError", "PlanError", "QuantizationError",
]


def __getattr__(name: str):
    """Re-export the training errors (`hwrun.training.errors`) lazily, so both halves share one module."""
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        from .training import errors as training_errors
    except ImportError as exc:  # pragma: no cover - training half not installed
        raise AttributeError(f"module 'hwrun.errors' has no attribute {name!r}") from exc
    try:
        return getattr(training_errors, name)
    except AttributeError:
        raise AttributeError(f"module 'hwrun.errors' has no attribute {name!r}") from None
