"""What a training run shows and leaves to look at (issue 39.3): Hub download progress on by default and off with
--quiet, the step bar's tokens/s and ETA, TensorBoard event files of every logged number (read back here frame by frame,
CRC-checked), a held-out split whose eval loss reaches the result, the plot and the logs; --report-to checked first."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import hwrun
import pytest
from hwrun.cli.main import main
from hwrun.errors import TrainingConfigError
from hwrun.training.events import EVENTS_DIR, masked_crc


def read_events(path):
    """[(step, {tag: value})] of one event file: every frame's CRCs checked, the protobuf fields decoded."""
    raw, at, events = path.read_bytes(), 0, []

    def varint(data, i):
        value = shift = 0
        while True:
            byte = data[i]
            value |= (byte & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not byte & 0x80:
                return value, i

    def fields(data):
        i = 0
        while i < len(data):
            key, i = varint(data, i)
            number, kind = key >> 3, key & 7
            if kind == 0:
                value, i = varint(data, i)
            elif kind == 1:
                value, i = data[i:i + 8], i + 8
            elif kind == 5:
                value, i = data[i:i + 4], i + 4
            else:
                size, i = varint(data, i)
                value, i = data[i:i + size], i + size
            yield number, value

    while at < len(raw):
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", raw[at + 8:at + 12])[0] == masked_crc(header)
        record = raw[at + 12:at + 12 + length]
        assert struct.unpack("<I", raw[at + 12 + length:at + 16 + length])[0] == masked_crc(record)
        at += 16 + length
        step, scalars = 0, {}
        for number, value in fields(record):
            if number == 2:
                step = value
            elif number == 5:
                for _, item in fields(value):
                    entry = dict(fields(item))
                    scalars[entry[1].decode()] = struct.unpack("<f", entry[2])[0]
        events.append((step, scalars))
    return events


@pytest.fixture()
def hub_bars():
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    before = are_progress_bars_disabled()
    yield are_progress_bars_disabled
    (disable_progress_bars if before else enable_progress_bars)()


@pytest.mark.parametrize("quiet", [False, True])
def test_hub_download_progress_is_on_unless_quiet(tmp_path, monkeypatch, capsys, hub_bars, quiet):
    seen = {}

    def plan_only(*args, **kwargs):  # the plan is where a Hub model downloads: record the bars' state, stop
        seen["disabled"] = hub_bars()
        raise TrainingConfigError("stop here")

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr("hwrun.training.train_plan", plan_only)
    argv = ["train", "--data", str(tmp_path / "d.txt"), "--output", str(tmp_path / "o")] + (["--quiet"] if quiet else [])
    assert main(argv) == 2 and "stop here" in capsys.readouterr().err
    assert seen["disabled"] is quiet  # main() turned every bar off (Transformers' quiet), train turned the Hub's on


def test_step_bar_shows_tokens_per_second_and_eta():
    from types import SimpleNamespace

    import torch
    from hwrun.training.progress import StepBar

    out = io.StringIO()
    bar = StepBar(file=out)
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=2)
    loader = SimpleNamespace(dataset=SimpleNamespace(blocks=torch.zeros(10, 64, dtype=torch.long)))
    state = SimpleNamespace(is_world_process_zero=True, max_steps=10, global_step=0)
    bar.on_train_begin(args, state, None, train_dataloader=loader)
    assert bar.tokens_per_step == 64 * 4 * 2 * 2
    start = bar._start[0]
    assert bar.tokens_per_second(3, now=start + 2.0) == pytest.approx(3 * 1024 / 2.0)
    assert bar.tokens_per_second(0, now=start + 2.0) is None  # no step yet
    state.global_step = 3
    bar.on_step_end(args, state, None)
    shown = str(bar.bar)
    assert "3/10 steps" in shown and "tokens/s" in shown and "<" in shown  # elapsed<remaining: tqdm's ETA
    bar.on_train_end(args, state, None)


def test_eval_split_events_and_plot(tmp_path):
    data = tmp_path / "d.txt"
    sample = (Path(hwrun.DEFAULT_MODEL) / "sample_train.txt").read_text(encoding="utf-8")
    data.write_text(sample[:5000], encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    out = tmp_path / "out"
    result = hwrun.train(plan, data, lora=True, max_steps=4, batch_size=2, block_size=32, lr=3e-3,
                         output_dir=out, eval_fraction=0.2, eval_steps=2, save_steps=2, disable_tqdm=True)
    held = result.reasons["eval"]
    assert "held out for evaluation" in held and "every 2 steps" in held
    assert [s for s, _ in result.eval_losses] == [2, 4]
    assert all(0 < loss < 20 for _, loss in result.eval_losses)
    files = sorted((out / EVENTS_DIR).rglob("events.out.tfevents.*"))
    assert len(files) == 1
    events = read_events(files[0])
    losses = {step: values["train/loss"] for step, values in events if "train/loss" in values}
    assert sorted(losses) == [1, 2, 3, 4]
    for step, loss in result.losses:
        assert losses[step] == pytest.approx(loss, rel=1e-6)  # float32 in the file
    evals = {step: values["eval/loss"] for step, values in events if "eval/loss" in values}
    assert evals == pytest.approx(dict(result.eval_losses), rel=1e-6)
    assert any("train/tokens_per_second" in values for _, values in events)
    assert result.loss_plot and (out / "loss.png").is_file()

    # the events folder is hwrun's: a resume into the folder is not refused for it, and writes a second session
    again = hwrun.train(plan, data, lora=True, max_steps=6, batch_size=2, block_size=32, lr=3e-3, output_dir=out,
                        eval_fraction=0.2, eval_steps=2, save_steps=2, disable_tqdm=True, resume="auto")
    assert again.resumed_from and again.global_step == 6
    assert len(list((out / EVENTS_DIR).rglob("events.out.tfevents.*"))) == 2


@pytest.mark.parametrize(("options", "match"), [
    ({"eval_fraction": 0.5}, r"eval_fraction=0.5 .* \[0, 0.5\)"),
    ({"eval_fraction": True}, r"eval_fraction=True"),
    ({"eval_steps": 3}, r"eval_steps=3 given without eval_fraction"),
    ({"eval_fraction": 0.1, "eval_steps": 0}, r"eval_steps=0 .* >= 1"),
])
def test_bad_eval_options_are_refused_before_any_work(tmp_path, options, match):
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError, match=match):
        hwrun.train(plan, tmp_path / "missing.txt", output_dir=tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_an_eval_split_that_leaves_less_than_a_step_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the option was rejected")

    monkeypatch.setattr("hwrun.training.run._load_model", refuse)
    data = tmp_path / "d.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 12, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError, match=r"eval_fraction=0.4 holds out \d+ of \d+ packed blocks, leaving"):
        hwrun.train(plan, data, lora=True, block_size=32, batch_size=4, eval_fraction=0.4, output_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_report_to_a_tracker_that_is_not_installed_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("transformers.integrations.get_available_reporting_integrations", lambda: ["mlflow"])
    assert main(["train", "--data", str(tmp_path / "d.txt"), "--report-to", "tensorboard", "--output",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--report-to 'tensorboard': tensorboard cannot be used here (installed trackers: mlflow)" in err
    assert "pip install tensorboard" in err and not (tmp_path / "o").exists()
