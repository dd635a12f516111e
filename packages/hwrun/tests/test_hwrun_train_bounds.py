"""Issue 42 point 4, the training options that were accepted silently: each is refused before the model loads,
naming the value, the bound and why, and the fix; nothing is left on disk.

- `max_position_embeddings: 0` (or below --block-size) in the model's config.json;
- an unbounded --batch-size (more blocks per step than the data packs into: Trainer trained a smaller batch);
- an unbounded --lora-r (above the model's hidden size);
- booleans given as strings ("false" is truthy) to TrainingArguments keywords and PEFT's LoRA settings;
- LoRA numbers of the wrong type.
A changed --block-size on resume is test_hwrun_train_resume_match.py's."""

from __future__ import annotations

import json
import shutil

import hwrun
import pytest
from hwrun.errors import ModelSourceError, TrainingConfigError

FAST = {"lora": True, "max_steps": 1, "batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": False}
TEXT = "The king said to the queen that the castle was cold. " * 40  # 17 blocks of 32 tokens


def _model_with(tmp_path, **config):
    folder = tmp_path / "model"
    shutil.copytree(hwrun.DEFAULT_MODEL, folder)
    settings = json.loads((folder / "config.json").read_text())
    settings.update(config)
    (folder / "config.json").write_text(json.dumps(settings))
    return str(folder)


CASES = [
    # id, model config changes, train options, words the error must hold
    ("max-positions-zero", {"max_position_embeddings": 0}, {}, ["config.json: max_position_embeddings=0 must be a positive integer"]),
    ("max-positions-a-string", {"max_position_embeddings": "512"}, {}, ["max_position_embeddings='512' must be a positive integer"]),
    ("block-past-positions", {"max_position_embeddings": 16}, {},
     ["block_size=32 (--block-size) exceeds the model's max_position_embeddings=16", "--block-size 16"]),
    ("batch-past-the-data", {}, {"batch_size": 1_000_000_000},
     ["batch_size=1000000000 (--batch-size)", "the data packs into 17 blocks", "--batch-size 17 or less"]),
    ("batch-times-accumulation", {}, {"batch_size": 9, "grad_accum": 2}, ["= 18 blocks per optimizer step"]),
    ("lora-r-past-hidden", {}, {"lora": {"r": 100_000}}, ["LoRA r=100000 (--lora-r) exceeds the model's hidden size 128"]),
    ("lora-r-a-string", {}, {"lora": {"r": "16"}}, ["LoRA r='16' is invalid"]),
    ("lora-alpha-zero", {}, {"lora": {"alpha": 0}}, ["LoRA alpha=0 is invalid"]),
    ("lora-bool-as-string", {}, {"lora": {"use_dora": "false"}},
     ["'use_dora': 'false'} must be True or False", "counts as True", "use_dora=False"]),
    ("trainer-bool-as-string", {}, {"bf16": "false"}, ["bf16='false') must be True or False", "bf16=False"]),
    ("trainer-bool-as-number", {}, {"use_cpu": 1}, ["use_cpu=1) must be True or False"]),
]


@pytest.mark.parametrize(("config", "options", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_unbounded_or_mistyped_training_options_are_refused_before_loading(tmp_path, monkeypatch, config, options,
                                                                           words):
    data = tmp_path / "train.txt"
    data.write_text(TEXT, encoding="utf-8")
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model loaded"))
    # a config.json hwrun cannot run is refused by plan() already (ModelSourceError), the rest by train()
    with pytest.raises((TrainingConfigError, ModelSourceError)) as caught:
        plan = hwrun.plan(_model_with(tmp_path, **config) if config else hwrun.DEFAULT_MODEL, device="cpu")
        hwrun.train(plan, data, output_dir=tmp_path / "out", **{**FAST, **options})
    message = str(caught.value)
    for word in words:
        assert word in message, message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options", [{"batch_size": 17}, {"lora": {"r": 128}}, {"lora": {"use_rslora": False}},
                                     {"bf16": False}], ids=["batch-of-all-blocks", "r-at-hidden", "lora-bool",
                                                            "trainer-bool"])
def test_the_bounds_themselves_are_accepted(tmp_path, monkeypatch, options):
    class Loaded(Exception):
        pass

    data = tmp_path / "train.txt"
    data.write_text(TEXT, encoding="utf-8")

    def load(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr("hwrun.training.run._load_model", load)
    with pytest.raises(Loaded):
        hwrun.train(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data, output_dir=tmp_path / "out",
                    **{**FAST, **options})
