"""One decision, one engine (issue 35.1): the step kind, graph capture and row buckets of hwrun's engine are fields
of `DecodeDecision` with their reasons, and `generate()` and `hwrun serve` build their engine from them
(`engine_options`) instead of working them out again."""

from __future__ import annotations

import dataclasses

import hwenv
import hwrun
import pytest
from hwrun.inference import engine as engine_package
from hwrun.inference.decision import decide, decide_serving, planned, planned_serving
from hwrun.serve.config import ServeConfig

H100 = hwenv.Accelerator("cuda", 1, names=("NVIDIA H100 80GB HBM3",), memory=(80 * 2**30,))


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, tokenizer


class _Built(Exception):
    """Raised by the recording engine once it has the keywords it was built with."""


def _recording_engine(seen: list[dict]):
    class Recording:
        def __init__(self, model, **kwargs):
            seen.append(kwargs)
            raise _Built

    return Recording


@pytest.mark.parametrize("compile", [False, True])
def test_generate_and_serve_build_the_same_engine_from_one_plan(loaded, monkeypatch, tmp_path, compile):
    """The same plan and the same slots give `decide()` (generate) and `decide_serving()` (serve) the same engine
    options, and each caller builds `EngineCore` with exactly those (no step, graphs or buckets of its own)."""
    from hwrun.inference.generate import _engine
    from hwrun.serve.startup import _slots_backend

    model, tokenizer = loaded
    plan = hwrun.plan(device=H100, compile=compile)
    ours = decide(plan, model, n_prompts=4, needed=64)
    theirs = decide_serving(plan, model, slots=4, max_cache_len=256)
    assert ours.runner == "engine" and theirs.engine == "slots"
    assert ours.engine_options() == theirs.engine_options()
    assert ours.buckets == ((1, 4) if compile else None)
    seen: list[dict] = []
    monkeypatch.setattr(engine_package, "EngineCore", _recording_engine(seen))
    monkeypatch.setattr(model, "_hwrun_decoders", {}, raising=False)
    with pytest.raises(_Built):
        _engine(plan, ours, model, tokenizer, ["a b", "c", "d e f", "g"], 8)
    with pytest.raises(_Built):
        _slots_backend(plan, model, ServeConfig(max_concurrency=4), theirs, 256)
    picked = [{name: kwargs[name] for name in ours.engine_options()} for kwargs in seen]
    assert picked == [ours.engine_options(), theirs.engine_options()]


def test_step_is_the_model_forward_under_tensor_parallel_for_both_callers():
    plan = dataclasses.replace(hwrun.plan(device=H100), tp=2)
    generate_side, serve_side = planned(plan, 64), planned_serving(plan, slots=64)
    for decision in (generate_side, serve_side):
        assert decision.step == "model" and "tensor parallel (tp=2)" in decision.step_reason
        assert "fused step reads whole weights" in decision.step_reason
    single = planned(hwrun.plan(device=H100), 64)
    assert single.step == "auto" and "fused Llama-family step where it applies" in single.step_reason


def test_adapters_run_the_model_step_eagerly_and_say_why():
    decision = planned_serving(hwrun.plan(device=H100), adapters=2, slots=8)
    assert (decision.step, decision.use_graphs) == ("model", False)
    assert "2 LoRA adapter(s) per request" in decision.step_reason
    assert decision.graphs_reason.startswith("eager steps: 2 LoRA adapter(s)")


def test_use_graphs_follows_the_platform_graph_api():
    cuda = planned(hwrun.plan(device=H100), 64)
    assert cuda.use_graphs is None and "captured as one CUDA graph" in cuda.graphs_reason
    cpu = planned(hwrun.plan(device="cpu"), 1, decode="graphs")
    assert cpu.use_graphs is False
    assert "eager steps: cpu has no CUDA, XPU or HPU graphs (graph API: none)" in cpu.graphs_reason


def test_buckets_are_few_when_compiled_and_every_power_of_two_otherwise():
    compiled = planned(hwrun.plan(device=H100, compile=True), 64)
    assert compiled.slots == 64 and compiled.buckets == (1, 8, 64)
    assert "steps over 1, 8, 64 of 64 rows: each bucket is compiled once at start" in compiled.buckets_reason
    plain = planned(hwrun.plan(device=H100), 64)
    assert plain.buckets is None
    assert "steps over 1, 2, 4, 8, 16, 32, 64 of 64 rows: every power of two" in plain.buckets_reason
    served = planned_serving(hwrun.plan(device=H100, compile=True), slots=32)
    assert served.buckets == (1, 8, 32)


def test_only_the_engine_has_slots_and_buckets():
    one = planned(hwrun.plan(device=H100, compile=True), 1)  # one prompt: the static graph decoder
    assert one.runner == "static_graphs" and (one.slots, one.buckets, one.buckets_reason) == (None, None, "")
    theirs = planned(hwrun.plan(device="cpu"), 64)  # Transformers' generate_batch
    assert theirs.decode == "generate" and theirs.use_graphs is False and theirs.slots is None
    assert "Transformers' loop" in theirs.graphs_reason


@pytest.mark.parametrize("method", ["awq", "compressed-tensors"])
def test_pre_quantized_weights_run_the_model_step_eagerly_uncompiled(method):
    """Another library's pre-quantized layers (`engine.quantized.eager_reason`): the model step, no graphs and no
    compile, for generate and serve alike, with the reason (the static decoder would otherwise capture them)."""
    plan = dataclasses.replace(hwrun.plan(device=H100, compile=True), quantization=method)
    asked = (planned(plan, 1, decode="graphs"), planned(plan, 64, decode="graphs"), planned_serving(plan, slots=8))
    for decision in asked:
        assert decision.decode == "graphs", decision.reason
        assert (decision.step, decision.use_graphs, decision.compile_backend) == ("model", False, None)
        assert decision.step_reason.startswith(f"{method} weights run the model's own forward, eagerly")
        assert decision.compile_reason.startswith(f"not compiled: {method} weights")
        # the reason never claims a graph replay these steps do not make
        assert "replay" not in decision.reason or "no graph is captured: eager steps" in decision.reason
    assert planned(plan, 64, decode="graphs").buckets is None  # not compiled: every power of two


@pytest.mark.parametrize("method", ["awq", "compressed-tensors"])
def test_decode_auto_leaves_pre_quantized_weights_to_transformers_where_graphs_gain_nothing(method):
    """On a platform with graphs, hwrun's loops would step eagerly over these layers: decode='auto' keeps
    Transformers' loop (an untried eager engine path on a GPU buys nothing), saying why; decode='graphs' still runs
    them; an explicit continuous batch Transformers' generate_batch refuses goes to hwrun's engine, eagerly."""
    plan = dataclasses.replace(hwrun.plan(device=H100), quantization=method)
    for n in (1, 64):
        decision = planned(plan, n)
        assert decision.decode == "generate" and decision.use_graphs is False
        assert "would run eager steps over these weights" in decision.reason and "decode='graphs'" in decision.reason
    continuous = planned(plan, 64, batching="continuous")
    assert (continuous.batching, continuous.decode, continuous.use_graphs) == ("continuous", "graphs", False)
    assert "eager over these weights" in continuous.reason and "generate_batch cannot run here" in continuous.reason
