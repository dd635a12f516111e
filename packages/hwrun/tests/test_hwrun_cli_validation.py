"""Issue 27 for `hwrun plan` / `generate`: bad model files, options and prompt files are one clear error before
anything loads (the same cases run through the real CLI in tests/reliability/cases_hwrun_generate.py)."""

from __future__ import annotations

import json
import re
import shutil

import hwrun
import pytest
from hwrun.cli.main import main, read_batch_file
from hwrun.errors import GenerateError, ModelSourceError, PlanError


@pytest.fixture
def model_copy(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(hwrun.DEFAULT_MODEL, folder)
    return folder


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_truncated_weights_are_refused_by_the_plan(model_copy):
    weights = model_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelSourceError, match=r"truncated"):
        hwrun.plan(str(model_copy))
    weights.write_bytes(data + b"\0" * 10)
    with pytest.raises(ModelSourceError, match=r"longer than its tensors"):
        hwrun.plan(str(model_copy))
    weights.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(ModelSourceError, match=r"header is not valid JSON"):
        hwrun.plan(str(model_copy))


@pytest.mark.parametrize(("config", "message"), [
    ([1, 2], r"JSON list, not an object"),
    ("text", r"JSON str, not an object"),
    ("drop-model-type", r"has no `model_type`"),
    ({"max_position_embeddings": 0}, r"max_position_embeddings=0 must be a positive integer"),
    ({"max_position_embeddings": "4096"}, r"max_position_embeddings='4096' must be a positive integer"),
    ({"text_config": {"max_position_embeddings": -1}}, r"text_config\.max_position_embeddings=-1 must be a positive"),
])
def test_config_json_must_be_an_object_with_a_model_type(model_copy, config, message):
    if config == "drop-model-type":
        config = {k: v for k, v in _config(model_copy).items() if k != "model_type"}
    elif isinstance(config, dict):  # one field changed in the model's own config
        config = {**_config(model_copy), **config}
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelSourceError, match=message):
        hwrun.plan(str(model_copy))


def test_custom_code_needs_trust_remote_code_before_loading(model_copy):
    original = _config(model_copy)
    config = {**original, "model_type": "my_custom", "auto_map": {"AutoModelForCausalLM": "modeling_my.M"}}
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanError, match=r"modeling_my\.M.*trust_remote_code=True"):
        hwrun.plan(str(model_copy))
    assert hwrun.plan(str(model_copy), trust_remote_code=True).trust_remote_code is True
    # an auto_map on a built-in model_type (e.g. a saved config that kept it) needs no remote code
    builtin = {**original, "auto_map": {"AutoModelForCausalLM": "modeling_my.M"}}
    (model_copy / "config.json").write_text(json.dumps(builtin))
    assert hwrun.plan(str(model_copy)).trust_remote_code is False


def test_misspelt_compile_backend_names_the_closest():
    with pytest.raises(PlanError, match=r"compile='inductr'.*did you mean 'inductor'"):
        hwrun.plan(compile="inductr")
    assert hwrun.plan(compile="eager").compile.backend == "eager"


@pytest.mark.parametrize(("argv", "message"), [
    (["--temperature", "0.5"], r"--temperature 0.5: sampling options do nothing without --sample"),
    (["--top-p", "0.9", "--seed", "3"], r"--top-p 0.9, --seed 3: sampling options"),
    (["--sample", "--temperature", "0"], r"--temperature 0.0 must be > 0"),
    (["--sample", "--top-p", "1.5"], r"--top-p 1.5 must be in \(0, 1\]"),
    (["--sample", "--top-k", "0"], r"--top-k 0 must be >= 1"),
])
def test_sampling_flags_are_checked_before_loading(monkeypatch, capsys, argv, message):
    monkeypatch.setattr("hwrun.model.load.load", lambda *a, **k: pytest.fail("the model must not load"))
    assert main(["generate", "The king said", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "", "nothing is printed (before: the prompt, then the error glued to it)"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwrun: error: ")
    assert re.search(message, lines[0]), lines[0]


def test_errors_from_other_hwstack_packages_are_one_line(monkeypatch, capsys):
    monkeypatch.setenv("HWENV_DEVICE", "bogus")
    assert main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HWENV_DEVICE='bogus'" in err and "Traceback" not in err


def test_verbose_adds_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("HWENV_DEVICE", "bogus")
    assert main(["--verbose", "plan"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("hwrun: error: HWENV_DEVICE='bogus'")


def test_batch_files_must_be_bounded_utf8_text(tmp_path):
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(GenerateError, match=r"not UTF-8 text"):
        read_batch_file(str(binary))
    big = tmp_path / "big.txt"
    big.write_text("a prompt\n" * 20)
    with pytest.raises(GenerateError, match=r"180 bytes, more than the 100-byte limit"):
        read_batch_file(str(big), limit=100)
    assert read_batch_file(str(big)) == ["a prompt"] * 20
    with pytest.raises(GenerateError, match=r"not a regular file"):
        read_batch_file("/dev/zero")


def test_compile_cache_is_announced_cold_then_warm(tmp_path, monkeypatch, capsys):
    """`hwrun generate --compile` where graph decode compiles: the persistent cache folder and its state on stderr."""
    import os

    import hwenv
    from hwrun.cli.main import announce_compile_cache

    monkeypatch.setenv("HWSTACK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    plan = hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)), compile=True)
    announce_compile_cache(plan)
    first = capsys.readouterr().err
    folder = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert folder.startswith(str(tmp_path)) and "(cold: the first call compiles the decode step)" in first
    (tmp_path / folder / "fxgraph" / "ab").mkdir(parents=True)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    announce_compile_cache(plan)
    assert "(warm: reusing compiled graphs)" in capsys.readouterr().err


def test_compile_cache_opted_out_is_announced_as_off(tmp_path, monkeypatch, capsys):
    """HWSTACK_COMPILE_CACHE=0: stderr says the persistent cache is off, not "cold", and torch's folders stay unset."""
    import os

    import hwenv
    from hwrun.cli.main import announce_compile_cache

    monkeypatch.setenv("HWSTACK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HWSTACK_COMPILE_CACHE", "0")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    announce_compile_cache(hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)), compile=True))
    err = capsys.readouterr().err
    assert "persistent compile cache off: HWSTACK_COMPILE_CACHE=0" in err and "cold" not in err
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_compile_on_a_device_without_graphs_announces_nothing(monkeypatch, capsys):
    monkeypatch.setattr("hwrun.cli.main.announce_compile_cache", lambda plan: pytest.fail("nothing compiles on CPU"))
    assert main(["generate", "The king said", "--compile", "--max-new-tokens", "2"]) == 0
    assert "decode: generate" in capsys.readouterr().err


def test_streamed_generation_times_the_first_token_apart(capsys):
    """issue 29 point 4: the first call's one-time set-up is shown apart from the decode rate."""
    assert main(["generate", "The king said", "--max-new-tokens", "6"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("The king said") and len(captured.out.strip()) > len("The king said")
    found = re.search(r"\(first token after (\d+\.\d+)s, then (\d+\.\d)+ tokens/s\)", captured.err)
    assert found, captured.err
    from hwrun.cli.streaming import timed_text_streamer

    streamer = timed_text_streamer(hwrun.load(hwrun.plan())[1])
    assert streamer.summary(3) == "no token streamed"


def test_the_cli_streams_from_the_graph_decoder_too(capsys):
    """issue 26 point 3: `--decode graphs` (what `--compile` picks on CUDA/XPU) streams instead of printing at the end."""
    assert main(["generate", "The king said", "--decode", "graphs", "--max-new-tokens", "5"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("The king said") and "first token after" in captured.err
    assert "decode: graphs" in captured.err


def test_hwrun_plan_shows_the_decode_path_with_its_reason(capsys, fake_cuda):
    """issue 26: `hwrun plan` says which decode loop runs for one prompt and for many, and why."""
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^decode \(1 prompt\)\s+generate, static batching\s+model\.generate", out, re.M), out
    assert re.search(r"^decode \(64 prompts\)\s+generate, continuous batching", out, re.M), out
    fake_cuda(1)
    assert main(["plan", "--compile", "--json"]) == 0
    decode = json.loads(capsys.readouterr().out)["decode"]
    assert decode["decode (1 prompt)"]["value"] == "graphs, static batching"
    assert "replay" in decode["decode (1 prompt)"]["reason"]
