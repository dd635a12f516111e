"""Issue 27 point 3 end to end: a resume verifies the checkpoint's checksums. A newest checkpoint whose weights or
optimizer.pt were overwritten with bytes of the same size is passed over for the newest one that verifies,
with the reason in the log and in TrainResult.reasons; when none verifies, CheckpointError and nothing changes.
Before: the corrupted weights were resumed (NaN losses replaced the good adapter), a corrupted optimizer.pt was
a torch traceback."""

from __future__ import annotations

import hashlib
import logging
import math
import shutil
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import CheckpointError

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "lora": True}


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A LoRA run of max_steps=6 stopped after step 3, with checkpoints 1-3."""
    root = tmp_path_factory.mktemp("verify")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = root / "out"
    hwrun.train(plan, data, output_dir=out, max_steps=3, save_steps=1, **FAST)
    return plan, data, out


def scramble(file: Path) -> None:
    """Same size, other bytes (what a bad disk or a torn copy leaves)."""
    data = file.read_bytes()
    file.write_bytes(bytes(b ^ 0xFF for b in data[:64]) + data[64:])


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "optimizer.pt"])
def test_a_corrupted_newest_checkpoint_is_passed_over_with_the_reason(stopped, tmp_path, caplog, name):
    plan, data, out = stopped
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    scramble(copy / "checkpoint-3" / name)
    with caplog.at_level(logging.WARNING, logger="hwrun.training.checkpoints"):
        result = hwrun.train(plan, data, output_dir=copy, max_steps=3, save_steps=1, resume="auto", **FAST)
    assert result.resumed_from == str(copy / "checkpoint-2") and result.global_step == 3
    reason = result.reasons["resume"]
    assert f"from {copy / 'checkpoint-2'} (sha256 of every file verified)" in reason
    assert f"skipped newer checkpoint-3: {name} does not match its sha256" in reason
    assert "checkpoint-3" in caplog.text and name in caplog.text
    assert all(math.isfinite(loss) for _, loss in result.losses)


def test_when_no_checkpoint_verifies_nothing_is_resumed_or_changed(stopped, tmp_path, monkeypatch):
    plan, data, out = stopped
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    for step in (1, 2, 3):
        scramble(copy / f"checkpoint-{step}" / "adapter_model.safetensors")
    before = digest(copy)
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    with pytest.raises(CheckpointError) as caught:
        hwrun.train(plan, data, output_dir=copy, max_steps=4, save_steps=1, resume="auto", **FAST)
    message = str(caught.value)
    assert "No checkpoint in" in message and "nothing safe to resume from" in message
    assert all(f"checkpoint-{s}: adapter_model.safetensors does not match its sha256" in message for s in (1, 2, 3))
    assert digest(copy) == before
