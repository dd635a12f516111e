"""Decode attention read straight from the KV blocks (a Triton kernel), instead of gathering each row's blocks into a
contiguous copy first (`KVCache.gather_heads_first`).

The gather costs a decode step one extra read and write of every row's K/V per layer: on an H200 (2026-12-06,
tools/bench/profile_decoders.py, 1.24B Llama, 64 rows, 384 positions, compiled) the engine's step took 2.14 ms against
1.46 ms for the static decoder over a contiguous cache, 0.68 ms of it the gather's copies. This kernel is the
paged-attention read vLLM and Transformers' continuous batching use (there through flash-attn's `block_table`): one
program per (row, KV head) walks the row's blocks through the block table up to its position, `TILE` positions
(several blocks) an iteration, with the query heads of that KV head (grouped-query attention) and an online softmax in
float32 (flash-decoding without the split over the sequence). It is called through `torch.library.triton_op`, so
`torch.compile` traces it and a captured graph replays it.

Measured on an H100 (2026-12-06 21:27 UTC, tools/bench/profile_engine.py, 64 rows): correct, but not faster: 74 us a
layer against ~60 us for the gather and attention (one program per row and KV head is latency-bound at a few hundred
positions; a split over the sequence is the next step). The engine chooses it (`EngineCore(paged_attention=...)`):
"gather" (the default), "triton" (needs Triton and a device it compiles for; tested on CPU under Triton's
interpreter), "auto" (= "gather", with that reason). The host and shapes checks are in `paged_attention_support`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

#: Positions one iteration of the kernel reads (whole blocks: a multiple of the block size, four blocks of 16).
TILE = 64

#: `EngineCore(paged_attention=...)` values.
PAGED_ATTENTION = ("auto", "gather", "triton")

AUTO_REASON = ("the decode step gathers each row's KV blocks, then attends (the Triton paged-attention kernel is "
               "correct on an H100 but was not faster there: 20,998 vs 21,156 tokens/s at 64 rows, 2026-12-06; "
               "paged_attention='triton' runs it)")


def paged_attention_support(choice: str, head_dim: int, block_size: int, platform: Any) -> tuple[str, str]:
    """(implementation, reason) for `choice` on these shapes and the model's platform (hwenv's: its `triton` fact);
    `FastDecodeError` when "triton" is asked for and cannot run (the value, why, and what to pass instead)."""
    from ...errors import FastDecodeError

    if choice not in PAGED_ATTENTION:
        raise FastDecodeError(f"paged_attention={choice!r} is not one of {', '.join(PAGED_ATTENTION)}.")
    if choice == "gather":
        return "gather", "given: gather each row's KV blocks, then attend"
    if choice == "auto":
        return "gather", AUTO_REASON
    why = _triton_blocker(head_dim, block_size, platform)
    if why is not None:
        raise FastDecodeError(f"paged_attention='triton' cannot run here: {why}. Use paged_attention='gather'.")
    return "triton", "given: the Triton paged-attention kernel reads each row's blocks through the block table"


def choose_paged_attention(model: Any, choice: str, step_name: str, block_size: int,
                           platform: Any) -> tuple[str, str]:
    """(implementation, reason) of the engine's decode attention over its KV blocks for `model` and its step."""
    from ...errors import FastDecodeError

    if choice not in PAGED_ATTENTION:
        raise FastDecodeError(f"paged_attention={choice!r} is not one of {', '.join(PAGED_ATTENTION)}.")
    if step_name != "fused":
        if choice == "triton":
            raise FastDecodeError("paged_attention='triton' runs inside the fused Llama-family step; this engine runs "
                                  "the model's own forward, whose attention reads the gathered blocks. Leave "
                                  "paged_attention out (or 'gather').")
        return "gather", "the model's own attention reads each row's gathered KV blocks"
    config = model.config.get_text_config(decoder=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return paged_attention_support(choice, head_dim, block_size, platform)


def _triton_blocker(head_dim: int, block_size: int, platform: Any) -> str | None:
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if head_dim & (head_dim - 1) or block_size & (block_size - 1):
        return f"the kernel needs a power-of-two head size and block size (head_dim={head_dim}, block={block_size})"
    if not platform.triton and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"Triton compiles no kernels for {platform.kind} (TRITON_INTERPRET=1 runs them in its interpreter, "
                "for tests)")
    return None


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(q_ptr, k_ptr, v_ptr, table_ptr, pos_ptr, out_ptr, scale,
                     stride_qr, stride_qh, stride_kh, stride_kb, stride_ks, stride_tr, stride_or, stride_oh,
                     REP: tl.constexpr, REP_P: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        pos = tl.load(pos_ptr + row)  # the row's newest position (written this step): attended, as in the mask
        group = tl.arange(0, REP_P)
        heads = kv_head * REP + group
        live = group < REP
        dims = tl.arange(0, D)
        keys = tl.arange(0, TILE)  # a tile of TILE positions: TILE // BS blocks read at once (more loads in flight)
        q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=live[:, None],
                    other=0.0).to(tl.float32)
        # scaled once, back in float32: Inductor passes a float argument as float64, which would widen the scores and
        # make the loop-carried maximum change type (Triton refuses that)
        q = (q * scale).to(tl.float32)
        best = tl.full([REP_P], float("-inf"), tl.float32)
        total = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D], tl.float32)
        for start in range(0, pos + 1, TILE):
            at = start + keys  # the tile's positions
            seen = at <= pos
            block = tl.load(table_ptr + row * stride_tr + at // BS, mask=seen, other=0)  # scratch block past pos
            base = kv_head * stride_kh + block * stride_kb + (at % BS) * stride_ks
            k = tl.load(k_ptr + base[:, None] + dims[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base[:, None] + dims[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # (REP_P, TILE)
            scores = tl.where(seen[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            keep = tl.exp(best - new_best)
            p = tl.exp(scores - new_best[:, None])
            total = total * keep + tl.sum(p, axis=1)
            acc = acc * keep[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            best = new_best
        out = acc / total[:, None]
        tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=live[:, None])

    return paged_decode


@cache
def _op() -> Any:
    import torch
    import triton
    from torch.library import triton_op, wrap_triton

    def paged_decode_attention(q, keys, values, table, positions, scale):  # noqa: ANN001, ANN202 (set below)
        rows, n_heads, dim = q.shape
        kv_heads, block_size = keys.shape[0], keys.shape[2]
        rep = n_heads // kv_heads
        out = torch.empty_like(q)
        wrap_triton(_kernel())[(rows, kv_heads)](
            q, keys, values, table, positions, out, scale,
            q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), table.stride(0),
            out.stride(0), out.stride(1),
            REP=rep, REP_P=max(2, triton.next_power_of_2(rep)), BS=block_size, D=dim, TILE=max(block_size, TILE))
        return out

    # real types, not this module's postponed (string) annotations: triton_op reads the schema from them
    paged_decode_attention.__annotations__ = {"q": torch.Tensor, "keys": torch.Tensor, "values": torch.Tensor,
                                              "table": torch.Tensor, "positions": torch.Tensor, "scale": float,
                                              "return": torch.Tensor}
    return triton_op("hwrun::paged_decode_attention", mutates_args=())(paged_decode_attention)


def paged_decode_attention(q: Any, keys: Any, values: Any, table: Any, positions: Any, scale: float) -> Any:
    """Attention of one query per row, `q` (rows, heads, dim), over the row's KV blocks: `keys`/`values` one layer's
    pools (kv heads, blocks, block size, dim; head dim contiguous), `table` (>= rows, blocks per row) long, `positions`
    (rows,) each row's newest position (attended). Returns (rows, heads, dim) in `q`'s dtype."""
    return _op()(q.contiguous(), keys, values, table, positions.reshape(-1).contiguous(), float(scale))
