"""Issue 27 point 7: a finished run resumed with the same budget says it is finished and changes nothing (before:
it trained step 5/4 and rotated older checkpoints away). A run whose final save never happened (stopped by a
signal at its last step) gets its final model from the last checkpoint, without training."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import hwrun
import pytest
from hwrun.training import OUTPUT_MANIFEST

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": True, "lora": True, "save_total_limit": 2}


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = root / "out"
    first = hwrun.train(plan, data, output_dir=out, max_steps=4, save_steps=1, **FAST)
    assert first.global_step == 4
    return plan, data, out, first


def test_resuming_a_finished_run_changes_nothing_and_says_so(finished, monkeypatch, caplog):
    plan, data, out, first = finished
    before = digest(out)
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("nothing may load"))
    with caplog.at_level(logging.WARNING, logger="hwrun.training.run"):
        result = hwrun.train(plan, data, output_dir=out, max_steps=4, save_steps=1, resume="auto", **FAST)
    assert digest(out) == before  # no extra step, no rotation, no new plot or record
    assert result.already_finished and result.global_step == 4 and result.resumed_from == str(out / "checkpoint-4")
    assert result.losses == first.losses and result.lora and not result.merged
    assert result.reasons["resume"] == (f"checkpoint-4 is at step 4: the run is finished for max_steps=4; its final "
                                        f"model is in {out}: nothing to train, nothing changed (pass a larger "
                                        "max_steps to train on)")
    assert "the run is finished" in caplog.text
    assert result.loss_plot == str(out / "loss.png")


def test_the_cli_says_nothing_to_do(finished, capsys):
    from hwrun.cli.main import main

    plan, data, out, _ = finished
    before = digest(out)
    assert main(["train", "--data", str(data), "--lora", "--batch-size", "4", "--block-size", "32", "--output",
                 str(out), "--save-steps", "1", "--max-steps", "4", "--resume", "--device", "cpu",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "nothing to do: checkpoint-4 is at step 4: the run is finished for max_steps=4" in printed
    assert "step 5/4" not in printed and digest(out) == before


def test_a_finished_run_without_its_final_model_gets_it_without_training(finished, tmp_path):
    """SIGTERM at the last step saves checkpoint-N but no final model; --resume then writes the final model from
    checkpoint-N, trains no step, and the adapter equals the checkpoint's."""
    import shutil

    plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    for name in ("adapter_model.safetensors", "adapter_config.json", "README.md", "tokenizer.json",
                 "tokenizer_config.json", "loss.png"):
        (copy / name).unlink()
    import json

    record = json.loads((copy / OUTPUT_MANIFEST).read_text())
    record.pop("final")
    (copy / OUTPUT_MANIFEST).write_text(json.dumps(record))
    checkpoints = {k: v for k, v in digest(copy).items() if k.startswith("checkpoint-")}
    result = hwrun.train(plan, data, output_dir=copy, max_steps=4, save_steps=1, resume="auto", **FAST)
    assert not result.already_finished and result.global_step == 4
    assert "holds no final model from it" in result.reasons["resume"]
    after = digest(copy)
    assert {k: v for k, v in after.items() if k.startswith("checkpoint-")} == checkpoints  # nothing trained
    assert after["adapter_model.safetensors"] == digest(out)["adapter_model.safetensors"]
    assert json.loads((copy / OUTPUT_MANIFEST).read_text())["final"]["step"] == 4


def test_a_larger_budget_still_trains_on(finished, tmp_path):
    import shutil

    plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    result = hwrun.train(plan, data, output_dir=copy, max_steps=5, save_steps=1, resume="auto", **FAST)
    assert not result.already_finished and result.global_step == 5
