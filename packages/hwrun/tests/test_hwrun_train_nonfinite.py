"""Issue 27 point 4 (and the "never replaced by a worse one" of point 3): a run whose loss or weights turn
non-finite stops with NonFiniteLossError naming the step and the value, writes no checkpoint or final model after
it, and leaves an earlier final model byte for byte; `on_nonfinite="skip"` drops such steps, "ignore" is
Transformers' own behaviour.

The non-finite value is forced at a known step through `train(callbacks=...)` (`PoisonAt` fills a trainable weight
with NaN, as a fp16 overflow or a bad batch does), so the exact step and message hold on any processor. A real
huge learning rate is tested too, but at whatever step it diverges: that step depends on the processor's rounding
(step 3 on one CPU, 5 or 6 on another, issue 40), so no assertion there names it."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import NonFiniteLossError, TrainingConfigError, TrainingError
from hwrun.training import check_checkpoint
from transformers import TrainerCallback

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "lora": True}
HUGE = 1e6  # Adam moves every LoRA weight by ~1e6 a step
#: The stop message of either kind (non-finite, or finite beyond a bound of the guard's), whatever the step and rule.
STOPPED = re.compile(r"^Training stopped at step (\d+): .+ is \S+ \(.+\), so the run diverged \(lr=(\S+)\)\. "
                     r"Nothing was saved after it: ")


class PoisonAt(TrainerCallback):
    """Fills the first trainable weight with NaN at the end of optimizer step `step` (before hwrun's guard looks)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            next(p for p in model.parameters() if p.requires_grad).data.fill_(float("nan"))


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoints(folder: Path) -> list[str]:
    """The checkpoint folders in `folder`, in step order."""
    found = [p.name for p in folder.iterdir() if p.name.startswith("checkpoint-")] if folder.is_dir() else []
    return sorted(found, key=lambda name: int(name.split("-")[1]))


def all_finite(weights_file: Path) -> bool:
    from safetensors.torch import load_file

    return all(bool(t.isfinite().all()) for t in load_file(weights_file).values())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    return hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data


def test_a_non_finite_weight_stops_the_run_before_its_checkpoint_and_saves_nothing_bad(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as caught:
        hwrun.train(plan, data, output_dir=out, max_steps=6, save_steps=1, callbacks=[PoisonAt(3)], **FAST)
    message = str(caught.value)
    # step 3's update made a weight NaN: its checkpoint is vetoed before it is written
    assert message.startswith("Training stopped at step 3: a trainable weight is nan (not finite)"), message
    assert "lr=0.0002" in message and f"the last good checkpoint is {out / 'checkpoint-2'}" in message
    assert "--lr" in message and "--on-nonfinite skip" in message
    assert isinstance(caught.value, TrainingError) and isinstance(caught.value, FloatingPointError)
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    assert check_checkpoint(out / "checkpoint-2", verify=True) is None
    assert all_finite(out / "checkpoint-2" / "adapter_model.safetensors")
    assert not (out / "adapter_model.safetensors").exists()  # no final model from a diverged run


def test_the_loss_is_checked_at_every_logged_step(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "run"
    # no save before step 100, so the weights are not looked at: the NaN loss of step 4 (the first computed with
    # the poisoned weight) stops the run
    with pytest.raises(NonFiniteLossError, match=r"^Training stopped at step 4: the training loss is nan") as caught:
        hwrun.train(plan, data, output_dir=out, max_steps=6, save_steps=100, callbacks=[PoisonAt(3)], **FAST)
    assert "no checkpoint was written" in str(caught.value)
    assert not out.exists()  # the run created the folder and saved nothing: nothing is left behind


def test_a_huge_learning_rate_stops_at_whatever_step_it_diverges_and_keeps_the_good_checkpoints(setup, tmp_path):
    """lr=1e6 for real, a checkpoint every step. Which rule trips, and at which step, is the processor's (a NaN, a
    loss worse than guessing, weights grown a million-fold: test_hwrun_train_divergence.py), so the step is read
    from the message and every checkpoint before it must be there, verified and finite, and none after it."""
    plan, data = setup
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as caught:
        hwrun.train(plan, data, output_dir=out, max_steps=20, save_steps=1, lr=HUGE, **FAST)
    message = str(caught.value)
    stopped = STOPPED.match(message)
    assert stopped, message
    step = int(stopped.group(1))
    assert float(stopped.group(2)) == HUGE and 1 <= step <= 20, message
    # a checkpoint for every step before the diverged one (the newest 3: save_total_limit), none after it
    good = [f"checkpoint-{n}" for n in range(max(1, step - 3), step)]
    assert checkpoints(out) == good, message
    assert (f"the last good checkpoint is {out / good[-1]}" if good else "no checkpoint was written") in message
    for name in good:
        assert check_checkpoint(out / name, verify=True) is None
        assert all_finite(out / name / "adapter_model.safetensors"), name
    assert not (out / "adapter_model.safetensors").exists()  # no final model from a diverged run


def test_an_earlier_final_model_is_never_replaced_by_a_diverged_one(setup, tmp_path):
    """Before: a resume trained on NaN losses and replaced the good final adapter with an all-NaN one, exit 0."""
    plan, data = setup
    out = tmp_path / "run"
    good = hwrun.train(plan, data, output_dir=out, max_steps=2, save_steps=1, **FAST)
    assert math.isfinite(good.losses[-1][1])
    before = digest(out)

    # a resume restores the checkpoint's learning-rate schedule, so lr= cannot make it diverge: poison the
    # weights after step 4 instead (what a bad batch under fp16 does)
    with pytest.raises(NonFiniteLossError, match=r"step 4: a trainable weight is nan.*an earlier final model in .* "
                                                 r"is untouched"):
        hwrun.train(plan, data, output_dir=out, max_steps=8, save_steps=1, resume="auto", callbacks=[PoisonAt(4)], **FAST)
    after = digest(out)
    assert {k: v for k, v in after.items() if k in before} == before  # final adapter and checkpoints 1-2 as they were
    assert sorted({k.split("/")[0] for k in after if k.startswith("checkpoint-")}) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3"]  # the good step 3 is kept, nothing after the NaN


def test_skip_drops_the_steps_with_non_finite_gradients(setup, tmp_path, monkeypatch):
    from hwrun.training.guard import NonFiniteGuard

    plan, data = setup
    poisoned = {2, 4}
    real = NonFiniteGuard.on_pre_optimizer_step

    def poison(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 in poisoned:  # this step's gradients turn NaN, as a fp16 overflow would
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.grad.fill_(float("nan"))
        return real(self, args, state, control, model=model, **kwargs)

    monkeypatch.setattr(NonFiniteGuard, "on_pre_optimizer_step", poison)
    out = tmp_path / "run"
    result = hwrun.train(plan, data, output_dir=out, max_steps=5, save_steps=100, on_nonfinite="skip", **FAST)
    assert result.skipped_steps == (2, 4) and result.global_step == 5
    assert "2 step(s) with non-finite gradients changed no weight: [2, 4]" in result.reasons["nonfinite"]
    assert all_finite(out / "adapter_model.safetensors")


def test_ignore_keeps_transformers_behaviour(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "run"
    result = hwrun.train(plan, data, output_dir=out, max_steps=5, save_steps=100, on_nonfinite="ignore",
                         callbacks=[PoisonAt(2)], **FAST)
    assert result.global_step == 5 and math.isnan(result.losses[-1][1])
    assert not all_finite(out / "adapter_model.safetensors")  # the NaN weights are saved like any other


def test_skip_is_refused_with_sharding_before_loading(setup, tmp_path, monkeypatch):
    plan, data = setup
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(TrainingConfigError, match="on_nonfinite='skip'.*FSDP or DeepSpeed"):
        hwrun.train(plan, data, output_dir=tmp_path / "run", max_steps=1, on_nonfinite="skip", **FAST)


def test_the_guard_is_a_trainer_callback_with_the_three_policies():
    from hwrun.training import POLICIES
    from hwrun.training.guard import NonFiniteGuard
    from transformers import TrainerCallback

    assert POLICIES == ("stop", "skip", "ignore")
    assert isinstance(NonFiniteGuard(), TrainerCallback) and NonFiniteGuard().policy == "stop"
    with pytest.raises(ValueError, match="policy='later'"):
        NonFiniteGuard("later")
