"""tools/carry_wheels.py --check (the benchmarks' imports against the carried wheels and the GPU image) and
tools/bench/bench_record.py (USE_HUB_KERNELS for Transformers' side, the record each run's JSON carries)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


carry = _load("carry_wheels_under_test", ROOT / "tools" / "carry_wheels.py")
record = _load("bench_record_under_test", ROOT / "tools" / "bench" / "bench_record.py")


def _lock():
    return carry.locked_packages(ROOT / "uv.lock")


def test_imports_of_tells_guarded_imports_from_required_ones(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(
        "import json\nimport numpy as np\nfrom openai.types import Completion\n"
        "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\n"
        "def main():\n    import zmq\n    try:\n        import zmq.asyncio\n    except (OSError, RuntimeError):\n"
        "        pass\n"
        "from . import sibling\n")
    assert carry.imports_of(script) == {"json": False, "numpy": False, "openai": False, "flash_attn": True,
                                        "zmq": False}


def test_check_flags_a_third_party_import_neither_carried_nor_in_the_image(tmp_path):
    (tmp_path / "helper.py").write_text("import os\n")
    (tmp_path / "mybench.py").write_text(
        "import helper\nimport hwrun\nimport openai\nimport zmq\nimport matplotlib\nimport not_a_real_wheel\n"
        "try:\n    import also_not_real\nexcept ModuleNotFoundError:\n    pass\n")
    rows = {r["module"]: r for r in carry.check_benches(tmp_path, _lock())}
    assert "helper" not in rows and "hwrun" not in rows and "os" not in rows  # local, workspace, stdlib
    assert rows["openai"]["status"] == "carried" and rows["zmq"]["distribution"] == "pyzmq"
    assert rows["zmq"]["status"] == "carried" and rows["matplotlib"]["status"] == "image"
    assert rows["not_a_real_wheel"]["status"] == "missing" and not rows["not_a_real_wheel"]["optional"]
    assert rows["also_not_real"]["status"] == "missing" and rows["also_not_real"]["optional"]
    assert carry.main(["--check", "--benches", str(tmp_path)]) == 1


def test_a_benchmarks_extra_counts_only_for_that_benchmark(tmp_path):
    (tmp_path / "quantization.py").write_text("import torchao\n")
    (tmp_path / "other.py").write_text("import torchao\n")
    rows = {r["bench"]: r for r in carry.check_benches(tmp_path, _lock())}
    assert rows["quantization.py"]["status"] == "carried" and rows["quantization.py"]["with_bench"]
    assert rows["other.py"]["status"] == "missing"


def test_the_benchmarks_as_they_are_pass_the_check_and_carry_what_openai_needs():
    assert carry.main(["--check"]) == 0
    carried = carry.to_carry(carry.closure(_lock(), carry.ROOTS))
    assert {"openai", "annotated-types", "pydantic", "pydantic-core", "typing-inspection"} <= set(carried)
    every = carry.ROOTS + tuple(n for names in carry.BENCH_EXTRAS.values() for n in names)
    assert carry.closure_gaps(_lock(), every) == []


def test_offline_transformers_sets_use_hub_kernels_without_overriding(monkeypatch):
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    env = record.offline_transformers({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "USE_HUB_KERNELS": "NO"}
    assert record.offline_transformers({"USE_HUB_KERNELS": "1"})["USE_HUB_KERNELS"] == "1"  # the caller's wins
    record.offline_transformers()
    assert os.environ["USE_HUB_KERNELS"] == "NO"


def test_stamp_adds_command_date_device_and_versions_keeping_the_benchs_own_keys(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tools/bench/x.py", "--out", "ignored"])
    result = record.stamp({"device": "cuda", "rows": []}, ["--out", "D", "--smoke"], libraries=("peft",),
                          accelerator=False)
    assert result["device"] == "cuda" and result["rows"] == []
    assert result["command"] == [sys.executable, "tools/bench/x.py", "--out", "D", "--smoke"]
    assert result["date"].endswith("+00:00") and result["date"][:4].isdigit()
    assert result["device_info"]["kind"] == "cpu"
    assert {"python", "torch", "transformers", "hwrun", "peft"} <= set(result["versions"])
    assert result["versions"]["torch"]  # installed here


def test_probe_lists_the_required_imports_this_python_cannot_find(tmp_path):
    script = tmp_path / "quantization.py"
    script.write_text("import json\nimport torch\nimport not_a_real_wheel\ntry:\n    import also_not_real\n"
                      "except ImportError:\n    pass\n")
    assert carry.probe([script]) == ["not_a_real_wheel"]
    assert carry.main(["--probe", str(script)]) == 1


def test_stamp_fills_a_benchs_own_versions_without_replacing_them():
    result = record.stamp({"versions": {"torch": "as the bench saw it"}}, [], libraries=("openai",),
                          accelerator=False)
    assert result["versions"]["torch"] == "as the bench saw it"
    assert {"transformers", "hwrun", "openai", "python"} <= set(result["versions"])


def test_the_serve_benchs_warm_up_prompts_share_no_prefix_with_the_measured_ones():
    """The warm-up burst used the level's own first prompts, so with a prefix cache every measured request continued
    a cached prefix (hwrun's TTFT then measured its cache, not its prefill); the warm-up prompts now lead elsewhere."""
    bench = str(ROOT / "tools" / "bench")
    sys.path.insert(0, bench)  # serve.py imports its sibling bench_record
    try:
        serve = _load("serve_bench_under_test", ROOT / "tools" / "bench" / "serve.py")
    finally:
        sys.path.remove(bench)
    warmup_prompt = serve.warmup_prompt
    for prompt, _ in serve.workload(0, 32, (64, 512), (128, 512)):
        warm = warmup_prompt(prompt)
        assert len(warm.split()) == len(prompt.split())
        assert warm.split()[:8] != prompt.split()[:8]
    assert warmup_prompt("Hello") == "Before Hello"


def _serve_bench():
    bench = str(ROOT / "tools" / "bench")
    sys.path.insert(0, bench)  # serve.py imports its sibling bench_record
    try:
        return _load("serve_bench_mix_under_test", ROOT / "tools" / "bench" / "serve.py")
    finally:
        sys.path.remove(bench)


def test_the_serve_benchs_long_prompt_mix_gives_every_second_request_a_long_prompt():
    """Issue 35's long-prompt mix: half the requests (the odd ones) carry ~2,000-word prompts, the rest the usual
    64-512 words; the same seed gives the same requests, and without the mix no prompt is long."""
    serve = _serve_bench()
    mixed = serve.workload(3, 16, (64, 512), (128, 512), (1900, 2000))
    lengths = [len(prompt.split()) for prompt, _ in mixed]
    assert all(1900 <= n <= 2000 for n in lengths[1::2])
    assert all(64 <= n <= 512 for n in lengths[0::2])
    assert mixed == serve.workload(3, 16, (64, 512), (128, 512), (1900, 2000))
    assert all(len(p.split()) <= 512 for p, _ in serve.workload(3, 16, (64, 512), (128, 512)))


def test_the_serve_bench_refuses_a_malformed_long_prompt_range(tmp_path, capsys):
    serve = _serve_bench()
    for bad in ("2000,1900", "many"):
        try:
            serve.main(["--out", str(tmp_path), "--smoke", "--long-prompt-mix", "--long-prompt-words", bad])
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"--long-prompt-words {bad} was accepted")
        assert bad in capsys.readouterr().err


def _train_bench():
    bench = str(ROOT / "tools" / "bench")
    sys.path.insert(0, bench)  # train.py imports its sibling bench_record
    try:
        return _load("train_bench_under_test", ROOT / "tools" / "bench" / "train.py")
    finally:
        sys.path.remove(bench)


@pytest.mark.slow
def test_the_train_bench_measures_full_fine_tuning_beside_the_plain_trainer(tmp_path):
    """Issue 38.3 "full fine-tune measured too": the train bench's CPU smoke runs the plain Trainer's full fine-tune
    (bf16, eager and compiled) and hwrun.train without LoRA on the same data, each with tokens/s, and compares
    hwrun_full with the better plain full row only (never with a LoRA row)."""
    import json

    train = _train_bench()
    rows = ("plain_full_bf16", "plain_full_bf16_compile", "hwrun_full")
    assert set(rows) <= set(train.CONFIGS)
    assert train.main(["--out", str(tmp_path), "--smoke", "--configs", ",".join(rows)]) == 0
    written = json.loads((tmp_path / "train.json").read_text())
    results = {r["config"]: r for r in written["results"]}
    assert set(results) == set(rows)
    for name in rows:
        assert results[name]["tokens_per_s"] > 0, results[name]
        assert results[name]["decisions"]["fine_tune"] == "full"
    assert results["plain_full_bf16"]["decisions"]["weights"] == "float32"  # the same master weights as hwrun's
    assert results["plain_full_bf16_compile"]["decisions"]["torch_compile"] is True
    assert "full fine-tuning" in results["hwrun_full"]["decisions"]["model"]
    assert "lora" not in results["hwrun_full"]["decisions"]
    ratios = written["ratios"]
    assert ratios["best_plain_full"] in rows[:2] and ratios["hwrun_full_vs_best_plain_full"] > 0
    assert "hwrun_vs_best_plain" not in ratios  # no LoRA row ran: no LoRA ratio made of full rows
    assert {"command", "date", "versions", "git"} <= set(written["meta"])
    table = (tmp_path / "train.md").read_text()
    assert all(f"| {name} |" in table for name in rows) and "hwrun_full / best plain full" in table
    assert (tmp_path / "train.png").exists()


def _profile_decoders_bench():
    bench = str(ROOT / "tools" / "bench")
    sys.path.insert(0, bench)  # profile_decoders.py imports its siblings bench_record and decode
    try:
        return _load("profile_decoders_under_test", ROOT / "tools" / "bench" / "profile_decoders.py")
    finally:
        sys.path.remove(bench)


def test_profile_decoders_json_carries_the_stamp_like_every_bench(monkeypatch, capsys):
    """Issue 38.4: profile_decoders.py wrote its step times with no command, date, device, versions or git; its JSON
    now starts from bench_record.stamp's record. The bench is CUDA-only: without CUDA it says so and exits 2."""
    profile = _profile_decoders_bench()
    args = profile.parse(["--out", "D", "--batch", "8", "--compile", "none"])
    result = profile.run_record(args, ["--out", "D", "--batch", "8", "--compile", "none"], "NVIDIA H100 80GB HBM3")
    assert {"command", "date", "device_info", "versions", "git", "host", "env"} <= set(result)
    assert result["command"][-6:] == ["--out", "D", "--batch", "8", "--compile", "none"]
    assert result["date"].endswith("+00:00")
    assert result["device"] == "NVIDIA H100 80GB HBM3" and result["batch"] == 8 and result["compile"] == "none"
    assert {"python", "torch", "transformers", "hwrun", "hwenv"} <= set(result["versions"])
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profile.main(["--out", "D"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_the_quantization_bench_smoke_writes_its_json_with_agreement_per_method(tmp_path):
    """tools/bench/quantization.py --smoke (tiny sizes on the CPU, ~10 s): the JSON the GPU runs fill, with every
    method's argmax agreement against float32 on both models, a speed row per method and batch, ratios to bf16, the
    report and the plot. bf16 against float32 agrees fully; int8 weight-only stays close on the trained tiny model."""
    import json
    import subprocess

    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao not installed: the bench's int8/int4 rows need it")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "quantization.py"), "--out", str(tmp_path),
                           "--smoke"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((tmp_path / "quantization.json").read_text())
    methods = ("bf16", "int8-weight-only", "int4-weight-only")
    assert written["smoke"] is True and written["kind"] == "cpu"
    assert {"command", "date", "versions", "git", "torchao", "elapsed_s"} <= set(written)
    for label in ("tiny_trained_quality", "quality"):
        quality = written[label]
        assert quality["float32_perplexity"] > 0 and quality["parameters"] > 0
        for method in methods:
            entry = quality[method]
            assert "error" not in entry, entry
            assert 0.0 <= entry["argmax_agreement"] <= 1.0 and 0.0 <= entry["text_argmax_agreement"] <= 1.0
            assert entry["perplexity"] > 0 and entry["reason"]
        assert quality["bf16"]["argmax_agreement"] == 1.0  # the smoke loads bf16 in float32 on the CPU
        assert quality["int8-weight-only"]["lm_head"] == {"weight": "Int8Tensor", "dtype": "float32", "tied": False}
        assert quality["int4-weight-only"]["lm_head"]["weight"] == "Int4OpaqueTensor"
    assert written["tiny_trained_quality"]["int8-weight-only"]["argmax_agreement"] >= 0.9
    rows = written["rows"]
    assert {(r["method"], r["batch"]) for r in rows} == {(m, b) for m in methods for b in (1, 4)}
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] > 0 for r in rows if "error" not in r), rows
    assert {r["method"] for r in written["ratios"]} == set(methods[1:])
    assert all(r["vs_bf16"] > 0 for r in written["ratios"])
    assert (tmp_path / "quantization.md").exists() and (tmp_path / "quantization.png").exists()
