"""Checkpoint manifests, atomic publishing, and which checkpoint `resume` picks."""

from __future__ import annotations

import json
import logging

import pytest
from hwrun.errors import CheckpointError
from hwrun.training.checkpoints import (
    MANIFEST_NAME,
    check_checkpoint,
    latest_complete_checkpoint,
    list_checkpoints,
    publish,
    resolve_resume,
    schedule_change,
    staging_folder,
    write_manifest,
)


def make_checkpoint(run_dir, step, *, complete=True, payload=b"weights"):
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(payload)
    (folder / "trainer_state.json").write_text("{}", encoding="utf-8")
    if complete:
        write_manifest(folder, step)
    return folder


def test_manifest_lists_files_and_sizes(tmp_path):
    folder = make_checkpoint(tmp_path, 3, payload=b"12345")
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["complete"] is True and manifest["step"] == 3
    assert manifest["files"] == {"adapter_model.safetensors": 5, "trainer_state.json": 2}
    assert check_checkpoint(folder) is None


def test_truncated_or_missing_file_is_detected(tmp_path):
    folder = make_checkpoint(tmp_path, 1, payload=b"123456")
    (folder / "adapter_model.safetensors").write_bytes(b"12")
    assert "has 2 bytes, the manifest says 6" in check_checkpoint(folder)
    (folder / "adapter_model.safetensors").unlink()
    assert "missing" in check_checkpoint(folder)
    (folder / MANIFEST_NAME).write_text("{not json", encoding="utf-8")
    assert "unreadable" in check_checkpoint(folder)


def test_latest_skips_partial_and_corrupt_with_warnings(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 4, complete=False)  # save died before the manifest
    corrupt = make_checkpoint(tmp_path, 12)
    (corrupt / "trainer_state.json").write_text("{}{}{}", encoding="utf-8")
    staging_folder(tmp_path, 14).mkdir()  # a staging folder is never a checkpoint
    assert [s for s, _ in list_checkpoints(tmp_path)] == [12, 10, 4, 2]
    with caplog.at_level(logging.WARNING, logger="hwrun.training.checkpoints"):
        assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    assert "checkpoint-12" in caplog.text and "manifest says 2" in caplog.text


def test_resolve_resume_modes(tmp_path):
    assert resolve_resume("auto", tmp_path / "fresh") is None
    assert resolve_resume(False, tmp_path) is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_resume(True, tmp_path)
    make_checkpoint(tmp_path, 5)
    partial = make_checkpoint(tmp_path, 6, complete=False)
    assert resolve_resume("auto", tmp_path) == str(tmp_path / "checkpoint-5")
    assert resolve_resume(True, tmp_path) == str(tmp_path / "checkpoint-5")
    with pytest.raises(CheckpointError, match="did not finish"):
        resolve_resume(str(partial), tmp_path)


def test_publish_replaces_an_existing_checkpoint(tmp_path):
    old = make_checkpoint(tmp_path, 7, payload=b"old")
    staged = make_checkpoint(tmp_path / ".staging-checkpoint-7", 7, payload=b"newer")
    publish(staged, old)
    assert (old / "adapter_model.safetensors").read_bytes() == b"newer"
    assert check_checkpoint(old) is None
    assert not staged.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".staging-old")] == []


def test_schedule_change_names_both_lengths_or_says_nothing(tmp_path):
    folder = make_checkpoint(tmp_path, 5)
    assert schedule_change(folder, 10, 1.0) is None  # no max_steps recorded: nothing to compare
    state = {"global_step": 5, "max_steps": 10, "num_train_epochs": 2,
             "log_history": [{"learning_rate": 2e-4, "loss": 3.0}, {"learning_rate": 1e-4, "loss": 2.0}]}
    (folder / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    assert schedule_change(folder, 10, 1.0) is None
    longer = schedule_change(folder, 20, 1.0)
    assert "max_steps=10 (its last logged learning rate: 0.0001), with max_steps=20" in longer
    assert "jumps at step 5" in longer and "resume with max_steps=10" in longer
    assert schedule_change(folder, -1, 2.0) is None  # by epochs, the same number
    by_epochs = schedule_change(folder, -1, 3.0)
    assert "a run of epochs=2 (its" in by_epochs and "with epochs=3.0:" in by_epochs
    (folder / "trainer_state.json").write_text("{broken", encoding="utf-8")
    assert schedule_change(folder, 20, 1.0) is None  # check_checkpoint reports corruption, not this
