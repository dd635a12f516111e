"""The engine's Triton paged-attention decode kernel on a real CUDA GPU (`gpu` marker; issues 35, 38): in bf16 it
equals attention over the gathered blocks in one split, in the split count it chooses (3 on an H100 at these shapes)
and in 2 and 8 splits, and the engine's fused step with `paged_attention="triton"`, compiled by Inductor and captured
as CUDA graphs, gives the gather path's greedy tokens in float32 (its rows split in two: 96 positions, two tiles). The
CPU twin runs the same checks under Triton's interpreter (packages/hwrun/tests/test_hwrun_engine_paged_attention.py).
The split version (issue 38) is written 2026-12-06 without a GPU: not yet run here (the first, unsplit kernel's
tests ran on an H200 at 20:19, docs/gpu-tests.md)."""

from __future__ import annotations

import importlib.util

import pytest
from gpu_marks import ACCEL, GPU_MARKS  # tests/gpu is on sys.path (conftest.py)

pytestmark = [*GPU_MARKS,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed"),
              pytest.mark.skipif(ACCEL is None or ACCEL.kind != "cuda", reason="the kernel is compiled for CUDA here")]


def test_the_kernel_equals_attention_over_gathered_blocks_in_bf16():
    import torch
    from hwrun.inference.decode.paged_attention import paged_decode_attention

    torch.manual_seed(0)
    kv, blocks, size, dim, heads, rows, per_row = 8, 600, 16, 64, 32, 64, 32
    keys = torch.randn(kv, blocks, size, dim, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(kv, blocks, size, dim, device="cuda", dtype=torch.bfloat16)
    table = torch.stack([torch.randperm(blocks, device="cuda")[:per_row] for _ in range(rows)])
    positions = torch.randint(0, per_row * size, (rows,), device="cuda")
    positions[0] = 0  # a length of 1
    q = torch.randn(rows, heads, dim, device="cuda", dtype=torch.bfloat16)
    gathered_k = keys[:, table].reshape(kv, rows, -1, dim).transpose(0, 1).float()  # (rows, kv, span, dim)
    gathered_v = values[:, table].reshape(kv, rows, -1, dim).transpose(0, 1).float()
    rep = heads // kv
    scores = torch.einsum("bkrd,bksd->bkrs", q.float().view(rows, kv, rep, dim), gathered_k) * dim ** -0.5
    span = torch.arange(gathered_k.shape[2], device="cuda")
    scores = scores.masked_fill(span[None, None, None, :] > positions[:, None, None, None], float("-inf"))
    want = torch.einsum("bkrs,bksd->bkrd", torch.softmax(scores, -1), gathered_v).reshape(rows, heads, dim)
    for splits in (None, 1, 2, 8):  # None: split_count of these shapes and the GPU's SMs
        got = paged_decode_attention(q, keys, values, table, positions, dim ** -0.5, splits=splits).float()
        # bf16 roundings of the probabilities (tl.dot's p.V, as the gather path's) and of the output (values of order 1)
        assert (got - want).abs().max().item() < 2e-2, splits


def test_the_compiled_graph_engine_with_the_kernel_gives_the_gather_paths_tokens(tmp_path):
    import torch
    from hwrun.inference.engine import EngineCore
    from hwrun.testing.families import build_tiny_family
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("llama", tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).cuda().eval()
    prompts = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 19), (9, 7), (2, 23), (7, 40))]
    budgets = [21, 14, 26, 9, 30]
    runs = {}
    for choice in ("gather", "triton"):
        engine = EngineCore(model, slots=4, max_cache_len=96, step="fused", paged_attention=choice,
                            compile_backend="inductor")
        assert engine.use_graphs and engine.kv.attention == choice
        runs[choice] = engine.generate(prompts, budgets, eos_token_id=None)
    assert runs["triton"] == runs["gather"]
