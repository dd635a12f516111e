"""Issue 42 point 2: what `hwrun train` wrote is checked against its record (`hwrun_output.json`) when it loads.

Before: overwriting 4 KiB of an adapter generated nothing with exit 0. Now an adapter, and any output up to
`FULL_HASH_BYTES`, is compared byte for byte (sha256); a larger merged model by its sizes and safetensors headers,
and byte for byte with `verify=True` (`hwrun generate --verify`). Tokenizer files are users' to edit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import HwrunError, ModelIntegrityError
from hwrun.model import integrity

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "max_steps": 1, "save_steps": 100}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """An adapter and a merged model, each written by `hwrun.train`."""
    root = tmp_path_factory.mktemp("integrity")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    hwrun.train(plan, data, lora=True, output_dir=root / "adapter", **FAST)
    hwrun.train(plan, data, lora=True, merge=True, output_dir=root / "merged", **FAST)
    return root


def overwrite(path: Path, offset: int, size: int = 4096) -> None:
    """`size` bytes at `offset` replaced by other bytes (the file keeps its size)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        old = handle.read(size)
        handle.seek(offset)
        handle.write(bytes((b + 1) % 256 for b in old))


def header_length(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _inside(folder: Path, name: str) -> None:
    path = folder / name
    overwrite(path, header_length(path) + 1000)


def _in_header(folder: Path, name: str) -> None:
    path = folder / name
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"format":"pt"')  # same length, other bytes: the header still parses
    raw[at:at + 13] = b'"format":"tp"'
    path.write_bytes(bytes(raw))


def _truncate(folder: Path, name: str) -> None:
    path = folder / name
    path.write_bytes(path.read_bytes()[:-4096])


def _edit_config(folder: Path, name: str) -> None:
    config = json.loads((folder / name).read_text())
    config["lora_alpha" if "adapter" in name else "rms_norm_eps"] = 64 if "adapter" in name else 1e-6
    (folder / name).write_text(json.dumps(config, indent=2))


def _edit_tokenizer_config(folder: Path, _name: str) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = 256  # a user's edit: tokenizer files are not compared
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


CASES = [
    # id, output, damage, file, full-hash bound (None: default), verify, the error's words (None: it loads)
    ("adapter-4k-inside", "adapter", _inside, "adapter_model.safetensors", None, False,
     "adapter_model.safetensors does not match the sha256 hwrun recorded"),
    ("adapter-header", "adapter", _in_header, "adapter_model.safetensors", None, False,
     "adapter_model.safetensors does not match the sha256"),
    ("adapter-truncated", "adapter", _truncate, "adapter_model.safetensors", None, False, "truncated"),
    ("adapter-config-edited", "adapter", _edit_config, "adapter_config.json", None, False, "hwrun_output.json"),
    ("adapter-tokenizer-edited", "adapter", _edit_tokenizer_config, "", None, False, None),
    ("merged-4k-inside", "merged", _inside, "model.safetensors", None, False,
     "model.safetensors does not match the sha256 hwrun recorded"),
    ("merged-config-edited", "merged", _edit_config, "config.json", None, False, "hwrun_output.json"),
    ("large-4k-inside-default", "merged", _inside, "model.safetensors", 0, False, None),
    ("large-4k-inside-verify", "merged", _inside, "model.safetensors", 0, True, "does not match the sha256"),
    ("large-header", "merged", _in_header, "model.safetensors", 0, False, "has another safetensors header"),
    ("large-truncated", "merged", _truncate, "model.safetensors", 0, False, "truncated"),
    ("merged-untouched-verify", "merged", lambda f, n: None, "", None, True, None),
]


@pytest.mark.parametrize(("output", "damage", "name", "bound", "verify", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hwruns_outputs_are_checked_at_load(outputs, tmp_path, monkeypatch, output, damage, name, bound, verify,
                                            words):
    folder = tmp_path / output
    shutil.copytree(outputs / output, folder)
    damage(folder, name)
    if bound is not None:
        monkeypatch.setattr(integrity, "FULL_HASH_BYTES", bound)  # as if the model were larger than the bound
    if words is None:
        model, _ = hwrun.load(hwrun.plan(str(folder), device="cpu"), verify=verify)
        assert model is not None
        return
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(HwrunError) as caught:
        hwrun.load(hwrun.plan(str(folder), device="cpu"), verify=verify)
    message = str(caught.value)
    assert words in message and str(folder / (name or "")) in message, message
    assert "Fix:" in message or "save it again" in message  # the fix (plan()'s own check of a truncated file)


def test_the_record_holds_the_header_hash_of_each_weight_file(outputs):
    record = json.loads((outputs / "merged" / integrity.OUTPUT_RECORD).read_text())
    entry = record["files"]["model.safetensors"]
    assert entry["header_sha256"] == integrity.header_sha256(outputs / "merged" / "model.safetensors")


def test_what_a_load_compared_is_said(outputs, monkeypatch):
    assert integrity.verify_output(outputs / "adapter").startswith("sha256 of adapter_config.json, adapter_model")
    monkeypatch.setattr(integrity, "FULL_HASH_BYTES", 0)
    said = integrity.verify_output(outputs / "merged")
    assert "size and safetensors header of model.safetensors" in said and "--verify" in said
    assert integrity.verify_output(hwrun.DEFAULT_MODEL) is None  # not hwrun's output: nothing to compare


def test_a_damaged_foreign_model_is_named(tmp_path):
    folder = tmp_path / "foreign"
    shutil.copytree(hwrun.DEFAULT_MODEL, folder)
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.seek(8)
        handle.write(b"xx")  # the JSON header no longer parses
    with pytest.raises(HwrunError, match=r"model\.safetensors.*header is not valid JSON"):
        hwrun.load(hwrun.plan(str(folder), device="cpu"))
    with pytest.raises(ModelIntegrityError, match="not valid JSON"):
        integrity.safetensors_header(folder / "model.safetensors")


def test_hwrun_generate_verify_compares_every_byte(outputs, tmp_path, monkeypatch, capsys):
    """`hwrun generate --verify`: a model past the full-hash bound, 4 KiB overwritten inside its tensors."""
    from hwrun.cli.main import main

    folder = tmp_path / "merged"
    shutil.copytree(outputs / "merged", folder)
    _inside(folder, "model.safetensors")
    monkeypatch.setattr(integrity, "FULL_HASH_BYTES", 0)
    assert main(["generate", "--device", "cpu", "--model", str(folder), "--max-new-tokens", "2", "--verify",
                 "The king said"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors does not match the sha256 hwrun recorded" in err and err.count("\n") == 1, err
