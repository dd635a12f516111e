"""Issue 27 point 9 for training: `hwrun.train(...)` checks its keyword arguments before any work. A bool or a
float where an int belongs, a misspelt keyword (named with the closest valid one), a TrainingArguments keyword
that train() sets itself, or a value TrainingArguments refuses is a TrainingConfigError, never another
library's TypeError, and nothing is read, loaded or written."""

from __future__ import annotations

import hwrun
import pytest
from hwrun.errors import TrainingConfigError


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    """(plan, data file, output folder) with every later phase made to fail loudly if it is reached."""
    def reached(*args, **kwargs):
        pytest.fail("a later phase ran")

    monkeypatch.setattr("hwrun.training.run._load_model", reached)
    monkeypatch.setattr("hwrun.training.data.read_documents", reached)
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen. " * 20, encoding="utf-8")
    return hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data, tmp_path / "out"


@pytest.mark.parametrize(("options", "message"), [
    ({"max_steps": True}, r"max_steps=True \(must be an int >= 1, or -1"),
    ({"max_steps": 2.0}, r"max_steps=2\.0 \(must be an int"),
    ({"max_steps": "3"}, r"max_steps='3' \(must be an int"),
    ({"batch_size": True}, r"batch_size=True \(must be an int >= 1"),
    ({"block_size": False}, r"block_size=False"),
    ({"lr": True}, r"lr=True \(must be a positive finite number"),
    ({"epochs": True, "max_steps": -1}, r"epochs=True"),
    ({"seed": False}, r"seed=False"),
    ({"save_steps": 1.5}, r"save_steps=1\.5"),
    ({"max_data_bytes": 0}, r"max_data_bytes=0"),
    ({"qlora": "yes"}, r"qlora='yes' \(must be True or False\)"),
    ({"merge": 1}, r"merge=1 \(must be True or False\)"),
    ({"overwrite": "true"}, r"overwrite='true'"),
    ({"plot": None}, r"plot=None"),
    ({"on_nonfinite": "continue"}, r"on_nonfinite='continue' \(must be one of 'stop', 'skip', 'ignore'\)"),
    ({"callbacks": "PrinterCallback"}, r"callbacks='PrinterCallback'"),
    ({"echo": "print"}, r"echo='print'"),
])
def test_wrong_types_are_refused_before_any_work(setup, options, message):
    plan, data, out = setup
    with pytest.raises(TrainingConfigError, match=message):
        hwrun.train(plan, data, output_dir=out, **{"max_steps": 1, **options})
    assert not out.exists()


@pytest.mark.parametrize(("keyword", "closest"), [
    ("max_step", "max_steps"),
    ("learning_rat", "lr= (TrainingArguments' learning_rate, which train() sets from it)"),
    ("save_step", "save_steps"),
    ("ouput_dir", "output_dir"),
    ("lr_scheduler_typ", "lr_scheduler_type"),
    ("on_nonfinit", "on_nonfinite"),
    ("overwite", "overwrite"),
])
def test_a_misspelt_keyword_names_the_closest_valid_one(setup, keyword, closest):
    plan, data, out = setup
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, output_dir=out, max_steps=1, **{keyword: 3})
    message = str(caught.value)
    assert f"unknown keyword {keyword}=" in message
    assert f"Did you mean {closest}?" in message if "(" in closest else f"Did you mean {closest}=?" in message
    assert not isinstance(caught.value, TypeError)


def test_a_keyword_with_nothing_close_still_names_itself(setup):
    plan, data, out = setup
    with pytest.raises(TrainingConfigError, match=r"unknown keyword zzzqqq=.*neither one of train\(\)'s options"):
        hwrun.train(plan, data, output_dir=out, max_steps=1, zzzqqq=1)


@pytest.mark.parametrize(("keyword", "use"), [
    ("learning_rate", "pass lr= instead"),
    ("num_train_epochs", "pass epochs= instead"),
    ("per_device_train_batch_size", "pass batch_size= instead"),
    ("gradient_accumulation_steps", "pass grad_accum= instead"),
    ("data_seed", "pass seed= instead"),
    ("ddp_find_unused_parameters", "leave it out"),
])
def test_training_arguments_that_train_sets_itself_are_refused_not_a_typeerror(setup, keyword, use):
    """Before: `train(..., learning_rate=1e-3)` raised TypeError 'got multiple values for keyword argument'."""
    plan, data, out = setup
    with pytest.raises(TrainingConfigError, match=rf"{keyword}=\.\.\.\) is a TrainingArguments keyword.*{use}"):
        hwrun.train(plan, data, output_dir=out, max_steps=1, **{keyword: 1})


def test_a_value_trainingarguments_refuses_is_a_training_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen. " * 20, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError, match=r"TrainingArguments refused these options "
                                                  r"\(lr_scheduler_type='sideways'\).*sideways"):
        hwrun.train(plan, data, output_dir=tmp_path / "out", max_steps=1, batch_size=1, lr_scheduler_type="sideways")


@pytest.mark.parametrize("plan", ["tiny-llama", 3])
def test_a_plan_that_is_not_a_runplan_is_refused(setup, plan):
    _, data, out = setup
    with pytest.raises(TrainingConfigError, match=r"first argument .* not a RunPlan"):
        hwrun.train(plan, data, output_dir=out, max_steps=1)


def test_data_of_the_wrong_type_is_refused(setup):
    plan, _, out = setup
    with pytest.raises(TrainingConfigError, match=r"data=42 \(must be a path"):
        hwrun.train(plan, 42, output_dir=out, max_steps=1)


def test_an_iterable_dataset_is_a_dataset(setup, monkeypatch):
    plan, _, out = setup

    class Stream:
        def __iter__(self):
            yield {"input_ids": [1, 2], "labels": [1, 2]}

    monkeypatch.setattr("hwrun.training.run._arguments", lambda *a, **k: pytest.fail("a later phase ran"))
    with pytest.raises(pytest.fail.Exception, match="a later phase ran"):  # accepted: reached the arguments phase
        hwrun.train(plan, Stream(), output_dir=out, max_steps=1)


def test_valid_training_arguments_keywords_pass(setup):
    plan, data, out = setup
    with pytest.raises(pytest.fail.Exception, match="a later phase ran"):  # reached the data phase
        hwrun.train(plan, data, output_dir=out, max_steps=1, lr_scheduler_type="constant", warmup_steps=0)
