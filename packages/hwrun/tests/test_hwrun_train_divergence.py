"""Issue 42 point 4: divergence with finite values stops the run like NaN does (`--lr 1e6` ended at loss 11.4 with
weights near 2e6, "adapter saved"). The guard's rules are driven here with logged values chosen on either side of
each bound, far from it (no processor's rounding decides a case); one real run at lr=1e6 checks the wiring and
asserts no step (where a run diverges is the processor's)."""

from __future__ import annotations

import math

import hwrun
import pytest
import torch
from hwrun.errors import NonFiniteLossError, TrainingDivergedError
from hwrun.training.guard import EARLY, NonFiniteGuard
from transformers import TrainerControl, TrainerState, TrainingArguments

V = 3072  # the shipped tiny model's vocabulary: ln V = 8.03, so the worse-than-guessing bound is 9.03
EARLY_LOSSES = [(2.0, 1.0)] * EARLY  # (loss, grad norm) of the first EARLY steps: the spike rules' reference


class Tiny(torch.nn.Module):
    def __init__(self, vocab: int | None = V) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 0.1))
        if vocab:
            self.config = type("Config", (), {"vocab_size": vocab})()


def drive(guard: NonFiniteGuard, steps: list, *, vocab: int | None = V, fp16: bool = False, weights: dict | None = None):
    """Feed `steps` [(loss, grad_norm), ...] to the guard as Trainer does (step end, then the log); `weights`
    {step: value} sets the trainable weight before that step's check (each step is a save step)."""
    model, args = Tiny(vocab), TrainingArguments("unused", use_cpu=True, report_to=[])
    args.fp16 = fp16  # set after construction: fp16 itself is refused on a CPU, the guard only reads the flag
    state, control = TrainerState(), TrainerControl()
    guard.on_train_begin(args, state, control, model=model)
    for step, (loss, norm) in enumerate(steps, start=1):
        state.global_step = step
        if weights and step in weights:
            model.weight.data.fill_(weights[step])
        control.should_save = True
        guard.on_step_end(args, state, control, model=model)
        guard.on_log(args, state, control, logs={"loss": loss, "grad_norm": norm})
        if control.should_training_stop:
            break
    return guard.tripped, guard.rule


CASES = [
    # id, policy, steps, options, tripped (step, what) or None, words the rule must contain
    ("healthy-noisy", "stop", [(5.0, 8.0), (5.4, 9.0), (4.7, 7.0), (6.1, 20.0), (4.5, 7.5), (4.4, 7.0), (7.5, 50.0)],
     {}, None, ""),
    ("nan-loss", "stop", [(5.0, 8.0), (math.nan, 8.0)], {}, (2, "the training loss"), "not finite"),
    ("inf-loss", "stop", [(5.0, 8.0), (math.inf, 8.0)], {}, (2, "the training loss"), "not finite"),
    ("worse-than-guessing", "stop", [(5.0, 8.0), (15.2, 59.0)], {}, (2, "the training loss"), "guessing uniformly"),
    ("below-guessing-bound", "stop", [(5.0, 8.0), (8.5, 8.0)], {}, None, ""),
    ("starts-above-guessing", "stop", [(10.0, 8.0), (10.8, 8.0), (11.6, 8.0)], {}, (3, "the training loss"),
     "first logged loss 10"),
    ("loss-spike", "stop", [*EARLY_LOSSES, (6.5, 1.0)], {"vocab": None}, (EARLY + 1, "the training loss"),
     "3x the highest"),
    ("loss-below-spike", "stop", [*EARLY_LOSSES, (5.5, 1.0)], {"vocab": None}, None, ""),
    ("grad-norm-inf", "stop", [(5.0, 8.0), (5.0, math.inf)], {}, (2, "the gradient norm"), "not finite"),
    ("grad-norm-inf-fp16", "stop", [(5.0, 8.0), (5.0, math.inf), (5.0, 8.0)], {"fp16": True}, None, ""),
    ("grad-norm-spike", "stop", [*EARLY_LOSSES, (2.0, 5000.0)], {}, (EARLY + 1, "the gradient norm"),
     "1000x the highest"),
    ("grad-norm-below-spike", "stop", [*EARLY_LOSSES, (2.0, 500.0)], {}, None, ""),
    ("weights-blew-up", "stop", [(5.0, 8.0), (5.0, 8.0)], {"weights": {2: 1e6}}, (2, "the largest trainable weight"),
     "1000x its 0.1"),
    ("weights-below-floor", "stop", [(5.0, 8.0), (5.0, 8.0)], {"weights": {2: 50.0}}, None, ""),
    ("weights-nan", "stop", [(5.0, 8.0)], {"weights": {1: math.nan}}, (1, "a trainable weight"), "not finite"),
    ("skip-leaves-nan-to-the-step-skip", "skip", [(5.0, 8.0), (math.nan, math.nan), (5.0, 8.0)], {}, None, ""),
    ("skip-still-stops-divergence", "skip", [(5.0, 8.0), (15.2, 8.0)], {}, (2, "the training loss"), "guessing"),
    ("ignore-checks-nothing", "ignore", [(5.0, 8.0), (math.nan, math.inf), (99.0, 1e9)], {"weights": {2: 1e9}},
     None, ""),
]


@pytest.mark.parametrize(("policy", "steps", "options", "expected", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_guard_stops_each_kind_of_divergence_and_nothing_healthy(policy, steps, options, expected, words):
    tripped, rule = drive(NonFiniteGuard(policy), steps, **options)
    if expected is None:
        assert tripped is None, (tripped, rule)
        return
    assert tripped is not None and tripped[:2] == expected, (tripped, rule)
    assert words in rule


def test_a_tripped_guard_vetoes_the_save_of_that_step():
    guard = NonFiniteGuard()
    args, state, control = TrainingArguments("unused", use_cpu=True, report_to=[]), TrainerState(), TrainerControl()
    guard.on_train_begin(args, state, control, model=Tiny())
    state.global_step = 1
    guard.on_log(args, state, control, logs={"loss": 5.0, "grad_norm": 1.0})
    assert control.should_save is False and guard.tripped is None
    state.global_step, control.should_save = 2, True
    guard.on_log(args, state, control, logs={"loss": 50.0, "grad_norm": 1.0})
    assert control.should_save is False and control.should_training_stop is True and guard.diverged


def test_a_huge_learning_rate_stops_before_anything_is_saved(tmp_path):
    """lr=1e6 for real: whichever rule trips first (processor-dependent: a loss worse than guessing, weights grown a
    million-fold, or a NaN), the run stops with a NonFiniteLossError and its new folder is gone."""
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as caught:
        hwrun.train(plan, data, lora=True, output_dir=out, max_steps=20, lr=1e6, batch_size=4, block_size=32,
                    disable_tqdm=True, plot=False)
    message = str(caught.value)
    assert "so the run diverged (lr=1000000.0). Nothing was saved after it: no checkpoint was written" in message
    if isinstance(caught.value, TrainingDivergedError):
        assert "above" in message and "--on-nonfinite ignore" in message
    assert not out.exists()
