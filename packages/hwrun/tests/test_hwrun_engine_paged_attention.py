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
from hwrun.inference.decode.paged_attention import (
    AUTO_REASON,
    MAX_SPLITS,
    paged_attention_support,
    split_count,
)

CUDA = get_platform("cuda")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

INTERPRETED = r'''
import json, torch
import hwrun.inference.decode.paged_attention as pa
from hwrun.inference.engine import EngineCore
from hwrun.inference.decode.paged_attention import merge_partials, paged_decode_attention, split_count
from hwrun.testing.families import build_tiny_family
import tempfile
from transformers import AutoModelForCausalLM

out = {}
torch.manual_seed(0)
kv, nb, bs, heads, rows, maxb = 2, 40, 16, 8, 6, 12
pos = torch.tensor([0, 15, 16, 40, 130, 191])  # a length of 1, a block, a block + 1, mid-block, 2-3 tiles
table = torch.stack([torch.randperm(nb)[:maxb] for _ in range(rows)])


def attention(q, K, V, n_rows=rows):  # over the gathered blocks, float32
    d, rep = q.shape[-1], heads // kv
    want = torch.empty(n_rows, heads, d)
    for r in range(n_rows):
        n = int(pos[r]) + 1
        ks = K[:, table[r]].reshape(kv, -1, d)[:, :n].float()
        vs = V[:, table[r]].reshape(kv, -1, d)[:, :n].float()
        for h in range(heads):
            want[r, h] = torch.softmax((q[r, h].float() @ ks[h // rep].T) * 0.125, -1) @ vs[h // rep]
    return want


diffs, same = {}, {}
for d, dot in ((32, True), (32, False), (8, True)):  # tl.dot (head size >= 16), the broadcast products
    pa.USE_DOT = dot
    K, V, q = torch.randn(kv, nb, bs, d), torch.randn(kv, nb, bs, d), torch.randn(rows, heads, d)
    want = attention(q, K, V)
    one = paged_decode_attention(q, K, V, table, pos, 0.125, splits=1)
    # 7: more splits than a short row's tiles (empty splits)
    for splits in {(32, True): (1, 2, 3, 7), (32, False): (1, 3), (8, True): (1, 3)}[d, dot]:
        got = paged_decode_attention(q, K, V, table, pos, 0.125, splits=splits)
        diffs[f"{d}-{dot}-{splits}"] = float((got - want).abs().max())
        same[f"{d}-{dot}-{splits}"] = float((got - one).abs().max())
pa.USE_DOT = True
K, V, q = (torch.randn(kv, nb, bs, 32).half(), torch.randn(kv, nb, bs, 32).half(),
           torch.randn(rows, heads, 32).half())
got = paged_decode_attention(q, K, V, table, pos, 0.125, splits=3)
out["half_dtype"] = str(got.dtype)
out["half_max_diff"] = float((got.float() - attention(q, K, V)).abs().max())
out["kernel_max_diff"], out["split_vs_one"] = diffs, same

# the merge on its own: partials of uneven splits of each row's positions, one of them empty
d, bounds = 16, [0, 5, 5, 40, 200]  # split s holds positions bounds[s]..bounds[s+1]-1 (the second none)
K, V, q = torch.randn(kv, nb, bs, d), torch.randn(kv, nb, bs, d), torch.randn(rows, heads, d)
splits = len(bounds) - 1
best, total = torch.empty(rows, heads, splits), torch.empty(rows, heads, splits)
acc = torch.empty(rows, heads, splits, d)
for r in range(rows):
    n = int(pos[r]) + 1
    ks, vs = K[:, table[r]].reshape(kv, -1, d)[:, :n], V[:, table[r]].reshape(kv, -1, d)[:, :n]
    for h in range(heads):
        scores = (q[r, h] @ ks[h // (heads // kv)].T) * 0.125
        for s in range(splits):
            part = scores[bounds[s]:bounds[s + 1]]
            if len(part) == 0:
                best[r, h, s], total[r, h, s], acc[r, h, s] = float("-inf"), 0.0, 0.0
                continue
            top = part.max()
            p = torch.exp(part - top)
            best[r, h, s], total[r, h, s] = top, p.sum()
            acc[r, h, s] = p @ vs[h // (heads // kv)][bounds[s]:bounds[s + 1]]
out["merge_max_diff"] = float((merge_partials(best, total, acc, torch.float32) - attention(q, K, V)).abs().max())

path = build_tiny_family("llama", tempfile.mkdtemp() + "/llama")
model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
# one prompt runs past a TILE of positions, so the chosen two splits both hold some of that row
prompts = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 19), (9, 7), (4, 60))]
budgets = [13, 9, 14, 10]
runs = {}
for choice in ("gather", "triton"):
    engine = EngineCore(model, slots=2, max_cache_len=128, step="fused", paged_attention=choice)
    with torch.inference_mode():
        runs[choice] = engine.generate(prompts, budgets, eos_token_id=None)
    runs[choice + "_attention"] = engine.kv.attention
out["runs"] = runs
out["engine_splits"] = split_count(2, model.config.num_key_value_heads, engine.kv.span_len, pa.DEFAULT_SMS)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted():
    """The results under Triton's interpreter (one subprocess for the module)."""
    from hwrun.testing import run_under_triton_interpreter

    return run_under_triton_interpreter(INTERPRETED)


@needs_triton
def test_the_kernel_equals_attention_over_the_gathered_blocks_at_any_split(interpreted):
    # six rows at positions 0, 15, 16, 40, 130, 191 (a first token, a full block, a new block, mid-block, several
    # tiles), in 1, 2, 3 and 7 splits (empty ones for the short rows) with tl.dot; in 1 and 3 with the broadcast
    # products (head size 32 with tl.dot off, 8: too small for tl.dot)
    assert len(interpreted["kernel_max_diff"]) == 8
    assert max(interpreted["kernel_max_diff"].values()) < 1e-5
    assert max(interpreted["split_vs_one"].values()) < 1e-5


@needs_triton
def test_the_kernel_keeps_a_half_precision_cache_in_its_dtype(interpreted):
    # (bfloat16's tl.dot is wrong in Triton 3.x's interpreter, which multiplies its raw bits: float16 stands in here)
    assert interpreted["half_dtype"] == "torch.float16" and interpreted["half_max_diff"] < 5e-3


@needs_triton
def test_the_merge_of_the_splits_partials_equals_the_whole_rows_attention(interpreted):
    # uneven splits of each row (1 to 200 positions), one split empty (max -inf, sum 0, output 0)
    assert interpreted["merge_max_diff"] < 1e-5


@needs_triton
def test_the_engine_with_the_kernel_gives_the_gather_paths_tokens(interpreted):
    runs = interpreted["runs"]
    assert runs["gather_attention"] == "gather" and runs["triton_attention"] == "triton"
    assert interpreted["engine_splits"] == 2  # its 128 positions a row: two tiles, one a split
    assert runs["triton"] == runs["gather"]  # 4 prompts through 2 slots: joins, leaves, blocks crossed, a row split


def test_the_split_count_fills_the_gpu_from_shapes_alone():
    # an H100's 132 SMs: 64 rows x 8 KV heads (512 programs) -> 3 splits of 384 positions (two tiles each)
    assert split_count(64, 8, 384, 132) == 3
    assert split_count(1, 8, 4096, 132) == MAX_SPLITS  # one long row: as many as the merge takes
    assert split_count(2, 2, 96, 132) == 2  # no more splits than tiles
    assert split_count(4, 8, 40, 132) == 1  # under a tile: one split, the whole row in one program
    assert split_count(512, 8, 4096, 132) == 1  # the rows alone fill the GPU
    assert split_count(0, 8, 4096, 132) == MAX_SPLITS


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
