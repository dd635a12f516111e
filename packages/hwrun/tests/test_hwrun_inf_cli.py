"""`hwrun plan` / `hwrun generate`: table and JSON, generated text with tokens/s, batch files, errors."""

from __future__ import annotations

import json

import pytest
from hwrun.cli.main import main
from hwrun.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-cli")))


def test_plan_table_and_json(tiny, capsys):
    assert main(["plan", tiny, "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "device_map" in table and "float32" in table and "sdpa" in table
    assert main(["plan", tiny, "--device", "cpu", "--json", "--compile"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cpu" and data["compile"]["backend"] == "inductor"


def test_generate_one_prompt_streams_and_reports_tokens_per_second(tiny, capsys):
    assert main(["generate", "--model", tiny, "--device", "cpu", "--max-new-tokens", "6", "The king said"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("The king said")
    assert "tokens/s" in captured.err and "batching: static" in captured.err


def test_first_readme_command_prints_words_from_the_shipped_model(capsys):
    assert main(["generate", "The king said", "--max-new-tokens", "12"]) == 0
    captured = capsys.readouterr()
    continuation = captured.out[len("The king said"):]
    assert captured.out.startswith("The king said") and sum(ch.isalpha() for ch in continuation) >= 5
    assert "tokens/s" in captured.err


def test_generate_batch_file_json(tiny, tmp_path, capsys):
    batch = tmp_path / "prompts.txt"
    batch.write_text("The king said\n\nOnce upon a time\nIt was\n")
    assert main(["generate", "--model", tiny, "--device", "cpu", "--max-new-tokens", "5", "--batch-file", str(batch),
                 "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert len(data["texts"]) == 3 and data["batching"] == "continuous"
    assert all(0 < n <= 5 for n in data["new_tokens"])


def test_generate_static_batch_file_in_chunks(tiny, tmp_path, capsys):
    batch = tmp_path / "many.txt"
    batch.write_text("\n".join(f"The king said {i}" for i in range(20)))
    assert main(["generate", "--model", tiny, "--device", "cpu", "--max-new-tokens", "3", "--batch-file", str(batch),
                 "--batching", "static"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("---") == 20
    assert "in chunks of 16" in captured.err and "generating" in captured.err  # the progress bar


@pytest.mark.parametrize("argv, message", [
    (["generate", "--max-new-tokens", "0", "hi"], "max_new_tokens=0"),
    (["generate"], "no prompt given"),
    (["generate", "--model", "/nonexistent/model", "hi"], "does not exist"),
    (["generate", "--batch-file", "/nonexistent/prompts.txt"], "cannot be read"),
    (["plan", "--device", "tpu"], "not a device kind"),
])
def test_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
