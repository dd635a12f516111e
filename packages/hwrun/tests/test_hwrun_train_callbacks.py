"""HwrunCallback in a user's own transformers.Trainer and TRL's SFTTrainer (tiny model, CPU): checkpoint manifests that
resume skips when a file changed, the divergence guard, the SIGTERM save."""

from __future__ import annotations

import os
import signal

import hwrun
import pytest
from hwrun.errors import NonFiniteLossError, TrainingDivergedError
from hwrun.training import check_checkpoint
from hwrun.training.callbacks import HwrunCallback

TEXT = "The king said to the queen that the castle was cold. " * 40


def _trainer(tmp_path, callback, *, lr=1e-3, max_steps=4, save_steps=2):
    from hwrun.training.data import Document, build_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL)
    dataset = build_dataset([Document(TEXT, "t")], tokenizer, 32)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=max_steps, save_steps=save_steps,
                             per_device_train_batch_size=2, learning_rate=lr, logging_steps=1, use_cpu=True,
                             report_to=[], disable_tqdm=True, logging_nan_inf_filter=False, seed=0)
    return Trainer(model=model, args=args, train_dataset=dataset, callbacks=[callback])


def test_checkpoints_get_manifests_and_resume_skips_a_changed_one(tmp_path):
    hw = HwrunCallback()
    trainer = _trainer(tmp_path, hw)
    before = signal.getsignal(signal.SIGTERM)
    trainer.train()
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are restored when training ends
    out = tmp_path / "out"
    assert [p.name for p in hw.stamped] == ["checkpoint-2", "checkpoint-4"]
    assert all(check_checkpoint(p, verify=True) is None for p in hw.stamped)
    assert HwrunCallback.resume_from(out) == str(out / "checkpoint-4")
    weights = next(p for p in (out / "checkpoint-4").iterdir() if p.suffix == ".safetensors")
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF  # same size, other bytes
    weights.write_bytes(bytes(raw))
    assert HwrunCallback.resume_from(out) == str(out / "checkpoint-2")
    resumed = _trainer(tmp_path, HwrunCallback(), max_steps=5)
    resumed.train(resume_from_checkpoint=HwrunCallback.resume_from(out))
    assert resumed.state.global_step == 5


def test_divergence_stops_before_a_save(tmp_path):
    hw = HwrunCallback()
    trainer = _trainer(tmp_path, hw, lr=1e6, max_steps=6, save_steps=1)
    trainer.train()
    assert hw.tripped is not None
    step = hw.tripped[0]
    assert trainer.state.global_step == step < 6
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert all(s < step for s in saved)  # nothing saved at or after the step that diverged
    with pytest.raises((NonFiniteLossError, TrainingDivergedError), match=f"step {step}"):
        hw.raise_if_diverged()


def test_sigterm_saves_a_checkpoint_and_stops(tmp_path):
    from transformers import TrainerCallback

    class Term(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    hw = HwrunCallback()
    trainer = _trainer(tmp_path, hw, max_steps=10, save_steps=100)
    trainer.add_callback(Term())
    before = signal.getsignal(signal.SIGTERM)
    trainer.train()
    assert hw.received == signal.SIGTERM and trainer.state.global_step == 2
    assert check_checkpoint(tmp_path / "out" / "checkpoint-2", verify=True) is None
    assert signal.getsignal(signal.SIGTERM) == before


def test_trl_sft_trainer_with_the_callback(tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL)
    data = Dataset.from_list([{"text": f"The king said to the queen, number {i}, that the castle was cold."}
                              for i in range(16)])
    config = trl.SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=4, save_steps=2, per_device_train_batch_size=4,
                           logging_steps=1, use_cpu=True, report_to=[], disable_tqdm=True, max_length=32,
                           logging_nan_inf_filter=False)
    hw = HwrunCallback()
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[hw])
    trainer.train()
    assert [p.name for p in hw.stamped] == ["checkpoint-2", "checkpoint-4"]
    assert HwrunCallback.resume_from(tmp_path / "sft") == str(tmp_path / "sft" / "checkpoint-4")
    assert hw.tripped is None


def _sft(tmp_path, hw, max_steps):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL)
    data = Dataset.from_list([{"text": f"The king said to the queen, number {i}, that the castle was cold."}
                              for i in range(16)])
    config = trl.SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=max_steps, save_steps=2, save_total_limit=2,
                           per_device_train_batch_size=4, logging_steps=1, use_cpu=True, report_to=[],
                           disable_tqdm=True, max_length=32, logging_nan_inf_filter=False, learning_rate=1e-2,
                           lr_scheduler_type="constant", seed=0, bf16=False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                          peft_config=lora, callbacks=[hw])


class Crash(Exception):
    """Stands for the process dying while Trainer writes a checkpoint."""


def test_sft_trainer_crash_mid_save_resume_and_final_adapter(tmp_path, monkeypatch):
    """A crash while checkpoint-4 is being written (its optimizer state) leaves checkpoint-2 the newest checkpoint,
    for hwrun and for Transformers' own `get_last_checkpoint`; the resumed SFTTrainer run finishes, rotation keeps
    `save_total_limit` published checkpoints, and its final adapter loads with `peft.PeftModel.from_pretrained`."""
    import torch
    from hwrun.training.checkpoints import MANIFEST_NAME
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint

    out = tmp_path / "sft"
    real_save = torch.save

    def dying_save(obj, f, *args, **kwargs):
        if "checkpoint-4" in str(f) and str(f).endswith("optimizer.pt"):
            raise Crash(f"killed while writing {f}")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    hw = HwrunCallback(plan=hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))
    trainer = _sft(tmp_path, hw, max_steps=6)
    with pytest.raises(Crash):
        trainer.train()
    monkeypatch.setattr(torch, "save", real_save)
    assert [p.name for p in hw.stamped] == ["checkpoint-2"]
    staged = out / ".staging-checkpoint-4" / "checkpoint-4"
    assert staged.is_dir() and not (staged / MANIFEST_NAME).exists()  # the half-written save, out of the way
    assert not (out / "checkpoint-4").exists()
    assert HwrunCallback.resume_from(out) == get_last_checkpoint(str(out)) == str(out / "checkpoint-2")
    # no hook runs after an exception in Trainer's save: output_dir still names the staging folder until the
    # callback's next hook (or restore_output_dir) gives it back
    hw.restore_output_dir(trainer.args)
    assert str(trainer.args.output_dir) == str(out)
    assert hw.record["device"] == "cpu" and hw.record["dtype"] == "float32"  # the plan was recorded

    resumed_hw = HwrunCallback(plan=hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))
    resumed = _sft(tmp_path, resumed_hw, max_steps=6)
    resumed.train(resume_from_checkpoint=HwrunCallback.resume_from(out))
    assert resumed.state.global_step == 6 and resumed_hw.tripped is None
    assert [p.name for p in resumed_hw.stamped] == ["checkpoint-4", "checkpoint-6"]
    assert not (out / ".staging-checkpoint-4").exists()  # the dead save's leftovers were removed
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2
    assert all(check_checkpoint(out / n, verify=True) is None for n in ("checkpoint-4", "checkpoint-6"))
    assert json_of(out / "checkpoint-6" / MANIFEST_NAME)["run"]["attention"] == "sdpa"

    final = tmp_path / "adapter"
    resumed.save_model(str(final))
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL), str(final))
    trained = {k: v for k, v in resumed.model.named_parameters() if "lora_" in k}
    assert trained and any(torch.count_nonzero(v) for k, v in trained.items() if "lora_B" in k)
    for name, value in loaded.named_parameters():
        if "lora_" in name:
            assert torch.equal(value, trained[name]), name


def json_of(path):
    import json

    return json.loads(path.read_text(encoding="utf-8"))


def test_the_plan_is_checked_against_the_arguments(tmp_path):
    import hwenv
    from hwrun.errors import TrainingConfigError

    xpu_plan = hwrun.plan(hwrun.DEFAULT_MODEL, device=hwenv.Accelerator("xpu", 1))
    trainer = _trainer(tmp_path, HwrunCallback(plan=xpu_plan), max_steps=1)
    with pytest.raises(TrainingConfigError, match=r"train on 'cpu' .* plan given to HwrunCallback is for .*xpu"):
        trainer.train()
    assert not (tmp_path / "out" / "checkpoint-1").exists()  # refused before the first step
