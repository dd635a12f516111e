"""Issue 42 point 1: a resume must be the same run as the checkpoint's, or it is refused before anything loads.

Before: `--resume` into another model's run folder trained on (only the run kind was compared), replaced that
run's final adapter, and checkpoint rotation deleted its last checkpoints. Now the manifest records the model
(identity and config sha256), the data (sha256), the block size and the LoRA shape, and every difference is named
with the option that sets it, before the tokenizer or the model loads; the folder stays byte for byte.

Also: a newest checkpoint whose manifest (the checksum file) is damaged is passed over for the older one, as the
warning says; before, the folder was refused as holding "files hwrun did not write"."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import TrainingConfigError
from hwrun.training.checkpoints import MANIFEST_NAME

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False, "save_steps": 1}
TEXT = "The king said to the queen that the castle was cold. " * 40


class Loaded(Exception):
    """Raised in place of the model load: every check before it passed."""


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A LoRA run of 2 steps (checkpoints 1 and 2, final adapter), its data, and another model (a copy of the
    shipped one with another config value)."""
    root = tmp_path_factory.mktemp("resume-match")
    data = root / "train.txt"
    data.write_text(TEXT, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = root / "out"
    hwrun.train(plan, data, lora=True, output_dir=out, max_steps=2, **FAST)
    other = root / "other-model"
    shutil.copytree(hwrun.DEFAULT_MODEL, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (other / "config.json").write_text(json.dumps(config))
    return root, plan, data, out, other


def _set_run(folder: Path, **changes) -> None:
    """Rewrite every checkpoint manifest's run record (the manifest itself carries no checksum)."""
    for manifest_path in folder.glob(f"checkpoint-*/{MANIFEST_NAME}"):
        manifest = json.loads(manifest_path.read_text())
        run = manifest["run"]
        for key, value in changes.items():
            if value is None:
                run.pop(key, None)
            else:
                run[key] = value
        manifest_path.write_text(json.dumps(manifest))


def _other_data(root: Path, _out: Path) -> dict:
    path = root / "other.txt"
    path.write_text(TEXT + "And the queen said nothing.", encoding="utf-8")
    return {"data": path}


def _other_model(root: Path, _out: Path) -> dict:
    return {"plan": hwrun.plan(str(root / "other-model"), device="cpu")}


def _changed_config(_root: Path, out: Path) -> dict:
    _set_run(out, config_sha256="0" * 64)  # as if the model's config.json changed since the run
    return {}


def _legacy_record(_root: Path, out: Path) -> dict:
    """A checkpoint from before the record (kind and model only): the LoRA shape comes from its adapter_config.json."""
    _set_run(out, model_id=None, config_sha256=None, data_sha256=None, block_size=None, lora_r=None, lora_alpha=None,
             lora_targets=None)
    return {"lora": {"r": 8}}


REFUSED = [
    # id, how the resume differs, words the one error must hold
    ("other-model", _other_model, ["model: the checkpoint has hwrun's shipped tiny-llama (no --model)",
                                   "model config.json (sha256)", "(--model)"]),
    ("changed-config", _changed_config, ["model config.json (sha256): the checkpoint has 000000000000"]),
    ("other-data", _other_data, ["training data (sha256 of the documents)", "(--data)"]),
    ("block-size", lambda r, o: {"block_size": 64}, ["block size: the checkpoint has 32, this run 64 (--block-size)"]),
    ("lora-r", lambda r, o: {"lora": {"r": 8}}, ["LoRA r: the checkpoint has 16, this run 8 (--lora-r)"]),
    ("lora-alpha", lambda r, o: {"lora": {"alpha": 64}}, ["LoRA alpha: the checkpoint has 32, this run 64"]),
    ("lora-targets", lambda r, o: {"lora": {"target_modules": ["q_proj", "k_proj"]}},
     ["LoRA targets: the checkpoint has q_proj,v_proj, this run k_proj,q_proj (--lora-targets)"]),
    ("full-run", lambda r, o: {"lora": None}, ["written by a lora run and this is a full run"]),
    ("legacy-record", _legacy_record, ["LoRA r: the checkpoint has 16, this run 8"]),
    ("other-quantization", lambda r, o: {"plan": hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu",
                                                            quantization="int8-weight-only")},
     ["quantization of the base: the checkpoint has none, this run int8-weight-only (--quantize / --qlora)"]),
]


@pytest.mark.parametrize(("change", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_resume_of_another_run_is_refused_before_anything_loads(finished, tmp_path, monkeypatch, change, words):
    root, plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    options = {**FAST, "plan": plan, "data": data, "lora": True, **change(root, copy)}
    before = digest(copy)
    monkeypatch.setattr("hwrun.training.run._data_tokenizer", lambda *a, **k: pytest.fail("the tokenizer loaded"))
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(options.pop("plan"), options.pop("data"), output_dir=copy, max_steps=4, resume="auto",
                    **options)
    message = str(caught.value)
    assert message.startswith("Cannot resume from") and "checkpoint-2" in message, message
    for word in words:
        assert word in message, message
    assert "Fix:" in message
    assert digest(copy) == before


ACCEPTED = [
    # id, how the resume differs harmlessly, what the run's reasons must say
    ("same-run", lambda r, o: {}, "same run kind, model, model config.json (sha256), block size, LoRA r"),
    ("same-text-other-file", lambda r, o: {"data": shutil.copy(r / "train.txt", r / "copy.txt")},
     "same training data (sha256 of the documents)"),
    ("targets-spelt-out", lambda r, o: {"lora": {"target_modules": ["v_proj", "q_proj"]}}, "LoRA targets"),
    ("legacy-record", lambda r, o: _legacy_record(r, o) and {},
     "not compared: model config.json (sha256) (not recorded in the checkpoint)"),
]


@pytest.mark.parametrize(("change", "said"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_the_same_run_resumes(finished, tmp_path, monkeypatch, change, said):
    import hwrun.training.run as run

    root, plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    options = {**FAST, "plan": plan, "data": data, "lora": True, **change(root, copy)}
    seen = {}

    def load(plan, run_settings, tokenizer, reasons):
        seen.update(reasons)
        raise Loaded

    monkeypatch.setattr(run, "_load", load)
    with pytest.raises(Loaded):
        hwrun.train(options.pop("plan"), options.pop("data"), output_dir=copy, max_steps=4, resume="auto", **options)
    assert str(copy / "checkpoint-2") in seen["resume"]
    assert said in seen["resume checks"], seen["resume checks"]


def _garbage(manifest: Path) -> None:
    manifest.write_text("{not json")


def _incomplete(manifest: Path) -> None:
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "complete": False}))


def _no_files(manifest: Path) -> None:
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "files": None}))


def _empty(manifest: Path) -> None:
    manifest.write_bytes(b"")


DAMAGED = [("not-json", _garbage, "is unreadable"), ("not-complete", _incomplete, "does not say complete"),
           ("no-files", _no_files, "lists no files"), ("empty", _empty, "is unreadable")]


@pytest.mark.parametrize(("damage", "reason"), [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_a_damaged_checksum_file_falls_back_to_the_older_checkpoint(finished, tmp_path, monkeypatch, caplog, damage,
                                                                   reason):
    import hwrun.training.run as run

    _, plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    damage(copy / "checkpoint-2" / MANIFEST_NAME)
    seen = {}

    def load(plan, run_settings, tokenizer, reasons):
        seen.update(reasons)
        raise Loaded

    monkeypatch.setattr(run, "_load", load)
    with caplog.at_level(logging.WARNING, logger="hwrun.training.checkpoints"), pytest.raises(Loaded):
        hwrun.train(plan, data, lora=True, output_dir=copy, max_steps=4, resume="auto", **FAST)
    assert seen["resume"].startswith(f"from {copy / 'checkpoint-1'} (sha256 of every file verified)")
    assert f"skipped newer checkpoint-2: {MANIFEST_NAME} {reason}" in seen["resume"]
    assert "checkpoint-2" in caplog.text and reason in caplog.text


def test_a_damaged_checksum_file_resumes_end_to_end_and_the_step_is_written_again(finished, tmp_path, caplog):
    _, plan, data, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    _garbage(copy / "checkpoint-2" / MANIFEST_NAME)
    with caplog.at_level(logging.WARNING, logger="hwrun.training.checkpoints"):
        result = hwrun.train(plan, data, lora=True, output_dir=copy, max_steps=3, resume="auto", **FAST)
    assert result.resumed_from == str(copy / "checkpoint-1") and result.global_step == 3
    assert "Replacing" in caplog.text and "did not verify" in caplog.text  # the damaged step 2, written again
    from hwrun.training import check_checkpoint

    assert all(check_checkpoint(copy / f"checkpoint-{n}", verify=True) is None for n in (1, 2, 3))
