"""Issue 26 point 4 for training: `train()` runs in phases (validate, output, data, arguments, load, patch, train,
save), and a run that fails mid-way leaves the model it loaded without any of hwrun's patches; every patch's
undo is idempotent."""

from __future__ import annotations

import hwrun
import pytest
from transformers import TrainerCallback

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("phases")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    return hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data


class FailAt(TrainerCallback):
    """Keeps the model Trainer trains and raises at the end of step `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.model = step, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.model = model

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("injected failure mid-run")


def patched_state(model) -> dict:
    """Every trace hwrun's training patches leave on a model (all empty/False when none is in place)."""
    from hwrun.training.patches import fused_loss, fused_projections, rope_table

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    rotary = rope_table.rotary_module(base)
    layers = base.get_decoder().layers
    return {
        "fused loss forward": "forward" in vars(base),
        "fused loss flag": hasattr(base, fused_loss._FLAG),
        "rope table": rotary is not None and "forward" in vars(rotary),
        "fused projections flag": hasattr(base, fused_projections._FLAG),
        "fused attention forwards": sum("forward" in vars(layer.self_attn) for layer in layers),
        "fused mlp forwards": sum("forward" in vars(layer.mlp) for layer in layers),
        "attention": base.config._attn_implementation,
        "use_cache": base.config.use_cache,
    }


CLEAN = {"fused loss forward": False, "fused loss flag": False, "rope table": False, "fused projections flag": False,
         "fused attention forwards": 0, "fused mlp forwards": 0, "attention": "sdpa", "use_cache": True}


@pytest.mark.parametrize("lora", [True, None])
def test_a_run_that_fails_mid_way_leaves_the_model_without_patches(setup, tmp_path, lora):
    plan, data = setup
    spy = FailAt(2)
    with pytest.raises(RuntimeError, match="injected failure mid-run"):
        hwrun.train(plan, data, lora=lora, max_steps=4, output_dir=tmp_path / "out", callbacks=[spy], **FAST)
    assert spy.model is not None
    assert patched_state(spy.model) == CLEAN


def test_while_training_the_patches_are_in_place(setup, tmp_path):
    """The check above can fail: during the run the same probe sees every patch."""
    plan, data = setup
    seen = {}

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            seen.update(patched_state(model))

    hwrun.train(plan, data, lora=True, max_steps=1, output_dir=tmp_path / "out", callbacks=[Look()], **FAST)
    assert seen["fused loss forward"] and seen["rope table"] and seen["fused projections flag"]
    assert seen["fused attention forwards"] > 0 and seen["attention"] != "sdpa" and seen["use_cache"] is False


def test_a_failure_before_training_starts_undoes_the_patches_too(setup, tmp_path, monkeypatch):
    import hwrun.training.run as run

    plan, data = setup
    kept = {}
    real_patch = run._patch

    def patch_then_keep(model, *args, **kwargs):
        kept["model"] = real_patch(model, *args, **kwargs)
        return kept["model"]

    def no_trainer(*args, **kwargs):
        raise RuntimeError("trainer cannot be built")

    monkeypatch.setattr(run, "_patch", patch_then_keep)
    monkeypatch.setattr(run, "_trainer", no_trainer)
    with pytest.raises(RuntimeError, match="trainer cannot be built"):
        hwrun.train(plan, data, lora=True, max_steps=1, output_dir=tmp_path / "out", **FAST)
    assert patched_state(kept["model"]) == CLEAN
    assert not (tmp_path / "out").exists()


def test_the_phases_run_in_order_and_nothing_loads_before_the_checks(setup, tmp_path, monkeypatch):
    import hwrun.training.run as run

    plan, data = setup
    order = []
    for name in ("_validate", "_check_keywords", "_prepare_output", "_prepare_data", "_arguments", "_load", "_patch",
                 "_trainer", "_train", "_check_finite", "_save"):
        real = getattr(run, name)
        monkeypatch.setattr(run, name, lambda *a, _real=real, _name=name, **k: order.append(_name) or _real(*a, **k))
    hwrun.train(plan, data, lora=True, max_steps=1, output_dir=tmp_path / "out", **FAST)
    assert order == ["_validate", "_check_keywords", "_prepare_output", "_prepare_data", "_arguments", "_load",
                     "_patch", "_trainer", "_train", "_check_finite", "_save"]


def test_every_patch_undo_is_idempotent(setup):
    from hwrun.training import (
        apply_fused_loss,
        apply_fused_projections,
        apply_rope_table,
        lora_config,
    )
    from hwrun.training.patching import PatchStack
    from peft import get_peft_model

    plan, _ = setup
    model, _ = hwrun.load(plan)
    stack = PatchStack()
    stack.add("fused loss", apply_fused_loss(model))
    stack.add("rope table", apply_rope_table(model, 32))
    peft_model = get_peft_model(model, lora_config(model.config))
    stack.add("fused projections", apply_fused_projections(peft_model, "inductor"))
    calls = []
    stack.push("a plain step", lambda: calls.append(1))
    assert stack.names == ["fused loss", "rope table", "fused projections", "a plain step"]
    stack.undo()
    stack.undo()  # nothing left to do
    assert calls == [1] and stack.names == []
    clean = patched_state(peft_model)
    for patch in (apply_fused_loss(model), apply_rope_table(model, 32), apply_fused_projections(peft_model, "inductor")):
        patch.undo()
        patch.undo()  # each record's undo alone is idempotent too
    assert patched_state(peft_model) == clean
    assert not clean["fused loss forward"] and not clean["rope table"] and not clean["fused projections flag"]


def test_a_failing_undo_step_does_not_stop_the_others():
    from hwrun.training.patching import PatchStack

    stack, calls = PatchStack(), []

    def broken():
        raise OSError("cannot undo")

    stack.push("first", lambda: calls.append("first"))
    stack.push("broken", broken)
    stack.push("last", lambda: calls.append("last"))
    with pytest.raises(OSError, match="cannot undo"):
        stack.undo()
    assert calls == ["last", "first"] and stack.names == []
