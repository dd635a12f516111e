"""compile="auto" (issue 38.1b/1d): hwrun's step is captured without Inductor where compiling does not pay for the
run, compiled where it does, from measured costs (`compile_costs.COMPILE_COSTS`: tokens x (eager step - compiled step)
against the compile's cost), and the reason gives the figures and their source; devices, models or batches without
measured figures say so and keep the default (no compile unless asked)."""

from __future__ import annotations

import dataclasses
import json
import math

import hwenv
import hwrun
import pytest
from hwrun.errors import GenerateError
from hwrun.inference.compile_costs import COMPILE_COSTS, CompileCost, compile_pays
from hwrun.inference.decision import planned

LLAMA_1B = 2_471_629_056  # the benchmarks' random 1.24B Llama in bf16


def _plan(name: str, *, compile: bool = False, weight_bytes: int = LLAMA_1B):
    plan = hwrun.plan(device=hwenv.Accelerator("cuda", 1, names=(name,), memory=(80 * 2**30,)), compile=compile)
    return dataclasses.replace(plan, weight_bytes=weight_bytes)


def test_a_short_h100_run_keeps_the_captured_eager_step_and_says_why():
    pays, why = compile_pays(_plan("NVIDIA H100 80GB HBM3"), 256, 1)
    assert pays is False
    assert why == ("captured eager step: 256 tokens save ~0.29 s against ~121 s of compile (H100, batch 1: eager "
                   "step 410, compiled 768 tokens/s, cold cache; no warm-cache compile measured; "
                   "docs/benchmarks/quantization.md 2026-12-06)")


def test_the_break_even_is_tokens_times_the_step_saving_against_the_compile():
    row = next(r for r in COMPILE_COSTS if r.device == "H100" and r.batch == 1)
    even = row.compile_s / (1 / row.eager_tps - 1 / row.compiled_tps)  # ~107,000 tokens at batch 1
    plan = _plan("NVIDIA H100 80GB HBM3")
    assert compile_pays(plan, math.floor(even), 1)[0] is False
    pays, why = compile_pays(plan, math.ceil(even) + 1, 1)
    assert pays is True and why.startswith(f"compiled step: {math.ceil(even) + 1:,} tokens save ~1.2e+02 s")


def test_where_the_compiled_step_measured_slower_compile_never_pays():
    pays, why = compile_pays(_plan("NVIDIA H100 80GB HBM3"), 10**9, 64)
    assert pays is False and "the compiled step measured slower (8,282 vs 14,287 tokens/s)" in why


def test_a_warm_cache_lowers_the_cost_where_it_was_measured(tmp_path, monkeypatch):
    costs = (CompileCost("H100", "bfloat16", LLAMA_1B, 1, 400.0, 800.0, 100.0, 10.0, "a test row"),)
    plan = _plan("NVIDIA H100 80GB HBM3")
    tokens = 10_000  # saves 12.5 s: more than a warm compile (10 s), less than a cold one (100 s)
    assert compile_pays(plan, tokens, 1, cache_warm=False, costs=costs)[0] is False
    pays, why = compile_pays(plan, tokens, 1, cache_warm=True, costs=costs)
    assert pays is True and "against ~10 s of compile" in why and "warm cache" in why
    monkeypatch.setenv("HWSTACK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_pays(plan, tokens, 1, costs=costs)[0] is False  # looked up: the folder holds nothing yet
    import torch
    from hwcompile.cache import compile_cache_dir

    (compile_cache_dir(torch.__version__) / "fxgraph" / "ab").mkdir(parents=True)
    assert compile_pays(plan, tokens, 1, costs=costs)[0] is True


@pytest.mark.parametrize("plan_of, words", [
    (lambda: _plan("NVIDIA A100-SXM4-80GB"), "NVIDIA A100-SXM4-80GB, bfloat16, 2.47 GB of weights, batch 1"),
    (lambda: _plan("NVIDIA H100 80GB HBM3", weight_bytes=16 * 10**9), "NVIDIA H100 80GB HBM3, bfloat16, 16.00 GB of weights"),
    (lambda: hwrun.plan(device="cpu"), "CPU, float32"),
])
def test_devices_and_models_without_measured_figures_say_so_and_keep_the_default(plan_of, words):
    plan = plan_of()
    pays, why = compile_pays(plan, 10**7, 1)
    assert pays is None and why.startswith(f"no measured compile costs for {words}")
    assert "(measured: H100 bfloat16, 2.47 GB of weights, batch 1, 64; H200 bfloat16" in why
    assert why.endswith("compile stays off unless asked (compile=True, --compile)")
    decision = planned(plan, 1, decode="graphs", max_new_tokens=10**4)
    assert decision.compile_backend is None and decision.compile_reason == why.replace("10,000,000", "10,000")


def test_planned_compiles_a_long_run_where_it_pays_and_not_a_short_one():
    plan = _plan("NVIDIA H200")  # H200 batch 1: 452 -> 828 tokens/s for ~26 s of compile, ~26,000 tokens
    short = planned(plan, 1, max_new_tokens=256)
    assert short.compile_backend is None
    assert short.reason.startswith("CUDA (compile off: the eager step captured as one graph")
    assert "captured eager step: 256 tokens save ~0.26 s against ~26 s of compile (H200" in short.reason
    long = planned(plan, 1, max_new_tokens=30_000)
    assert long.compile_backend == "inductor" and long.buckets is None
    assert long.reason.startswith("CUDA (compile on: compiled step: 30,000 tokens save ~30 s against ~26 s of "
                                  "compile (H200, batch 1")
    assert "docs/benchmarks/decode.md 2026-12-03" in long.compile_reason


def test_given_compile_wins_over_the_rule():
    compiled_plan = _plan("NVIDIA H100 80GB HBM3", compile=True)
    assert planned(compiled_plan, 1).compile_backend == "inductor"
    assert planned(compiled_plan, 1).compile_reason == "the plan compiles (inductor)"
    off = planned(compiled_plan, 1, compile=False)
    assert off.compile_backend is None and off.compile_reason == "given: compile=False (the plan's backend not used)"
    on = planned(_plan("NVIDIA H100 80GB HBM3"), 64, compile=True)
    assert on.compile_backend == "inductor" and on.buckets == (1, 8, 64)
    assert on.compile_reason == "given: compile=True (inductor)"


@pytest.mark.parametrize("value", ["maybe", 1, 0.0, None])
def test_a_compile_value_that_is_no_choice_is_refused_before_load(value, monkeypatch):
    monkeypatch.setattr("hwrun.model.load.load", lambda plan: pytest.fail("the model loaded"))
    with pytest.raises(GenerateError, match=rf"compile={value!r} is not a compile choice; use 'auto'"):
        hwrun.generate(_plan("NVIDIA H100 80GB HBM3"), "The king said", 4, compile=value)


def test_generate_reports_the_compile_reason():
    plan = hwrun.plan(device="cpu")
    result = hwrun.generate(plan, "The king said", 3, decode="graphs")
    assert result.compile_reason.startswith("no measured compile costs for CPU, float32")
    assert hwrun.generate(plan, "The king said", 3).compile_reason == ""  # Transformers' loop: nothing compiled


def test_hwrun_plan_rows_carry_the_compile_reason(capsys, fake_cuda):
    from hwrun.cli.main import main

    fake_cuda(1, name="NVIDIA H100 80GB HBM3")
    assert main(["plan", "--json"]) == 0
    decode = json.loads(capsys.readouterr().out)["decode"]
    one = decode["decode (1 prompt)"]["reason"]
    assert "compile off: the eager step captured as one graph" in one
    assert "no measured compile costs for NVIDIA H100 80GB HBM3, bfloat16" in one  # the shipped tiny model


def test_compile_true_on_gaudi_lazy_mode_is_dropped_with_the_reason_as_a_plan_compile_is():
    """compile=True without a plan compile goes through the same lazy-mode check as the plan's compile (G2): in
    lazy mode torch.compile is refused, so the step is not compiled and the reason says so; eager mode compiles.
    Source: ../shared/INTEL.md "Lazy vs eager" (S12, the Gaudi support matrix; S8, gaudi-pytorch-bridge 1.19):
    `hpu_backend` and `eager` compile in eager mode, no compile in lazy mode; the mode as the bridge decides it
    (`hwenv.gaudi.execution_mode`) is hwcompile's `check_compile_mode`, tested in test_hwcompile_mode.py (G2)."""
    from hwenv.testing import fake_gaudi

    accel = hwenv.Accelerator("hpu", 1, names=("GAUDI2",))
    with fake_gaudi(1, lazy_mode="1"):
        lazy = planned(hwrun.plan(device=accel), 4, decode="graphs", compile=True)
        assert lazy.compile_backend is None
        assert "not compiled (lazy mode)" in lazy.compile_reason
    with fake_gaudi(1, lazy_mode="0"):
        eager = planned(hwrun.plan(device=accel), 4, decode="graphs", compile=True)
        assert eager.compile_backend == "hpu_backend"


@pytest.mark.parametrize("value", ["bogus", 0.0, 1])
def test_a_bad_compile_value_is_refused_on_every_path_before_load(value):
    """Checked once at the top of planned(): Transformers' loop (CPU) and tensor-parallel plans refuse it too."""
    with pytest.raises(GenerateError, match=r"compile=.* is not a compile choice"):
        planned(hwrun.plan(device="cpu"), 1, compile=value)
    tp = dataclasses.replace(_plan("NVIDIA H100 80GB HBM3", compile=True), tp=2)
    with pytest.raises(GenerateError, match=r"compile=.* is not a compile choice"):
        planned(tp, 4, compile=value)


def test_tensor_parallel_honours_compile_false_and_true():
    tp = dataclasses.replace(_plan("NVIDIA H100 80GB HBM3", compile=True), tp=2)
    assert planned(tp, 4).compile_backend == "inductor"  # the plan's compile
    assert planned(tp, 4, compile=False).compile_backend is None
    plain = dataclasses.replace(_plan("NVIDIA H100 80GB HBM3"), tp=2)
    assert planned(plain, 4).compile_backend is None and planned(plain, 4, compile=True).compile_backend == "inductor"


def test_a_bad_compile_cache_switch_is_refused_before_load_where_the_step_compiles(monkeypatch):
    import hwcompile

    monkeypatch.setenv("HWSTACK_COMPILE_CACHE", "maybe")
    with pytest.raises(hwcompile.CompileArgumentError, match="HWSTACK_COMPILE_CACHE='maybe' is neither on nor off"):
        planned(_plan("NVIDIA H100 80GB HBM3", compile=True), 1)
    assert planned(hwrun.plan(device="cpu"), 1).compile_backend is None  # nothing compiles: not asked


def test_compile_autos_reason_is_logged_once_per_run_by_decide(caplog):
    """planned() (before load) and decide() (after) both weigh compile='auto'; the outcome is logged once, in
    decide()'s decision line, not at every weighing."""
    import logging

    from hwrun.inference.decision import decide

    model, _ = hwrun.load(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))
    plan = _plan("NVIDIA H100 80GB HBM3")
    with caplog.at_level(logging.INFO, logger="hwrun.inference.decision"):
        before = planned(plan, 1, max_new_tokens=256)
        decision = decide(plan, model, n_prompts=1, needed=300, before=before, max_new_tokens=256)
    assert decision.decode == "graphs" and decision.compile_backend is None
    lines = [r.getMessage() for r in caplog.records if "captured eager step: 256 tokens" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("batching: static"), lines
