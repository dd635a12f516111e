"""`hwrun train` on the command line (in-process): trains, logs losses, writes the loss-curve PNG,
resumes with --resume, and reports bad input as one line with exit status 2."""

from __future__ import annotations

import pytest
from hwrun.cli.main import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hwrun.testing import build_tiny_model

    root = tmp_path_factory.mktemp("cli")
    model = build_tiny_model(root / "model")
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"text": "The king said to the queen, line {i}."}}\n' for i in range(60)),
                    encoding="utf-8")
    return model, data


def test_train_cli_lora_logs_plots_and_resumes(files, tmp_path, capsys, caplog):
    model, data = files
    out = tmp_path / "out"
    common = ["train", "--data", str(data), "--model", str(model), "--lora", "--batch-size", "4",
              "--block-size", "32", "--output", str(out), "--save-steps", "2", "--no-progress", "--device", "cpu"]
    assert main([*common, "--max-steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "dtype" in printed and "float32" in printed  # the plan is shown first
    assert "step 1/2  loss" in printed and "step 2/2  loss" in printed
    assert "{'loss'" not in printed and "'train_runtime'" not in printed  # loss lines only, no raw log dicts
    assert "LoRA adapter saved in" in printed and "hwrun generate --model" in printed
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "adapter_model.safetensors").is_file()

    assert main([*common, "--max-steps", "4", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "a run of max_steps=2" in caplog.text and "rebuilds the learning-rate schedule" in caplog.text
    assert f"resumed from {out / 'checkpoint-2'}" in printed
    assert "step 3/4  loss" in printed and "step 1/4" not in printed
    assert (out / "checkpoint-4").is_dir()


def test_train_cli_bad_data_is_one_line_and_exit_2(files, tmp_path, capsys):
    model, _ = files
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    assert main(["train", "--data", str(empty), "--model", str(model), "--device", "cpu",
                 "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwrun: error: ") and "empty" in err and str(empty) in err


def test_train_cli_needs_data():
    with pytest.raises(SystemExit) as info:
        main(["train"])
    assert info.value.code == 2


def test_lora_options_without_lora_are_refused(files, tmp_path, capsys):
    model, data = files
    out = tmp_path / "o"
    assert main(["train", "--data", str(data), "--model", str(model), "--device", "cpu", "--output", str(out),
                 "--lora-r", "8", "--lora-targets", "q_proj"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwrun: error: ") and "--lora-r, --lora-targets given without --lora" in err
    assert "full fine-tuning" in err and not out.exists()


def test_a_second_fresh_run_into_the_same_output_is_refused(files, tmp_path, capsys):
    model, data = files
    out = tmp_path / "out"
    common = ["train", "--data", str(data), "--model", str(model), "--lora", "--batch-size", "4", "--block-size",
              "32", "--output", str(out), "--max-steps", "1", "--save-steps", "1", "--no-progress", "--device", "cpu"]
    assert main(common) == 0
    saved = (out / "adapter_model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(common) == 2  # no --resume: it would replace that run's adapter and checkpoints
    err = capsys.readouterr().err
    assert err.startswith("hwrun: error: ") and "already holds an earlier run" in err and "--resume" in err
    assert (out / "adapter_model.safetensors").read_bytes() == saved


def one_line_error(capsys, head: str = "hwrun: error: ") -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(head) and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("flags", "named"), [
    (["--on-nonfinite", "continue"], "'continue'"),
    (["--max-data-size", "lots"], "'lots'"),
    (["--max-data-size", "0"], "'0'"),
])
def test_new_flags_are_checked_by_the_parser_in_one_line(files, tmp_path, capsys, flags, named):
    model, data = files
    with pytest.raises(SystemExit) as info:
        main(["train", "--data", str(data), "--model", str(model), "--output", str(tmp_path / "o"), *flags])
    assert info.value.code == 2
    assert named in one_line_error(capsys, "hwrun train: error: ") and not (tmp_path / "o").exists()


def test_a_diverging_run_is_one_line_exit_2_naming_step_and_value(tmp_path, capsys):
    """The shipped tiny model with --lr 1e6 (before: 'final loss nan; model saved', exit 0)."""
    data = tmp_path / "story.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    out = tmp_path / "o"
    code = main(["train", "--data", str(data), "--lora", "--batch-size", "4", "--block-size", "32", "--output",
                 str(out), "--max-steps", "6", "--lr", "1e6", "--no-progress", "--device", "cpu"])
    line = one_line_error(capsys)
    # which rule trips first (a loss worse than guessing, weights grown a million-fold, NaN) is the processor's
    assert code == 2 and "Training stopped at step" in line and "so the run diverged (lr=1000000.0)" in line
    assert not out.exists()


def test_a_folder_of_user_files_is_one_line_and_overwrite_keeps_them(files, tmp_path, capsys):
    model, data = files
    out = tmp_path / "project"
    out.mkdir()
    (out / "README.md").write_text("# mine\n", encoding="utf-8")
    common = ["train", "--data", str(data), "--model", str(model), "--lora", "--batch-size", "4", "--block-size",
              "32", "--output", str(out), "--max-steps", "1", "--no-progress", "--device", "cpu"]
    assert main(common) == 2
    assert "holds files hwrun did not write (README.md)" in one_line_error(capsys)
    assert main([*common, "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "note: not written, because files of these names" in printed and "README.md" in printed
    assert (out / "README.md").read_text(encoding="utf-8") == "# mine\n"
    assert (out / "adapter_model.safetensors").is_file()


def test_verbose_adds_the_traceback(files, tmp_path, capsys):
    model, _ = files
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    args = ["train", "--data", str(empty), "--model", str(model), "--device", "cpu", "--output", str(tmp_path / "o")]
    assert main([*args, "--verbose"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("hwrun: error: ")
