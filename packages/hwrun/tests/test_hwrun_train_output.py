"""What `hwrun.train` does with an output folder that is not new: nothing on disk is lost.

A fresh run into a folder with an earlier run's final model or checkpoints, into the model's own
folder, into a folder holding files hwrun did not write, or a resume by a different kind of run (LoRA vs
full) is refused before the model loads, and every file already there is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import hwrun
import pytest
from hwrun.training import TrainingConfigError

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False}


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """(plan, data, folder): a finished 2-step LoRA run with checkpoints 1 and 2 and a final adapter."""
    root = tmp_path_factory.mktemp("earlier")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = root / "out"
    hwrun.train(plan, data, lora=True, max_steps=2, save_steps=1, output_dir=out, **FAST)
    assert (out / "adapter_model.safetensors").is_file() and (out / "checkpoint-2").is_dir()
    return plan, data, out


@pytest.fixture()
def no_load(monkeypatch):
    monkeypatch.setattr("hwrun.model.load.load", lambda plan, **_: pytest.fail("the model must not load"))
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))


def test_a_fresh_run_into_an_earlier_runs_folder_is_refused(earlier, no_load):
    plan, data, out = earlier
    before = digest(out)
    for lora in (True, None):
        with pytest.raises(TrainingConfigError) as caught:
            hwrun.train(plan, data, lora=lora, max_steps=2, resume=False, output_dir=out, **FAST)
        message = str(caught.value)
        assert f"output_dir={str(out)!r} already holds an earlier run" in message
        assert "adapter_model.safetensors" in message and "checkpoint-2" in message
        assert "--resume" in message and "new output_dir" in message
    assert digest(out) == before


def test_a_resume_by_another_kind_of_run_is_refused(earlier, no_load):
    plan, data, out = earlier
    before = digest(out)
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, lora=None, max_steps=3, resume="auto", output_dir=out, **FAST)
    message = str(caught.value)
    assert "checkpoint-2" in message and "written by a lora run and this is a full run" in message
    assert "--lora" in message
    assert digest(out) == before


def test_the_same_kind_resumes(earlier, tmp_path):
    plan, data, out = earlier
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    result = hwrun.train(plan, data, lora=True, max_steps=3, save_steps=1, resume="auto", output_dir=copy, **FAST)
    assert result.resumed_from == str(copy / "checkpoint-2") and result.global_step == 3


def test_a_model_hwrun_did_not_write_is_kept_even_with_overwrite(tmp_path, no_load, earlier):
    plan, data, _ = earlier
    out = tmp_path / "merged"
    out.mkdir()
    (out / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TrainingConfigError, match=r"holds files hwrun did not write \(config\.json\).*--overwrite"):
        hwrun.train(plan, data, lora=True, max_steps=1, resume="auto", output_dir=out, **FAST)
    with pytest.raises(TrainingConfigError, match=r"holds config\.json, which hwrun did not write.*never replaces"):
        hwrun.train(plan, data, lora=True, max_steps=1, resume="auto", output_dir=out, overwrite=True, **FAST)
    assert (out / "config.json").read_text(encoding="utf-8") == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_a_crashed_save_alone_does_not_block_a_fresh_start(tmp_path, earlier, no_load):
    plan, data, _ = earlier
    out = tmp_path / "crashed"
    (out / ".staging-checkpoint-1" / "checkpoint-1").mkdir(parents=True)  # a save that never finished
    (out / ".staging-checkpoint-1" / "checkpoint-1" / "optimizer.pt").write_bytes(b"half")
    with pytest.raises(pytest.fail.Exception, match="must not load"):  # gets as far as loading
        hwrun.train(plan, data, lora=True, max_steps=1, resume="auto", output_dir=out, **FAST)


def test_a_checkpoint_folder_without_hwruns_manifest_is_not_hwruns(tmp_path, earlier, no_load):
    """hwrun publishes a checkpoint-N folder only with its manifest: one without it was written by something
    else (Trainer itself, another tool), and a run's rotation would delete it."""
    plan, data, _ = earlier
    out = tmp_path / "other"
    (out / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(TrainingConfigError, match=r"holds files hwrun did not write \(checkpoint-1\)"):
        hwrun.train(plan, data, lora=True, max_steps=1, resume="auto", output_dir=out, **FAST)
    with pytest.raises(TrainingConfigError, match=r"holds checkpoint-1, which hwrun did not write"):
        hwrun.train(plan, data, lora=True, max_steps=1, resume="auto", output_dir=out, overwrite=True, **FAST)


def test_the_models_own_folder_is_refused(tmp_path, earlier, no_load):
    _, data, _ = earlier
    model = tmp_path / "model"
    shutil.copytree(hwrun.DEFAULT_MODEL, model)
    before = digest(model)
    with pytest.raises(TrainingConfigError, match="is the folder of the model being trained"):
        hwrun.train(hwrun.plan(str(model), device="cpu"), data, max_steps=1, resume=False, output_dir=model, **FAST)
    assert digest(model) == before


def test_an_adapter_plan_is_refused(earlier, tmp_path, no_load):
    _, data, out = earlier
    adapter_plan = hwrun.plan(str(out), device="cpu")
    assert adapter_plan.adapter is not None
    with pytest.raises(TrainingConfigError, match="train from the base model, or merge the adapter first"):
        hwrun.train(adapter_plan, data, lora=True, max_steps=1, output_dir=tmp_path / "again", **FAST)


def test_a_failed_final_save_leaves_the_earlier_final_model(earlier, tmp_path, monkeypatch):
    """Resume a finished run; its new final save fails half way: the old adapter in output_dir is
    untouched. The next resume publishes the new one and leaves no staging folder behind."""
    import hwrun.model.adapters as adapters

    plan, data, _ = earlier
    copy = tmp_path / "out"
    constant = {**FAST, "lr_scheduler_type": "constant"}  # a resume to more steps still trains (LR > 0)
    hwrun.train(plan, data, lora=True, max_steps=2, save_steps=1, output_dir=copy, **constant)
    before = digest(copy)
    real_save = adapters.save_adapter

    def save_then_fail(model, tokenizer, folder, **kwargs):
        real_save(model, tokenizer, folder, **kwargs)
        (Path(folder) / "adapter_model.safetensors").write_bytes(b"half")  # a torn write
        raise OSError("disk full")

    monkeypatch.setattr(adapters, "save_adapter", save_then_fail)
    with pytest.raises(OSError, match="disk full"):
        hwrun.train(plan, data, lora=True, max_steps=3, save_steps=1, resume="auto", output_dir=copy, **constant)
    after = digest(copy)
    # what the failed run may add: its checkpoint of step 3 and its session's TensorBoard events (it did train)
    assert {k: v for k, v in after.items() if not k.startswith((".staging-", "checkpoint-3/", "hwrun-tensorboard/"))} \
        == {k: v for k, v in before.items() if not k.startswith("hwrun-tensorboard/")}
    assert all(before[k] == after[k] for k in before)  # the first run's events file unchanged too

    monkeypatch.setattr(adapters, "save_adapter", real_save)
    result = hwrun.train(plan, data, lora=True, max_steps=4, save_steps=1, resume="auto", output_dir=copy, **constant)
    assert result.global_step == 4 and not any(p.name.startswith(".staging-") for p in copy.iterdir())
    assert digest(copy)["adapter_model.safetensors"] != before["adapter_model.safetensors"]


def test_a_merged_final_save_replaces_the_adapter_it_was_resumed_over(earlier, tmp_path):
    plan, data, out = earlier
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    result = hwrun.train(plan, data, lora=True, merge=True, max_steps=3, save_steps=1, resume="auto",
                         output_dir=copy, **FAST)
    assert result.merged
    assert not (copy / "adapter_config.json").exists() and not (copy / "adapter_model.safetensors").exists()
    assert (copy / "model.safetensors").is_file() and hwrun.plan(str(copy), device="cpu").adapter is None
