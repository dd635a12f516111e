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
