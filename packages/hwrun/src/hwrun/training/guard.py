"""`NonFiniteGuard`: the Trainer callback that keeps a diverged run (NaN or inf) from saving anything.

Policies (`train(..., on_nonfinite=...)`, `hwrun train --on-nonfinite`):
- "stop" (default): the logged loss is checked at every logging step, and hwrun makes Trainer log before
  every checkpoint and at the last step; the trainable weights are checked there too (a step can turn them
  to NaN while its own loss was still finite). The first non-finite value stops training before anything is
  saved; `train()` then raises `NonFiniteLossError` naming the step and the value.
- "skip": a step whose gradients are not finite changes no weight (its gradients are dropped before the
  optimizer step); training goes on. Costs one device-to-host sync per step.
- "ignore": no check (Transformers' own behaviour: NaN weights are saved like any other).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import TrainerCallback

from .options import POLICIES

logger = logging.getLogger(__name__)


def _trainable(model: Any) -> list:
    return [p for p in model.parameters() if p.requires_grad] if model is not None else []


def all_finite(tensors: list) -> bool:
    """True when every element of every tensor is finite (one device-to-host sync for the lot)."""
    import torch

    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all().item())


class NonFiniteGuard(TrainerCallback):
    """Stops (or skips the step) on a non-finite loss, weights or gradients; see the module docstring.

    `check_weights=False` where parameters are sharded (FSDP, DeepSpeed ZeRO): each rank would see only its
    shard and could decide differently, so there only the (gathered) logged loss is checked."""

    def __init__(self, policy: str = "stop", *, check_weights: bool = True) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not one of {POLICIES}")
        self.policy = policy
        self.check_weights = check_weights
        #: (step, what was not finite, its value) once the guard stopped the run
        self.tripped: tuple[int, str, float] | None = None
        #: optimizer steps whose update was dropped ("skip")
        self.skipped: list[int] = []

    def _trip(self, state: Any, control: Any, what: str, value: float) -> None:
        if self.tripped is None:
            self.tripped = (state.global_step, what, value)
            # info, not error: train() raises NonFiniteLossError with all of this (the CLI's one line)
            logger.info("Step %d: %s is %s (not finite); stopping without saving (on_nonfinite='stop').",
                        state.global_step, what, value)
        control.should_save = False
        control.should_training_stop = True

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.policy != "stop" or not (control.should_save or control.should_training_stop):
            return control
        control.should_log = True  # the loss is checked (on_log) before this step's save or the final one
        if self.check_weights and not all_finite(_trainable(model)):
            self._trip(state, control, "a trainable weight", math.nan)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        loss = (logs or {}).get("loss")
        if self.policy == "stop" and isinstance(loss, float) and not math.isfinite(loss):
            self._trip(state, control, "the training loss", loss)
        elif self.tripped is not None:
            control.should_save = False
        return control

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.policy != "skip":
            return control
        parameters = [p for p in _trainable(model) if p.grad is not None]
        if not all_finite([p.grad for p in parameters]):
            for parameter in parameters:
                parameter.grad = None  # torch's optimizers leave a parameter without a gradient as it is
            self.skipped.append(state.global_step + 1)
            logger.warning("Step %d: non-finite gradients; the step is skipped (on_nonfinite='skip').",
                           state.global_step + 1)
        return control
