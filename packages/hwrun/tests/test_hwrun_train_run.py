"""`hwrun.train` end to end on a tiny Llama (CPU): LoRA learns, only adapters change, resume is
seamless, a failed save leaves the previous checkpoint, merge/adapter outputs load, QLoRA runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import hwenv
import hwrun
import pytest
from hwrun.training import (
    CheckpointError,
    QLoRAUnsupportedError,
    TrainingConfigError,
    TrainingDataError,
    check_checkpoint,
    latest_complete_checkpoint,
)
from hwrun.training.checkpoints import schedule_change

TEXT = ("The king said to the queen that the castle was cold. The queen said the king should build a "
        "fire. Once upon a time there was a little house by the river. ") * 12
FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(base model folder, training text file): the shipped tiny model when present, else a built one."""
    root = tmp_path_factory.mktemp("tiny")
    default = Path(hwrun.DEFAULT_MODEL)
    if (default / "config.json").is_file():
        model = default
        sample = default / "sample_train.txt"
    else:
        from hwrun.testing import build_tiny_model

        model = build_tiny_model(root / "model")
        sample = None
    data = root / "train.txt"
    data.write_text(sample.read_text(encoding="utf-8")[:4000] if sample and sample.is_file() else TEXT,
                    encoding="utf-8")
    return str(model), data


@pytest.fixture(scope="module")
def cpu_plan(tiny):
    return hwrun.plan(tiny[0], device="cpu")


def eval_loss(model, dataset):
    import torch

    with torch.no_grad():
        batch = dataset.blocks
        return model(input_ids=batch, labels=batch).loss.item()


def test_lora_lowers_loss_and_changes_only_adapter_weights(tiny, cpu_plan, tmp_path, monkeypatch):
    import importlib

    import torch
    from hwrun.training import build_dataset, load_adapter_model
    from safetensors.torch import load_file

    load_module = importlib.import_module("hwrun.model.load")
    tokenizer_loads = []
    real_load_tokenizer = load_module.load_tokenizer
    monkeypatch.setattr(load_module, "load_tokenizer",
                        lambda *a, **k: tokenizer_loads.append(a) or real_load_tokenizer(*a, **k))
    out = tmp_path / "run"
    result = hwrun.train(cpu_plan, tiny[1], lora=True, max_steps=8, lr=3e-3, output_dir=out, **FAST)
    assert len(tokenizer_loads) == 1  # the tokenizer that packed the data is the one training uses
    monkeypatch.undo()
    assert result.global_step == 8 and result.interrupted is None and result.lora
    assert "causal kernel with no mask" in result.reasons["attention"]  # packed blocks: hwattn.causal
    layers = hwrun.load(cpu_plan)[0].config.num_hidden_layers
    assert result.reasons["projections"] == f"one matmul for q/k/v in {layers} layers and gate/up in {layers} layers"
    assert result.reasons["rope"] == "RoPE cos/sin from a precomputed table of 32 positions"
    assert [s for s, _ in result.losses] == list(range(1, 9))
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "config.json").exists()  # the adapter alone, not a copy of the base

    base, tokenizer = hwrun.load(cpu_plan)
    tuned, _ = load_adapter_model(out, cpu_plan)
    dataset = build_dataset(tiny[1], tokenizer, block_size=32)
    before, after = eval_loss(base, dataset), eval_loss(tuned, dataset)
    assert after < before - 0.3, (before, after)

    # base weights are bit-identical; every LoRA B matrix (zero at init) has moved
    base_state = base.state_dict()
    for name, value in tuned.base_model.model.state_dict().items():
        if "lora_" in name:
            continue
        key = name.replace(".base_layer", "")
        assert torch.equal(value, base_state[key]), key
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(torch.count_nonzero(v) > 0 for v in lora_b)
    # the targets are PEFT's mapping for llama (q_proj, v_proj in peft 0.21), not a table of hwrun's
    from hwrun.training import peft_target_mapping

    expected = sorted(peft_target_mapping()["llama"])
    assert sorted({k.split(".")[-3] for k in adapter}) == expected
    assert result.reasons["lora"] == f"r=16 on {','.join(expected)} (peft's mapping for llama: " \
        f"{', '.join(peft_target_mapping()['llama'])})"


class KillAt:
    """A callback that sends this process SIGTERM at the end of step `step` (a real signal)."""

    def __init__(self, step: int) -> None:
        from transformers import TrainerCallback

        outer = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == outer.step:
                    os.kill(os.getpid(), signal.SIGTERM)

        self.step = step
        self.callback = _Callback()


def test_sigterm_saves_and_resume_continues_the_same_loss_curve(tiny, cpu_plan, tmp_path):
    options = dict(lora=True, max_steps=6, lr=3e-3, save_steps=100, **FAST)
    straight = hwrun.train(cpu_plan, tiny[1], output_dir=tmp_path / "straight", **options)

    out = tmp_path / "stopped"
    previous = signal.getsignal(signal.SIGTERM)
    first = hwrun.train(cpu_plan, tiny[1], output_dir=out, callbacks=[KillAt(3).callback], **options)
    assert signal.getsignal(signal.SIGTERM) is previous  # handler restored
    assert first.interrupted == "SIGTERM" and first.global_step == 3
    assert check_checkpoint(out / "checkpoint-3") is None
    assert not (out / "adapter_config.json").exists()  # no final model from an interrupted run

    # checkpoint-3's real trainer_state.json: another max_steps would rebuild the LR schedule
    changed = schedule_change(out / "checkpoint-3", 8, 1.0)
    assert "max_steps=6" in changed and "max_steps=8" in changed and "jumps at step 3" in changed
    assert "last logged learning rate" in changed
    assert schedule_change(out / "checkpoint-3", 6, 1.0) is None

    second = hwrun.train(cpu_plan, tiny[1], output_dir=out, resume="auto", **options)
    assert second.resumed_from == str(out / "checkpoint-3")
    assert second.reasons["resume"] == f"from {out / 'checkpoint-3'}, same schedule"
    assert second.global_step == 6 and second.interrupted is None
    assert [s for s, _ in second.losses] == [s for s, _ in straight.losses] == list(range(1, 7))
    for (step, resumed), (_, uninterrupted) in zip(second.losses, straight.losses, strict=True):
        assert resumed == pytest.approx(uninterrupted, abs=1e-4), step


def test_failure_inside_save_leaves_previous_checkpoint_loadable(tiny, cpu_plan, tmp_path, monkeypatch):
    out = tmp_path / "crash"
    from transformers import Trainer

    original = Trainer._save_rng_state

    def failing(self, output_dir):
        if self.state.global_step == 4:
            raise OSError("disk full (injected)")
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", failing)
    with pytest.raises(OSError, match="injected") as caught:  # a CheckpointWriteError, also an OSError
        hwrun.train(cpu_plan, tiny[1], lora=True, max_steps=6, save_steps=2, output_dir=out, **FAST)
    assert f"the last complete checkpoint, {out / 'checkpoint-2'}, is untouched" in str(caught.value)
    assert check_checkpoint(out / "checkpoint-2") is None
    assert not (out / "checkpoint-4").exists()
    assert not (out / ".staging-checkpoint-4").exists()  # the partial save is removed (issue 42: its space)
    assert latest_complete_checkpoint(out) == out / "checkpoint-2"

    from peft import PeftModel

    base, _ = hwrun.load(cpu_plan)
    PeftModel.from_pretrained(base, str(out / "checkpoint-2"))  # the previous checkpoint loads

    monkeypatch.setattr(Trainer, "_save_rng_state", original)
    resumed = hwrun.train(cpu_plan, tiny[1], lora=True, max_steps=6, save_steps=2, output_dir=out, **FAST)
    assert resumed.resumed_from == str(out / "checkpoint-2") and resumed.global_step == 6
    assert not (out / ".staging-checkpoint-4").exists()
    assert check_checkpoint(out / "checkpoint-4") is None


def test_merged_output_is_a_plain_model_equal_to_base_plus_adapter(tiny, cpu_plan, tmp_path):
    import torch
    from hwrun.training import load_adapter_model

    adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
    options = dict(lora=True, max_steps=3, lr=3e-3, **FAST)
    hwrun.train(cpu_plan, tiny[1], output_dir=adapter_out, **options)
    result = hwrun.train(cpu_plan, tiny[1], output_dir=merged_out, merge=True, **options)
    assert result.merged
    assert (merged_out / "config.json").is_file() and (merged_out / "model.safetensors").is_file()
    assert not (merged_out / "adapter_config.json").exists()
    saved_config = (merged_out / "config.json").read_text()
    assert "hwattn_causal_sdpa" not in saved_config  # training's attention is undone
    assert '"use_cache": false' not in saved_config  # and so is training's use_cache=False

    merged, tokenizer = hwrun.load(hwrun.plan(str(merged_out), device="cpu"))
    with_adapter, _ = load_adapter_model(adapter_out, cpu_plan)
    adapter_plan = hwrun.plan(str(adapter_out), device="cpu")  # what `hwrun generate --model OUT` does
    assert adapter_plan.adapter == str(adapter_out.resolve()) and "LoRA adapter" in adapter_plan.reasons["model"]
    planned, _ = hwrun.load(adapter_plan)
    ids = tokenizer("The queen said", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(merged(input_ids=ids).logits, planned(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.facts("X15", "G11")
def test_qlora_trains_a_4bit_base(tiny, cpu_plan, tmp_path):
    result = hwrun.train(cpu_plan, tiny[1], qlora=True, max_steps=2, lr=3e-3, output_dir=tmp_path / "q", **FAST)
    assert result.lora and result.global_step == 2
    assert "4-bit NF4" in result.reasons["model"]
    assert (tmp_path / "q" / "adapter_model.safetensors").is_file()
    assert result.reasons["lora"] == "r=16 on q_proj,v_proj (peft's mapping for llama: q_proj, v_proj)"  # as LoRA


def test_qlora_all_linear_adapts_the_4bit_layers_but_not_the_head(tiny, cpu_plan, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "q"
    result = hwrun.train(cpu_plan, tiny[1], qlora=True, lora={"target_modules": ["all-linear"]}, max_steps=1,
                         output_dir=out, **FAST)
    assert result.reasons["lora"] == ("r=16 on down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj (given: "
                                      "all-linear (PEFT's every linear layer but the output head))")
    assert not any("lm_head" in key for key in load_file(out / "adapter_model.safetensors"))


def test_qlora_where_bitsandbytes_cannot_run_names_device_and_alternative(tiny, tmp_path, monkeypatch):
    mps_plan = hwrun.plan(tiny[0], device=hwenv.Accelerator("mps", 1))
    loaded = []
    monkeypatch.setattr("hwrun.model.load.load", lambda plan, **_: loaded.append(plan))
    with pytest.raises(QLoRAUnsupportedError, match=r"device mps.*What works instead: LoRA") as info:
        hwrun.train(mps_plan, tiny[1], qlora=True, max_steps=1, output_dir=tmp_path / "x")
    assert isinstance(info.value, ValueError)
    assert loaded == []


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_size": 0}, "batch_size=0"),
    ({"grad_accum": 0}, "grad_accum=0"),
    ({"lr": -1.0}, "lr=-1.0"),
    ({"max_steps": 0}, "max_steps=0"),
    ({"max_steps": -1, "epochs": 0}, "epochs=0"),
    ({"max_steps": -1, "epochs": float("inf")}, "epochs=inf"),
    ({"seed": -1}, r"seed=-1 \(must be an int in 0..2\*\*32-1"),
    ({"save_steps": 0}, r"save_steps=0 \(must be an int >= 1"),
    ({"merge": True}, "merge=True needs LoRA"),
    ({"lora": "yes"}, "lora='yes' is not understood"),
    ({"lora": {"r": 0}}, "r=0"),
    ({"lora": {"target_modules": []}}, r"target_modules=\(\) names no module"),
    ({"lora": {"target_modules": ["q_proj"]}, "bf16": True}, None),
])
def test_bad_options_are_rejected_before_loading(tiny, cpu_plan, tmp_path, monkeypatch, options, message):
    monkeypatch.setattr("hwrun.model.load.load", lambda plan, **_: pytest.fail("the model must not load"))
    options = {"max_steps": 1, "batch_size": 1, **options}  # one block a step: the small data holds that many
    if message is None:  # reaches load: everything valid (bf16 AMP is allowed on CPU)
        with pytest.raises(pytest.fail.Exception):
            hwrun.train(cpu_plan, tiny[1], output_dir=tmp_path / "x", **options)
        return
    with pytest.raises(TrainingConfigError, match=message):
        hwrun.train(cpu_plan, tiny[1], output_dir=tmp_path / "x", **options)


def test_bad_data_and_resume_are_rejected_before_loading(tiny, cpu_plan, tmp_path, monkeypatch):
    monkeypatch.setattr("hwrun.model.load.load", lambda plan, **_: pytest.fail("the model must not load"))
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="empty"):
        hwrun.train(cpu_plan, empty, lora=True, max_steps=1, output_dir=tmp_path / "x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": 1}\n', encoding="utf-8")
    with pytest.raises(TrainingDataError, match=r"bad\.jsonl:1"):
        hwrun.train(cpu_plan, bad, lora=True, max_steps=1, output_dir=tmp_path / "x")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        hwrun.train(cpu_plan, tiny[1], lora=True, max_steps=1, output_dir=tmp_path / "none", resume=True)
    # packing runs on the tokenizer alone, before the weights load (full fine-tuning loads without hwrun.load)
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    with pytest.raises(TrainingDataError, match=r"block_size=100000 is longer than the tokenizer's model_max_length"):
        hwrun.train(cpu_plan, tiny[1], max_steps=1, block_size=100_000, output_dir=tmp_path / "x")
