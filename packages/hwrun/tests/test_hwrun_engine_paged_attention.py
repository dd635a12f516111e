"""The engine's decode attention over its KV blocks (`hwrun.inference.decode.paged_attention`): the Triton kernel that
reads each row's blocks through the block table (instead of gathering them into a copy first) equals a torch
reference and gives the gather path's greedy tokens inside the engine's fused step, run here under Triton's
interpreter (TRITON_INTERPRET=1, in one subprocess for the module: the interpreter is chosen when Triton is
imported); the choice and its refusals are checked in process."""

from __future__ import annotations

import importlib.util

import pytest
from hwenv.platforms import get_platform
from hwrun.errors import FastDecodeError
from hwrun.inference.decode.paged_attention import AUTO_REASON, paged_attention_support

CUDA = get_platform("cuda")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

INTERPRETED = r'''
import json, torch
from hwrun.inference.engine import EngineCore
from hwrun.inference.decode.paged_attention import paged_decode_attention
from hwrun.testing.families import build_tiny_family
import tempfile
from transformers import AutoModelForCausalLM

out = {}
torch.manual_seed(0)
kv, nb, bs, d, heads, rows, maxb = 2, 20, 16, 32, 8, 5, 6
K, V = torch.randn(kv, nb, bs, d), torch.randn(kv, nb, bs, d)
table = torch.stack([torch.randperm(nb)[:maxb] for _ in range(rows)])
pos = torch.tensor([0, 15, 16, 40, 95])
q = torch.randn(rows, heads, d)
got = paged_decode_attention(q, K, V, table, pos, 0.125)
rep, worst = heads // kv, 0.0
for r in range(rows):
    n = int(pos[r]) + 1
    ks, vs = K[:, table[r]].reshape(kv, -1, d)[:, :n], V[:, table[r]].reshape(kv, -1, d)[:, :n]
    for h in range(heads):
        want = torch.softmax((q[r, h] @ ks[h // rep].T) * 0.125, -1) @ vs[h // rep]
        worst = max(worst, float((got[r, h] - want).abs().max()))
out["kernel_max_diff"] = worst

path = build_tiny_family("llama", tempfile.mkdtemp() + "/llama")
model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
prompts = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 19), (9, 7), (2, 23))]
budgets = [21, 14, 26, 9]
runs = {}
for choice in ("gather", "triton"):
    engine = EngineCore(model, slots=2, max_cache_len=64, step="fused", paged_attention=choice)
    with torch.inference_mode():
        runs[choice] = engine.generate(prompts, budgets, eos_token_id=None)
    runs[choice + "_attention"] = engine.kv.attention
out["runs"] = runs
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted():
    """The results under Triton's interpreter (one subprocess for the module)."""
    from hwrun.testing import run_under_triton_interpreter

    return run_under_triton_interpreter(INTERPRETED)


@needs_triton
def test_the_kernel_equals_attention_over_the_gathered_blocks(interpreted):
    # five rows at positions 0, 15, 16, 40 and 95: a first token, a full block, a new block, mid-block, many blocks
    assert interpreted["kernel_max_diff"] < 1e-5


@needs_triton
def test_the_engine_with_the_kernel_gives_the_gather_paths_tokens(interpreted):
    runs = interpreted["runs"]
    assert runs["gather_attention"] == "gather" and runs["triton_attention"] == "triton"
    assert runs["triton"] == runs["gather"]  # 4 prompts through 2 slots: joins, leaves, blocks crossed


def test_auto_keeps_the_gather_until_the_kernel_is_measured_on_a_gpu():
    assert paged_attention_support("auto", 64, 16, CUDA) == ("gather", AUTO_REASON)
    assert paged_attention_support("gather", 64, 16, CUDA)[0] == "gather"


def test_bad_choices_are_refused_naming_the_value():
    with pytest.raises(FastDecodeError, match="paged_attention='flash' is not one of auto, gather, triton"):
        paged_attention_support("flash", 64, 16, CUDA)
    with pytest.raises(FastDecodeError, match="power-of-two head size.*head_dim=80.*paged_attention='gather'"):
        paged_attention_support("triton", 80, 16, CUDA)


@needs_triton
def test_triton_on_a_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(FastDecodeError, match="no kernels for cpu"):
        paged_attention_support("triton", 64, 16, get_platform("cpu"))


def test_the_model_step_refuses_the_kernel(tmp_path):
    from hwrun.inference.engine import EngineCore
    from hwrun.testing.families import build_tiny_family
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_family("gpt2", tmp_path / "gpt2"),
                                                 local_files_only=True).eval()
    with pytest.raises(FastDecodeError, match="runs inside the fused Llama-family step"):
        EngineCore(model, slots=2, max_cache_len=32, paged_attention="triton")
    engine = EngineCore(model, slots=2, max_cache_len=32)
    assert engine.kv.attention == "gather" and "model's own attention" in engine.paged_attention_reason
