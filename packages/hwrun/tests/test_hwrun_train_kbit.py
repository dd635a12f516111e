"""QLoRA's base preparation (hwrun.training.kbit): frozen, checkpointed, and no float32 copies of the
unquantized weights, where peft's prepare_model_for_kbit_training makes them (issue 29: QLoRA peak memory)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _tiny_bf16(tmp_path):
    from hwrun.testing import build_tiny_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "m", vocab_size=512)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)


def _bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_base_is_frozen_checkpointed_and_keeps_its_dtype(tmp_path):
    from hwrun.training.kbit import prepare_kbit_base

    model = _tiny_bf16(tmp_path)
    before = _bytes(model)
    reason = prepare_kbit_base(model)
    assert not any(p.requires_grad for p in model.parameters())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert _bytes(model) == before
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    assert "kept in bfloat16" in reason and "non-reentrant" in reason


def test_peft_would_double_the_unquantized_bytes(tmp_path):
    """The saving it exists for: peft's preparation holds the same model in float32 (2x the bytes)."""
    from hwrun.training.kbit import prepare_kbit_base
    from peft import prepare_model_for_kbit_training

    ours, theirs = _tiny_bf16(tmp_path / "a"), _tiny_bf16(tmp_path / "b")
    prepare_kbit_base(ours)
    prepare_model_for_kbit_training(theirs, use_gradient_checkpointing=True,
                                    gradient_checkpointing_kwargs={"use_reentrant": False})
    assert _bytes(theirs) == 2 * _bytes(ours)


def test_lora_trains_the_same_parameters_as_after_peft_preparation(tmp_path):
    """The README's "same trainable set": after prepare_kbit_base + get_peft_model the trainable parameters are
    exactly those after peft's prepare_model_for_kbit_training + get_peft_model (names, count, sizes)."""
    from hwrun.training.kbit import prepare_kbit_base
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    ours, theirs = _tiny_bf16(tmp_path / "a"), _tiny_bf16(tmp_path / "b")
    prepare_kbit_base(ours)
    prepare_model_for_kbit_training(theirs, use_gradient_checkpointing=True,
                                    gradient_checkpointing_kwargs={"use_reentrant": False})
    ours, theirs = get_peft_model(ours, config), get_peft_model(theirs, config)

    def trainable(model):
        return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}

    assert trainable(ours) and trainable(ours) == trainable(theirs)
    assert len(trainable(ours)) == 4 * ours.config.num_hidden_layers  # A and B of q and v in every layer
    assert all("lora_" in name for name in trainable(ours))


def test_gradients_still_reach_a_lora_adapter_through_checkpointed_layers(tmp_path):
    """Non-reentrant checkpointing needs no input-gradient hook: LoRA weights get gradients, the base none."""
    from hwrun.training.kbit import prepare_kbit_base
    from peft import LoraConfig, get_peft_model

    model = _tiny_bf16(tmp_path)
    prepare_kbit_base(model)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    lora = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora and all(p.grad is not None and torch.isfinite(p.grad).all() for p in lora)
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_qlora_train_keeps_the_unquantized_weights_in_the_plan_dtype(tmp_path):
    """Through hwrun.train: a bfloat16 QLoRA run's embedding and norms stay bfloat16 (peft's preparation
    would make them float32), the reason says so, and the run trains."""
    import hwrun
    from hwrun.testing import build_tiny_model

    folder = build_tiny_model(tmp_path / "m")
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    seen = {}

    from transformers import TrainerCallback

    class Dtypes(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen.update({n: p.dtype for n, p in model.named_parameters()
                         if p.__class__.__name__ != "Params4bit" and "lora_" not in n})

    plan = hwrun.plan(str(folder), device="cpu", dtype="bfloat16")
    result = hwrun.train(plan, data, qlora=True, max_steps=1, batch_size=2, block_size=16, plot=False,
                         disable_tqdm=True, output_dir=tmp_path / "out", callbacks=[Dtypes()])
    assert result.global_step == 1
    assert "kept in bfloat16" in result.reasons["4-bit base"]
    assert seen and set(seen.values()) == {torch.bfloat16}, seen
