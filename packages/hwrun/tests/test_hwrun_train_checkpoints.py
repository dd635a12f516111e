"""Checkpoint manifests (sizes and sha256), atomic publishing, and which checkpoint `resume` picks: the newest
that verifies, falling back past corrupted ones and saying which and why (issue 27 point 3)."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from hwrun.errors import CheckpointError
from hwrun.training.checkpoints import (
    MANIFEST_NAME,
    check_checkpoint,
    choose_resume,
    finished_at,
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


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_manifest_lists_files_sizes_and_checksums(tmp_path):
    folder = make_checkpoint(tmp_path, 3, payload=b"12345")
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["complete"] is True and manifest["step"] == 3 and manifest["format"] == 2
    assert manifest["files"] == {"adapter_model.safetensors": {"size": 5, "sha256": sha(b"12345")},
                                 "trainer_state.json": {"size": 2, "sha256": sha(b"{}")}}
    assert check_checkpoint(folder) is None and check_checkpoint(folder, verify=True) is None


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "optimizer.pt"])
def test_same_size_corruption_is_found_only_by_the_checksum(tmp_path, name):
    folder = make_checkpoint(tmp_path, 2, payload=b"weights", complete=False)
    (folder / "optimizer.pt").write_bytes(b"optimizer state")
    write_manifest(folder, 2)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(bytes(len(data)))  # same size, other bytes
    assert check_checkpoint(folder) is None  # sizes alone cannot see it
    assert check_checkpoint(folder, verify=True) == (
        f"{name} does not match its sha256 in {MANIFEST_NAME} (same size, other bytes: corrupted or changed after "
        "the save)")


def test_a_manifest_from_before_checksums_still_resumes_on_sizes(tmp_path):
    folder = make_checkpoint(tmp_path, 4, payload=b"abc")
    (folder / MANIFEST_NAME).write_text(json.dumps({"format": 1, "step": 4, "complete": True, "files": {
        "adapter_model.safetensors": 3, "trainer_state.json": 2}}))
    assert check_checkpoint(folder, verify=True) is None
    choice = choose_resume("auto", tmp_path)
    assert choice.folder == str(folder) and "sizes verified (written before checksums)" in choice.reason


def test_resume_falls_back_past_a_corrupted_checkpoint_and_says_why(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    newest = make_checkpoint(tmp_path, 4, payload=b"weights")
    (newest / "adapter_model.safetensors").write_bytes(b"WEIGHTS")
    with caplog.at_level(logging.WARNING, logger="hwrun.training.checkpoints"):
        choice = choose_resume("auto", tmp_path)
    assert choice.folder == str(tmp_path / "checkpoint-2")
    assert "sha256 of every file verified" in choice.reason
    assert "skipped newer checkpoint-4: adapter_model.safetensors does not match its sha256" in choice.reason
    assert "checkpoint-4" in caplog.text and "instead of a newer checkpoint" in caplog.text
    assert resolve_resume(True, tmp_path) == str(tmp_path / "checkpoint-2")
    with pytest.raises(CheckpointError, match=r"checkpoint-4.*does not match its sha256"):
        resolve_resume(str(newest), tmp_path)  # a path given by the user is verified too, with no fallback


def test_no_checkpoint_verifies_is_a_clear_error(tmp_path):
    for step in (1, 2):
        folder = make_checkpoint(tmp_path, step)
        (folder / "trainer_state.json").write_text("[]", encoding="utf-8")
    with pytest.raises(CheckpointError) as caught:
        choose_resume("auto", tmp_path)
    message = str(caught.value)
    assert "No checkpoint in" in message and "checkpoint-2: trainer_state.json does not match" in message
    assert "checkpoint-1: trainer_state.json" in message and "Fix:" in message


@pytest.mark.parametrize("value", ["", 3, 2.5])
def test_a_resume_value_that_means_nothing_is_refused(tmp_path, value):
    with pytest.raises(CheckpointError, match="is not understood"):
        choose_resume(value, tmp_path)


def test_finished_at_compares_the_checkpoint_step_with_the_budget(tmp_path):
    folder = make_checkpoint(tmp_path, 4)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 4,
                                                           "num_train_epochs": 2}), encoding="utf-8")
    assert finished_at(folder, 4, 1.0) == "checkpoint-4 is at step 4: the run is finished for max_steps=4"
    assert finished_at(folder, 5, 1.0) is None
    assert finished_at(folder, -1, 2.0) == "checkpoint-4 is at step 4: the run is finished for epochs=2.0 (4 steps)"
    assert finished_at(folder, -1, 3.0) is None


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
