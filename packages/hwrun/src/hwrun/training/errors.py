"""Errors of hwrun's training half; all subclass `hwrun.errors.HwrunError`."""

from __future__ import annotations

from hwrun.errors import HwrunError


class TrainingError(HwrunError):
    """Base of every error raised by `hwrun.training`."""


class TrainingDataError(TrainingError, ValueError):
    """The training data cannot be read: missing, empty, not UTF-8, or a JSONL line without `text`."""


class TrainingConfigError(TrainingError, ValueError):
    """A training option is invalid for this plan or device (e.g. bf16 where it is unsupported)."""


class QLoRAUnsupportedError(TrainingError, ValueError):
    """4-bit QLoRA was asked for on a device that bitsandbytes does not support."""


class CheckpointError(TrainingError, RuntimeError):
    """A checkpoint could not be written or no usable checkpoint exists to resume from."""
