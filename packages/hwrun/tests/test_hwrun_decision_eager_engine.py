"""`batching="continuous"` on a platform without graphs where Transformers' `generate_batch` refuses the plan
(quantized weights) but hwrun's engine runs it: the one decision picks the engine with eager steps, as `hwrun serve
--engine auto` does there, instead of refusing (`decision._eager_engine_instead`)."""
from __future__ import annotations

import importlib.util

import hwrun
import pytest
from hwrun.errors import GenerateError
from hwrun.inference.decision import planned
from hwrun.testing import build_tiny_model

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
PROMPTS = ["the cat", "a dog and", "once upon a time"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-eager-engine")))


@needs_torchao
def test_continuous_on_the_cpu_with_torchao_weights_plans_hwruns_engine_eagerly(tiny):
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    decision = planned(plan, 3, batching="continuous")
    assert (decision.batching, decision.decode) == ("continuous", "graphs")
    assert "eager steps" in decision.reason and "generate_batch cannot run here" in decision.reason
    assert "int8-weight-only" in decision.reason  # Transformers' own limit is named
    assert decision.use_graphs is False and decision.compile_backend is None
    # auto batching keeps its rule (one static batch through model.generate), and plain weights keep generate_batch
    assert planned(plan, 3).batching == "static"
    plain = planned(hwrun.plan(tiny, device="cpu"), 3, batching="continuous")
    assert plain.decode == "generate" and "generate_batch" in plain.reason


@needs_torchao
def test_continuous_on_the_cpu_with_torchao_weights_gives_the_static_loops_tokens(tiny):
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    model, tokenizer = hwrun.load(plan)
    want = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, batching="static")
    got = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, batching="continuous")
    assert (got.batching, got.decode) == ("continuous", "graphs"), got.decode_reason
    assert got.token_ids == want.token_ids


def test_a_plan_hwruns_engine_cannot_run_either_is_still_refused(tiny, monkeypatch):
    """Both runners blocked (here: bitsandbytes-style plan blockers for hwrun's loops too): the request is refused
    naming Transformers' limit, before load."""
    plan = hwrun.plan(tiny, device="cpu", quantization="int8-weight-only")
    monkeypatch.setattr("hwrun.inference.decision._plan_blockers", lambda plan: ["hwrun's loops cannot (test)"])
    with pytest.raises(GenerateError, match="batching='continuous' cannot run here: .*int8-weight-only"):
        planned(plan, 3, batching="continuous")
