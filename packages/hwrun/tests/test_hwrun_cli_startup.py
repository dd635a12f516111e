"""Start-up of the command lines (issue 40 point 3), and the torch thread rule `hwrun generate` shares with
`hwrun serve`. Structure, not timing: which heavy modules a command imports, checked in a fresh process
through `sys.modules` (the figures are in docs/benchmarks/import_time.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "transformers.modeling_utils", "peft", "accelerate", "kernels")


def _loaded(code: str) -> dict[str, bool]:
    """Run `code` in a fresh interpreter; which of HEAVY it imported."""
    report = f"import json, sys; print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + "\n" + report], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _help(module: str, argv: list[str]) -> str:
    return f"""
        import contextlib, io
        from {module} import main
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main({argv!r})
            except SystemExit as stop:
                assert stop.code == 0, stop.code
    """


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["generate", "--help"], ["train", "--help"],
                                  ["serve", "--help"], ["chat", "--help"]])
def test_hwrun_help_imports_neither_torch_nor_transformers(argv):
    loaded = _loaded(_help("hwrun.cli.main", argv))
    assert not any(loaded.values()), {m: v for m, v in loaded.items() if v}


@pytest.mark.parametrize(("module", "argv"), [("hwenv.cli", ["doctor", "--help"]), ("hwenv.cli", ["--help"]),
                                              ("hwdist.cli", ["--help"])])
def test_hwenv_and_hwdist_help_import_no_torch(module, argv):
    loaded = _loaded(_help(module, argv))
    assert not any(loaded.values()), {m: v for m, v in loaded.items() if v}


def test_hwrun_plan_imports_no_transformers_and_no_modeling_code():
    # torch is imported by device detection (hwenv's probes); Transformers, its modeling code (5 s and more on a
    # 2-core host), PEFT, Accelerate and kernels are not needed to plan the shipped model
    loaded = _loaded("""
        import contextlib, io
        from hwrun.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["plan"]) == 0
        assert "torch threads" in out.getvalue() and "LlamaForCausalLM" in out.getvalue()
    """)
    assert {m for m, v in loaded.items() if v} <= {"torch"}


def test_the_thread_rule_is_one_function_for_serve_and_generate():
    from hwrun import devices
    from hwrun.cli import main as cli
    from hwrun.serve import config

    assert config.torch_threads_for is devices.torch_threads_for
    assert devices.torch_threads_for(False, 2, {}) == (1, "host with 2 cores: 1 for torch, one left to the server's "
                                                          "own threads")
    assert devices.torch_threads_for(False, 2, {}, beside="x")[1].endswith("one left to x")
    assert devices.torch_threads_for(True, 64, {})[0] == 1
    assert devices.torch_threads_for(False, 8, {"OMP_NUM_THREADS": "3"})[0] is None
    assert devices.torch_threads_for(False, 8, {}, given=5, option="--torch-threads") == (5, "given (--torch-threads)")
    assert "tokenizing, streaming" in cli.BESIDE


@pytest.fixture
def two_cores(monkeypatch):
    from hwrun import devices

    monkeypatch.setattr(devices, "host_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_plan_shows_the_thread_row_with_its_reason(two_cores, capsys):
    from hwrun.cli.main import main

    assert main(["plan"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("torch threads"))
    assert row.split()[2] == "1" and "host with 2 cores: 1 for torch" in row and "train and serve" in row
    assert main(["plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["torch_threads"]["value"] == "1" and "host with 2 cores" in data["torch_threads"]["reason"]


def test_generate_runs_with_the_rule_s_thread_count_and_gives_it_back(two_cores, monkeypatch, capsys):
    import torch
    from hwrun.cli.main import main
    from hwrun.inference import generate as generate_module

    seen = []
    real = generate_module.generate

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(generate_module, "generate", spy)
    before = torch.get_num_threads()
    assert main(["generate", "The king said", "--max-new-tokens", "3"]) == 0
    assert main(["generate", "The king said", "--max-new-tokens", "3", "--torch-threads", "2"]) == 0
    assert seen == [1, 2] and torch.get_num_threads() == before
    capsys.readouterr()


def test_generate_refuses_a_thread_count_below_one_before_loading(capsys):
    from hwrun.cli.main import main

    assert main(["generate", "x", "--torch-threads", "0"]) == 2
    assert "--torch-threads 0 must be an integer >= 1" in capsys.readouterr().err
