"""`hwrun plan` shows serve's engine decision too (issue 35.1 "plan shows it"): `planned_serving` is
`decide_serving`'s rule before load, shown as a row and under `serve` in `plan --json`."""

from __future__ import annotations

import json
import re

import hwenv
import hwrun
import pytest
from hwrun.cli.main import main
from hwrun.inference.decision import AFTER_LOAD, decide_serving, planned_serving

H100 = hwenv.Accelerator("cuda", 1, names=("NVIDIA H100 80GB HBM3",), memory=(80 * 2**30,))


def test_plan_shows_the_serving_engine_on_cpu_and_cuda(capsys, fake_cuda):
    assert main(["plan", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^serve \(--max-concurrency 32\)\s+Transformers' continuous batching\s+Transformers' "
                     r"continuous batching \(paged cache\); cpu has no CUDA or XPU graphs", out, re.M), out
    fake_cuda(1)
    assert main(["plan", "--compile", "--json"]) == 0
    serve = json.loads(capsys.readouterr().out)["serve"]
    assert serve["value"] == "hwrun's engine (slots)"
    assert serve["reason"].startswith("CUDA: hwrun's engine, one CUDA graph replay per step over cache slots")
    assert "row buckets: steps over 1, 8, 32 of 32 rows: each bucket is compiled once at start" in serve["reason"]


def test_plan_shows_a_refused_server_with_its_reason(capsys):
    assert main(["plan", "--device", "cpu", "--quantization", "8bit", "--json"]) == 0
    serve = json.loads(capsys.readouterr().out)["serve"]
    assert serve["value"] == "refused"
    assert serve["reason"].startswith("no engine can serve this model: hwrun's engine: bitsandbytes 8-bit")


@pytest.mark.parametrize("device, compile", [(H100, True), (H100, False), ("cpu", False)])
def test_planned_serving_is_decide_servings_rule_before_load(device, compile):
    """Before load the model's steps are assumed to run: the engine and everything it is built with are the ones
    `decide_serving` picks for a model they do run; only the step note differs."""
    plan = hwrun.plan(device=device, compile=compile)
    model, _ = hwrun.load(hwrun.plan(device="cpu"))
    before, after = planned_serving(plan, slots=16), decide_serving(plan, model, slots=16, max_cache_len=256)
    assert before.engine == after.engine and before.engine_options() == after.engine_options()
    assert (before.step_reason, before.graphs_reason, before.buckets_reason) == (
        after.step_reason, after.graphs_reason, after.buckets_reason)
    if before.engine == "slots":
        assert before.reason.endswith(f"step: {AFTER_LOAD}") and "step: the fused" in after.reason
    else:
        assert before.reason == after.reason
