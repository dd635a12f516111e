"""Issue 42 point 3: errors of other libraries (PEFT, safetensors, torch's pickle loader, the tokenizer) that surfaced
as "internal error ... report it" are hwrun's own errors, naming the file or field, the rule and the fix.

Adapters are foreign here (no `hwrun_output.json`), so each damage reaches the check or library it is about rather
than hwrun's checksum comparison (test_hwrun_load_integrity.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import hwrun
import pytest
import torch
from hwrun.errors import (
    AdapterFormatError,
    CheckpointError,
    HwrunError,
    TrainingConfigError,
    TrainingDataError,
)

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "save_steps": 1}
TEXT = "The king said to the queen that the castle was cold. " * 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA run of 2 steps (checkpoints 1-2 and the final adapter) and its data."""
    root = tmp_path_factory.mktemp("boundary")
    data = root / "train.txt"
    data.write_text(TEXT, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    hwrun.train(plan, data, lora=True, output_dir=root / "run", max_steps=2, **FAST)
    return root, plan, data


def _config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _pickle(folder: Path) -> None:
    """An adapter_model.bin whose pickle references a function (what a hostile file carries)."""
    (folder / "adapter_model.safetensors").unlink()
    torch.save({"payload": os.getcwd}, folder / "adapter_model.bin")


def _other_shapes(folder: Path) -> None:
    _config(folder, r=8)  # the weights hold rank 16: PEFT builds rank 8 and refuses to load them


def _header(folder: Path) -> None:
    with open(folder / "adapter_model.safetensors", "r+b") as handle:
        handle.seek(8)
        handle.write(b"xx")


ADAPTERS = [
    # id, damage, options for load, error class, words the message holds
    ("config-not-json", lambda f: (f / "adapter_config.json").write_text("{bad"), {}, AdapterFormatError,
     ["adapter_config.json is unreadable", "Fix:"]),
    ("config-a-list", lambda f: (f / "adapter_config.json").write_text("[1]"), {}, AdapterFormatError,
     ["holds a JSON list", "Fix:"]),
    ("r-a-string", lambda f: _config(f, r="x"), {}, AdapterFormatError, ["adapter_config.json: r='x' must be an int"]),
    ("r-zero", lambda f: _config(f, r=0), {}, AdapterFormatError, ["r=0 must be an int >= 1"]),
    ("alpha-a-string", lambda f: _config(f, lora_alpha="big"), {}, AdapterFormatError, ["lora_alpha='big'"]),
    ("targets-empty", lambda f: _config(f, target_modules=[]), {}, AdapterFormatError, ["target_modules=[]"]),
    ("targets-absent-from-model", lambda f: _config(f, target_modules=["nope"]), {}, AdapterFormatError,
     ["target_modules names no module of the base model", "Fix:"]),
    ("weights-of-other-shapes", _other_shapes, {}, AdapterFormatError, ["does not fit its base model", "Fix:"]),
    ("safetensors-header", _header, {}, AdapterFormatError, ["adapter_model.safetensors", "header is not valid JSON"]),
    ("safetensors-truncated", lambda f: (f / "adapter_model.safetensors").write_bytes(b"\x10\x00"), {},
     AdapterFormatError, ["adapter_model.safetensors", "truncated"]),
    ("pickle-refused", _pickle, {"allow_pickle": True}, AdapterFormatError,
     ["adapter_model.bin was refused by torch's safe (weights-only) loader", "Fix:"]),
]


@pytest.mark.parametrize(("damage", "options", "error", "words"), [c[1:] for c in ADAPTERS],
                         ids=[c[0] for c in ADAPTERS])
def test_a_malformed_adapter_is_hwruns_error_naming_the_file(trained, tmp_path, damage, options, error, words):
    from hwrun.training import load_adapter_model

    root, plan, _ = trained
    folder = tmp_path / "adapter"
    shutil.copytree(root / "run", folder, ignore=shutil.ignore_patterns("checkpoint-*", "hwrun_output.json"))
    damage(folder)
    with pytest.raises(error) as caught:
        load_adapter_model(folder, plan, **options)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    assert "weights_only=False" not in message and "internal error" not in message
    assert str(folder) in message


def test_a_refused_checkpoint_pickle_names_the_file_not_torchs_advice(trained, tmp_path):
    """A checkpoint copied from elsewhere (its manifest matching) whose optimizer.pt references a function."""
    import hashlib

    root, plan, data = trained
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    bad = out / "checkpoint-2" / "optimizer.pt"
    torch.save({"payload": os.getcwd}, bad)
    manifest_path = out / "checkpoint-2" / "hwrun_checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["optimizer.pt"] = {"size": bad.stat().st_size, "sha256": hashlib.sha256(bad.read_bytes()).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as caught:
        hwrun.train(plan, data, lora=True, output_dir=out, max_steps=4, resume="auto", **FAST)
    message = str(caught.value)
    assert message.startswith(f"{bad} was refused by torch's safe (weights-only) loader"), message
    assert "posix.getcwd" in message and "weights_only=False" not in message and "Fix:" in message
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # nothing rotated


TRAINING = [
    # id, data text (None: the good data), train options, error class, words
    ("lora-targets-absent", None, {"lora": {"target_modules": ["nope"]}}, TrainingConfigError,
     ["target_modules=nope (--lora-targets) names no module of 'llama'", "q_proj", "Fix:"]),
    ("jsonl-lone-surrogate", '{"text": "fine"}\n{"text": "half \\ud800 a pair"}\n', {}, TrainingDataError,
     [":2: \"text\" holds a lone surrogate U+D800", "Fix:"]),
    ("jsonl-lone-low-surrogate", '{"text": "x \\udc80"}\n', {}, TrainingDataError, ["U+DC80"]),
]


@pytest.mark.parametrize(("text", "options", "error", "words"), [c[1:] for c in TRAINING], ids=[c[0] for c in TRAINING])
def test_training_inputs_other_libraries_refused_are_hwruns_errors(trained, tmp_path, text, options, error, words):
    root, plan, data = trained
    if text is not None:
        data = tmp_path / "data.jsonl"
        data.write_text(text, encoding="utf-8")
    options = {"lora": True, **options}
    with pytest.raises(error) as caught:
        hwrun.train(plan, data, output_dir=tmp_path / "out", max_steps=1, **options, **FAST)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    assert isinstance(caught.value, HwrunError) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("prompt", ["\udcff\udcfe", "half \ud800 a pair", "ok \udc80"],
                         ids=["argv-bytes-not-utf8", "lone-high-surrogate", "lone-low-surrogate"])
def test_a_prompt_that_is_not_utf8_is_one_line_before_loading(monkeypatch, capsys, prompt):
    """Bytes of another encoding in argv arrive as lone surrogates (Python's surrogateescape); the tokenizer's
    TypeError surfaced as an internal error after the model loaded."""
    from hwrun.cli.main import main

    monkeypatch.setattr("hwrun.model.load.load", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(["generate", "--device", "cpu", "--max-new-tokens", "4", prompt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwrun: error: prompt 1 is not UTF-8 text") and err.count("\n") == 1, err
    assert "Fix: pass UTF-8 text" in err
