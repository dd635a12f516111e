"""Issue 27 point 8 for adapters: an adapter folder whose weights are only `adapter_model.bin` (a pickle) is
refused before anything loads, naming the file and the opt-in; `allow_pickle=True` loads it."""

from __future__ import annotations

import shutil

import hwrun
import pytest
from hwrun.errors import AdapterFormatError, TrainingConfigError
from hwrun.training import check_adapter_weights, load_adapter_model

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "lora": True}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """(plan, a trained adapter folder in safetensors, the same adapter saved as adapter_model.bin only)."""
    root = tmp_path_factory.mktemp("adapters")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    safe = root / "safe"
    hwrun.train(plan, data, output_dir=safe, max_steps=2, lr=3e-3, **FAST)
    model, tokenizer = load_adapter_model(safe, plan)
    pickled = root / "pickled"
    model.save_pretrained(pickled, safe_serialization=False)
    tokenizer.save_pretrained(pickled)
    assert (pickled / "adapter_model.bin").is_file() and not (pickled / "adapter_model.safetensors").exists()
    return plan, safe, pickled


def test_a_pickle_only_adapter_is_refused_before_loading(adapter, monkeypatch):
    plan, _, pickled = adapter
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: pytest.fail("the base model must not load"))
    with pytest.raises(AdapterFormatError) as caught:
        load_adapter_model(pickled, plan)
    message = str(caught.value)
    assert f"{str(pickled)!r} holds its weights only as adapter_model.bin" in message
    assert "pickle" in message and "allow_pickle=True" in message and "safe_serialization=True" in message
    assert isinstance(caught.value, TrainingConfigError) and isinstance(caught.value, ValueError)


def test_hwrun_plan_of_a_pickle_only_adapter_is_refused_before_loading(adapter):
    _, _, pickled = adapter
    with pytest.raises(AdapterFormatError, match="adapter_model.bin"):
        hwrun.plan(str(pickled), device="cpu")


def test_allow_pickle_opts_in_and_loads_the_same_adapter(adapter, caplog):
    import torch

    plan, safe, pickled = adapter
    with caplog.at_level("WARNING", logger="hwrun.model.adapters"):
        from_pickle, tokenizer = load_adapter_model(pickled, plan, allow_pickle=True)
    assert "a pickle file (allow_pickle=True)" in caplog.text
    from_safe, _ = load_adapter_model(safe, plan)
    ids = tokenizer("The queen said", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(from_pickle(input_ids=ids).logits, from_safe(input_ids=ids).logits)


def test_safetensors_wins_when_both_are_there(adapter, tmp_path):
    _, safe, pickled = adapter
    both = tmp_path / "both"
    shutil.copytree(safe, both)
    shutil.copy(pickled / "adapter_model.bin", both)
    assert check_adapter_weights(both) == both / "adapter_model.safetensors"


def test_an_adapter_without_weights_is_named(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(AdapterFormatError, match="has adapter_config.json but no adapter_model.safetensors"):
        check_adapter_weights(tmp_path)
    with pytest.raises(TrainingConfigError, match="allow_pickle='yes' must be True or False"):
        check_adapter_weights(tmp_path, allow_pickle="yes")
