"""Tests that need a real accelerator (`gpu` marker): the platform layer, hwrun's decoders, hwdist and
hwcompile on the device this machine has. Skipped, with the reason, where only a CPU is here; run on
the lent H200 by `tools/run_gpu_tests.sh`, which records each run in docs/gpu-tests.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hwenv
import pytest
from gpu_marks import ACCEL, GPU_MARKS  # tests/gpu is on sys.path (conftest.py)

ROOT = Path(__file__).resolve().parents[2]


pytestmark = GPU_MARKS


def test_detected_platform_matches_the_torch_build():
    import torch

    expected = "rocm" if getattr(torch.version, "hip", None) else ACCEL.kind
    assert ACCEL.kind == expected and ACCEL.count >= 1 and ACCEL.names
    assert ACCEL.memory and ACCEL.memory_source.startswith(ACCEL.platform.memory_api or "?")
    report = hwenv.diagnose()
    assert report.accelerator.kind == ACCEL.kind and report.detection_error is None


def test_runtime_graph_capture_replays_like_eager():
    import torch
    from hwenv.platforms import runtime

    tools = runtime.graph_tools(ACCEL.platform)
    if tools is None:
        pytest.skip(f"{ACCEL.kind} has no CUDA/XPU-style graph API ({ACCEL.platform.graph_api})")
    device = torch.device(ACCEL.device)
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device)
    out = torch.empty(64, 64, device=device)
    side = tools.stream_class(device=device)
    side.wait_stream(tools.current_stream(device))
    with tools.use_stream(side):
        torch.matmul(x, w, out=out)  # warm-up outside capture
    tools.current_stream(device).wait_stream(side)
    graph = tools.graph_class()
    with tools.capture(graph):
        torch.matmul(x, w, out=out)
    x.copy_(torch.randn(64, 64, device=device))
    graph.replay()
    runtime.synchronize(ACCEL.platform, device)
    torch.testing.assert_close(out, x @ w)
    free, total = runtime.mem_get_info(ACCEL.platform, 0)
    assert 0 < free <= total


def _plan(**kwargs):
    import hwrun

    return hwrun.plan(device=ACCEL.kind, **kwargs)


def test_plan_names_the_device_and_its_graph_decoder():
    plan = _plan(compile=True)
    assert plan.device == ACCEL.device and plan.accelerator.name == ACCEL.name
    assert plan.dist_backend.name == ACCEL.platform.dist_backend


@pytest.mark.parametrize("prompts", [["The king said"], ["The king said", "Once upon a time", "In the beginning"]])
def test_graph_decode_tokens_equal_transformers_greedy(prompts):
    import hwrun

    plan = _plan(compile=True)
    model, tokenizer = hwrun.load(plan)
    ours = hwrun.generate(plan, prompts, max_new_tokens=24, decode="graphs", batching="static",
                          model=model, tokenizer=tokenizer)
    theirs = hwrun.generate(plan, prompts, max_new_tokens=24, decode="generate", batching="static",
                            model=model, tokenizer=tokenizer)
    assert ours.decode == "graphs" and theirs.decode == "generate"
    assert ours.token_ids == theirs.token_ids


def test_slot_decoder_tokens_equal_static_batching():
    import hwrun

    plan = _plan(compile=True)
    model, tokenizer = hwrun.load(plan)
    prompts = ["The king said", "Once upon a time there was", "In the beginning"]
    slots = hwrun.generate(plan, prompts, max_new_tokens=16, decode="graphs", batching="continuous",
                           model=model, tokenizer=tokenizer)
    static = hwrun.generate(plan, prompts, max_new_tokens=16, decode="generate", batching="static",
                            model=model, tokenizer=tokenizer)
    assert slots.batching == "continuous" and slots.decode == "graphs"
    assert slots.token_ids == static.token_ids


def test_transformers_continuous_batching_through_hwrun():
    """Issue 26 point 2: generate_batch used to crash here ('Inplace update to inference tensor outside InferenceMode')."""
    import hwrun

    plan = _plan()
    prompts = ["The king said", "Once upon a time there was", "In the beginning"]
    theirs = hwrun.generate(plan, prompts, max_new_tokens=16, decode="generate", batching="continuous")
    static = hwrun.generate(plan, prompts, max_new_tokens=16, decode="generate", batching="static")
    assert theirs.token_ids == static.token_ids


def test_hwcompile_compiles_on_the_device():
    import hwcompile
    import torch

    layer = torch.nn.Linear(32, 32, device=ACCEL.device)
    compiled = hwcompile.compile(layer, fullgraph=True)
    x = torch.randn(4, 32, device=ACCEL.device)
    torch.testing.assert_close(compiled(x), layer(x))


def test_hwdist_all_reduce_on_the_device_backend(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import hwdist, torch
        ctx = hwdist.init()
        t = torch.ones(1024, device=ctx.device) * (ctx.rank + 1)
        hwdist.all_reduce(t)
        print("backend", ctx.backend, "device", ctx.device, "sum", float(t[0]))
        hwdist.shutdown()
    """))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port",
                          "29541", str(script)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"backend {ACCEL.platform.dist_backend} device {ACCEL.device} sum 1.0" in out.stdout
