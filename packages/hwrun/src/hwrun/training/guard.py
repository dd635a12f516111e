"""`NonFiniteGuard`: the Trainer callback that keeps a diverged run from saving anything: NaN or inf, and
divergence with finite values (a loss spike, exploding gradients, weights that blew up).

Policies (`train(..., on_nonfinite=...)`, `hwrun train --on-nonfinite`):
- "stop" (default): the logged loss and gradient norm are checked at every logging step (hwrun logs every
  step), and hwrun makes Trainer log before every checkpoint and at the last step; the trainable weights are
  checked there too (a step can turn them to NaN while its own loss was still finite). The first non-finite or
  diverged value stops training before anything is saved; `train()` then raises `NonFiniteLossError`
  (`TrainingDivergedError` for a finite divergence) naming the step, the value and the rule.
- "skip": a step whose gradients are not finite changes no weight (its gradients are dropped before the
  optimizer step); training goes on. Costs one device-to-host sync per step. A finite divergence (below)
  still stops the run: dropping one step cannot undo it.
- "ignore": no check (Transformers' own behaviour: NaN weights are saved like any other).

The divergence rules (issue 42: `--lr 1e6` ended at loss 11.4 with weights near 2e6, "adapter saved"). Each
threshold sits orders of magnitude, or whole nats, away from anything a healthy run logs, so no processor's
rounding decides whether a run trips; on the tiny model at lr=1e6 each is passed by a wide margin (loss 15.2
against 9.0 at step 2, weights 1e6 against 100 after step 1), at lr=2e-4 none comes near (loss 4.7-5.1, weights
below 0.09). A rule whose reference is not known yet (no vocabulary size, fewer than `EARLY` steps) does not trip.
- loss worse than guessing: above max(ln(vocabulary size), the first logged loss) + `UNIFORM_MARGIN` nats.
  A model that predicts worse than a uniform guess over its vocabulary by a whole nat has left training behind.
- loss spike: after the first `EARLY` logged steps, above `LOSS_SPIKE` x the highest loss among them.
- gradient norm: not finite (outside fp16 training, whose loss scaler skips such steps by design), or above
  `GRAD_SPIKE` x the highest gradient norm of the first `EARLY` steps. Trainer logs the norm before clipping.
- weights: at each check (every checkpoint and the last step), the largest trainable weight in absolute value
  above max(`WEIGHT_GROWTH` x its value at the start of training, `WEIGHT_FLOOR`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import TrainerCallback

from .options import POLICIES

logger = logging.getLogger(__name__)

#: Nats above max(ln(vocabulary size), the first logged loss) at which the loss counts as diverged.
UNIFORM_MARGIN = 1.0
#: Logged steps whose losses and gradient norms are the reference of the spike rules.
EARLY = 5
#: A loss above this multiple of the highest of the first EARLY losses is a divergence.
LOSS_SPIKE = 3.0
#: A gradient norm above this multiple of the highest of the first EARLY norms is a divergence.
GRAD_SPIKE = 1000.0
#: The largest trainable weight above this multiple of its start (and above WEIGHT_FLOOR) is a divergence.
WEIGHT_GROWTH = 1000.0
WEIGHT_FLOOR = 100.0


def _trainable(model: Any) -> list:
    return [p for p in model.parameters() if p.requires_grad] if model is not None else []


def all_finite(tensors: list) -> bool:
    """True when every element of every tensor is finite (one device-to-host sync for the lot)."""
    import torch

    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all().item())


def largest_weight(tensors: list) -> float:
    """The largest absolute value over `tensors` (nan when any is NaN; one device-to-host sync for the lot)."""
    import torch

    tensors = [t.detach() for t in tensors if t is not None and t.numel()]
    if not tensors:
        return 0.0
    return float(torch.stack([t.abs().max().float() for t in tensors]).max().item())


def vocabulary_size(model: Any) -> int | None:
    """The model's output vocabulary (config.vocab_size, else the output embedding's rows), or None."""
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    if isinstance(size, int) and size > 1:
        return size
    try:
        return int(model.get_output_embeddings().weight.shape[0])
    except (AttributeError, TypeError):
        return None


def _show(value: float) -> str:
    return str(value) if not math.isfinite(value) else f"{value:.4g}"


class NonFiniteGuard(TrainerCallback):
    """Stops (or skips the step) on a non-finite loss, weights or gradients, and stops a finite divergence; see
    the module docstring for the rules.

    `check_weights=False` where parameters are sharded (FSDP, DeepSpeed ZeRO): each rank would see only its
    shard and could decide differently, so there only the (gathered) logged loss and gradient norm are checked."""

    def __init__(self, policy: str = "stop", *, check_weights: bool = True) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not one of {POLICIES}")
        self.policy = policy
        self.check_weights = check_weights
        #: (step, what was out of bounds, its value) once the guard stopped the run; `rule` says which bound
        self.tripped: tuple[int, str, float] | None = None
        self.rule: str | None = None
        #: optimizer steps whose update was dropped ("skip")
        self.skipped: list[int] = []
        self.vocabulary: int | None = None
        self.losses: list[float] = []  # the first EARLY logged losses (finite ones)
        self.grad_norms: list[float] = []  # the first EARLY logged gradient norms (finite ones)
        self.start_weight: float | None = None
        self.fp16 = False

    @property
    def diverged(self) -> bool:
        """The run stopped on a finite divergence (a loss, gradient norm or weight beyond its bound)."""
        return self.tripped is not None and math.isfinite(self.tripped[2])

    def stop_error(self, resume: str) -> Exception | None:
        """The error of a stopped run, None while it is not: `TrainingDivergedError` (a finite divergence) or
        `NonFiniteLossError` (NaN/inf), naming the step, the value and the rule; `resume` says how to resume."""
        from ..errors import NonFiniteLossError, TrainingDivergedError

        if self.tripped is None:
            return None
        step, what, value = self.tripped
        if self.diverged:
            return TrainingDivergedError(f"Training stopped at step {step}: {what} is {value:.4g} ({self.rule}); "
                                         f"nothing was saved after it. Fix: a lower learning rate, then resume from "
                                         f"{resume}.")
        return NonFiniteLossError(f"Training stopped at step {step}: {what} is {value} (not finite); nothing was saved "
                                  f"after it. Fix: a lower learning rate, then resume from {resume}, or "
                                  "on_nonfinite='skip'.")

    def _trip(self, state: Any, control: Any, what: str, value: float, rule: str = "not finite") -> None:
        if self.tripped is None:
            self.tripped = (state.global_step, what, value)
            self.rule = rule
            # info, not error: train() raises NonFiniteLossError with all of this (the CLI's one line)
            logger.info("Step %d: %s is %s (%s); stopping without saving (on_nonfinite=%r).",
                        state.global_step, what, _show(value), rule, self.policy)
        control.should_save = False
        control.should_training_stop = True

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        self.fp16 = bool(getattr(args, "fp16", False))
        if self.policy == "ignore" or model is None:
            return control
        self.vocabulary = vocabulary_size(model)
        if self.check_weights:
            start = largest_weight(_trainable(model))
            self.start_weight = start if math.isfinite(start) else None
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.policy == "ignore" or not (control.should_save or control.should_training_stop):
            return control
        control.should_log = True  # the loss is checked (on_log) before this step's save or the final one
        if not self.check_weights:
            return control
        trainable = _trainable(model)
        if self.policy == "stop" and not all_finite(trainable):
            self._trip(state, control, "a trainable weight", math.nan)
        elif self.start_weight is not None:
            largest = largest_weight(trainable)
            bound = max(WEIGHT_GROWTH * self.start_weight, WEIGHT_FLOOR)
            if math.isfinite(largest) and largest > bound:
                self._trip(state, control, "the largest trainable weight", largest,
                           f"above {bound:.4g}: {WEIGHT_GROWTH:g}x its {self.start_weight:.4g} at the start "
                           f"of training, at least {WEIGHT_FLOOR:g}")
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        logs = logs or {}
        if self.policy == "ignore":
            return control
        loss, norm = logs.get("loss"), logs.get("grad_norm")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            self._check_loss(state, control, float(loss))
        if isinstance(norm, (int, float)) and not isinstance(norm, bool):
            self._check_grad_norm(state, control, float(norm))
        if self.tripped is not None:
            control.should_save = False
        return control

    def _check_loss(self, state: Any, control: Any, loss: float) -> None:
        if not math.isfinite(loss):
            if self.policy == "stop":
                self._trip(state, control, "the training loss", loss)
            return
        first = self.losses[0] if self.losses else loss
        if self.vocabulary:
            uniform = math.log(self.vocabulary)
            bound = max(uniform, first) + UNIFORM_MARGIN
            if loss > bound:
                self._trip(state, control, "the training loss", loss,
                           f"above {bound:.4g}: {UNIFORM_MARGIN:g} nat worse than guessing uniformly over the "
                           f"{self.vocabulary:,}-token vocabulary (ln {self.vocabulary:,} = {uniform:.4g})"
                           + (f" or than the first logged loss {first:.4g}" if first > uniform else ""))
                return
        if len(self.losses) < EARLY:
            self.losses.append(loss)
        elif loss > LOSS_SPIKE * max(self.losses):
            self._trip(state, control, "the training loss", loss,
                       f"above {LOSS_SPIKE * max(self.losses):.4g}: {LOSS_SPIKE:g}x the highest of the first "
                       f"{EARLY} logged losses, {max(self.losses):.4g}")

    def _check_grad_norm(self, state: Any, control: Any, norm: float) -> None:
        if not math.isfinite(norm):
            if not self.fp16 and self.policy == "stop":  # fp16's loss scaler skips such steps itself
                self._trip(state, control, "the gradient norm", norm)
            return
        if len(self.grad_norms) < EARLY:
            self.grad_norms.append(norm)
        elif max(self.grad_norms) > 0 and norm > GRAD_SPIKE * max(self.grad_norms):
            self._trip(state, control, "the gradient norm", norm,
                       f"above {GRAD_SPIKE * max(self.grad_norms):.4g}: {GRAD_SPIKE:g}x the highest of the first "
                       f"{EARLY} logged gradient norms, {max(self.grad_norms):.4g}")

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
