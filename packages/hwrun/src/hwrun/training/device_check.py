"""The device plan checked against a user's own training setup (`HwrunCallback(plan=...)` for `TrainingArguments`,
`HwrunAccelerateGuard(plan=...)` for an `Accelerator`): the device trained on and the mixed precision must be what the
plan chose, or the run is refused with both named."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import TrainingConfigError

logger = logging.getLogger(__name__)

_PLANNED_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}


def check_arguments(plan: Any, args: Any) -> dict[str, Any]:
    """Compare `args` (TrainingArguments) with `plan` (hwrun.plan()): a device type other than the plan's, or bf16
    where the plan's device has none, is a TrainingConfigError; a bf16/fp16 plan trained in float32 is a warning.
    Returns the plan's choices, recorded in each checkpoint's manifest."""
    precision = "bf16" if getattr(args, "bf16", False) else ("fp16" if getattr(args, "fp16", False) else "float32")
    return _check(plan, args.device.type, precision, kind="callback",
                  trains=f"TrainingArguments train on {args.device.type!r} (use_cpu={getattr(args, 'use_cpu', None)!r})",
                  bf16="TrainingArguments bf16=True", user="HwrunCallback", setting=_argument,
                  fix="build the arguments with hwrun.training.training_arguments(plan, output_dir, ...)")


def check_accelerator(plan: Any, accelerator: Any) -> dict[str, Any]:
    """Compare an `accelerate.Accelerator` with `plan` by the same rules as `check_arguments` (its device type, its
    `mixed_precision`); returns the plan's choices for the manifests."""
    mixed = str(getattr(accelerator, "mixed_precision", "no") or "no")
    precision = "float32" if mixed == "no" else mixed
    actual = accelerator.device.type
    return _check(plan, actual, precision, kind="accelerate",
                  trains=f"The Accelerator trains on {actual!r} (device {accelerator.device})",
                  bf16="Accelerator mixed_precision='bf16'", user="HwrunAccelerateGuard",
                  setting=_mixed_precision,
                  fix="build the Accelerator for the plan's device (Accelerator(cpu=True) only for a CPU plan)")


def _argument(precision: str) -> str:
    return "bf16=False, fp16=False" if precision == "float32" else f"{precision}=True"


def _mixed_precision(precision: str) -> str:
    return f"Accelerator(mixed_precision={'no' if precision == 'float32' else precision!r})"


def _check(plan: Any, actual: str, precision: str, *, kind: str, trains: str, bf16: str, user: str,
           setting: Callable[[str], str], fix: str) -> dict[str, Any]:
    accel = plan.accelerator
    planned = accel.platform.device_type
    if actual != planned:
        raise TrainingConfigError(
            f"{trains} but the plan given to {user} is for {accel.name} (device {accel.device}, torch device type "
            f"{planned!r}). Fix: {fix}, or plan for the device you train on (hwrun.plan(device=...)).")
    if precision == "bf16" and accel.platform.is_accelerator and accel.bf16 is False:
        raise TrainingConfigError(
            f"{bf16} but {accel.name} (device {accel.device}) has no bfloat16 "
            f"({accel.bf16_source or 'torch reports none'}). Fix: {setting('fp16')}, or dtype='auto' in the plan.")
    wanted = _PLANNED_PRECISION.get(plan.dtype, "float32")
    if precision != wanted:
        logger.warning("The plan chose %s on %s (%s) but training computes in %s; pass %s to match the plan.",
                       plan.dtype, accel.name, plan.reasons.get("dtype", "plan"), precision,
                       setting(wanted))
    record = {"kind": kind, "device": str(accel.device), "dtype": plan.dtype,
              "attention": plan.attention.implementation, "precision": precision}
    logger.info("%s: training as planned on %s", user, record)
    return record
