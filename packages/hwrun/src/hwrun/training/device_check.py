"""The device plan checked against a user's own `TrainingArguments` (for `HwrunCallback(plan=...)`): the device the
arguments train on and their mixed precision must be what the plan chose, or the run is refused with both named."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import TrainingConfigError

logger = logging.getLogger(__name__)


def check_arguments(plan: Any, args: Any) -> dict[str, Any]:
    """Compare `args` (TrainingArguments) with `plan` (hwrun.plan()): a device type other than the plan's, or bf16
    where the plan's device has none, is a TrainingConfigError; a bf16/fp16 plan trained in float32 is a warning.
    Returns the plan's choices, recorded in each checkpoint's manifest."""
    accel = plan.accelerator
    planned = accel.platform.device_type
    actual = args.device.type
    fix = ("Fix: build the arguments with hwrun.training.training_arguments(plan, output_dir, ...), or plan for "
           "the device you train on (hwrun.plan(device=...)).")
    if actual != planned:
        raise TrainingConfigError(
            f"TrainingArguments train on {actual!r} (use_cpu={getattr(args, 'use_cpu', None)!r}) but the plan given "
            f"to HwrunCallback is for {accel.name} (device {accel.device}, torch device type {planned!r}). {fix}")
    if getattr(args, "bf16", False) and accel.platform.is_accelerator and accel.bf16 is False:
        raise TrainingConfigError(
            f"TrainingArguments bf16=True but {accel.name} (device {accel.device}) has no bfloat16 "
            f"({accel.bf16_source or 'torch reports none'}). Fix: fp16=True, or dtype='auto' in the plan.")
    precision = "bf16" if getattr(args, "bf16", False) else ("fp16" if getattr(args, "fp16", False) else "float32")
    wanted = {"bfloat16": "bf16", "float16": "fp16"}.get(plan.dtype, "float32")
    if precision != wanted:
        logger.warning("The plan chose %s on %s (%s) but TrainingArguments compute in %s; pass %s to match the "
                       "plan (hwrun.training.training_arguments(plan, ...) does).", plan.dtype, accel.name,
                       plan.reasons.get("dtype", "plan"), precision,
                       f"{wanted}=True" if wanted != "float32" else "bf16=False, fp16=False")
    record = {"kind": "callback", "device": str(accel.device), "dtype": plan.dtype,
              "attention": plan.attention.implementation, "precision": precision}
    logger.info("HwrunCallback: training as planned on %s", record)
    return record
