"""What `hwrun train` and `hwrun generate` print by default (issue 40 point 4): the `step N/M  loss` lines and no
Trainer dict lines; library messages that are not about the command filtered narrowly (hwrun.cli.quiet), only
for the command, and all of them shown with -v."""

from __future__ import annotations

import io
import logging
import warnings
from types import SimpleNamespace

import pytest
from hwrun.cli import quiet


def _plan(is_accelerator: bool):
    return SimpleNamespace(accelerator=SimpleNamespace(platform=SimpleNamespace(is_accelerator=is_accelerator)))


def _emitted(logger_name: str, message: str) -> str:
    logger = logging.getLogger(logger_name)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        logger.warning(message)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


DEEPSPEED = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
PYTREE = ("<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an opaque "
          "value type. Calling register_constant() on Enum subclasses is deprecated")


def test_deepspeed_s_cpu_guess_is_dropped_on_a_host_plan_only():
    with quiet.library_noise_filtered():
        quiet.note_plan(_plan(is_accelerator=False))
        assert _emitted("DeepSpeed", DEEPSPEED) == ""
        assert "something else" in _emitted("DeepSpeed", "something else")  # only that message
        quiet.note_plan(_plan(is_accelerator=True))
        assert "Setting accelerator to CPU" in _emitted("DeepSpeed", DEEPSPEED)  # on an accelerator it may matter
    quiet.note_plan(_plan(is_accelerator=False))
    assert "Setting accelerator to CPU" in _emitted("DeepSpeed", DEEPSPEED)  # removed after the command


def test_torchao_s_enum_registration_note_is_dropped_and_others_kept():
    with quiet.library_noise_filtered():
        assert _emitted("torch.utils._pytree", PYTREE) == ""
        assert "other" in _emitted("torch.utils._pytree", "other pytree news")
    assert "Enum subclass" in _emitted("torch.utils._pytree", PYTREE)


def test_peft_s_deprecated_attribute_read_is_ignored_for_the_command_only():
    def peft_reads_it():
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                      "`is_activation_checkpointing` instead.", FutureWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet.library_noise_filtered():
            peft_reads_it()
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
        peft_reads_it()
    assert [str(w.message)[:25] for w in seen] == ["another FutureWarning", "`is_gradient_checkpointin"]


def test_verbose_installs_no_filter():
    with quiet.library_noise_filtered(enabled=False):
        quiet.note_plan(_plan(is_accelerator=False))
        assert "Setting accelerator" in _emitted("DeepSpeed", DEEPSPEED)


def test_the_step_bar_counts_steps_on_stderr_and_prints_lines_on_stdout(capsys):
    from hwrun.training.progress import StepBar

    err = io.StringIO()
    bar = StepBar(file=err)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=3, global_step=1)  # resumed after step 1
    bar.on_train_begin(None, state, None)
    for step in (2, 3):
        state.global_step = step
        bar.on_step_end(None, state, None)
        bar.write(f"step {step}/3  loss 1.0")
    assert (bar.bar.n, bar.bar.total) == (3, 3) and "training" in err.getvalue()
    bar.on_train_end(None, state, None)
    assert bar.bar is None
    assert capsys.readouterr().out == "step 2/3  loss 1.0\nstep 3/3  loss 1.0\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hwrun.testing import build_tiny_model

    root = tmp_path_factory.mktemp("quiet")
    data = root / "data.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    return build_tiny_model(root / "model"), data


def test_train_prints_step_lines_by_default_and_no_trainer_dicts(files, tmp_path, capsys):
    from hwrun.cli.main import main

    model, data = files
    assert main(["train", "--data", str(data), "--model", str(model), "--lora", "--batch-size", "4", "--block-size",
                 "32", "--max-steps", "2", "--output", str(tmp_path / "o"), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert any(line.startswith("step 1/2  loss ") for line in lines)
    assert any(line.startswith("step 2/2  loss ") for line in lines)
    assert not any("{'loss'" in line or "'train_runtime'" in line for line in lines + captured.err.splitlines())
    assert not any(line.startswith("kernels: ") for line in lines)  # the default choices: with -v
    assert "FutureWarning" not in captured.err and "Setting accelerator to CPU" not in captured.out


def test_quiet_transformers_keeps_the_hubs_download_bars(monkeypatch):
    """generate/serve/chat --local quiet Transformers' own bars, not the Hub's download bars (a first download can be
    several GB); HF_HUB_DISABLE_PROGRESS_BARS=1 still turns them off."""
    import transformers
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from hwrun.cli.main import quiet_transformers

    before = transformers.utils.logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    try:
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        quiet_transformers()
        assert not transformers.utils.logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        disable_progress_bars()
        quiet_transformers()
        assert are_progress_bars_disabled()
    finally:
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        (transformers.utils.logging.enable_progress_bar if before[0] else transformers.utils.logging.disable_progress_bar)()
        (disable_progress_bars if before[1] else enable_progress_bars)()
