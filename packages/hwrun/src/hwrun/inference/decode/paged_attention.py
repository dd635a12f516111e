"""Decode attention read straight from the KV blocks (a Triton kernel), instead of gathering each row's blocks into a
contiguous copy first (`KVCache.gather_heads_first`).

The gather costs a decode step one extra read and write of every row's K/V per layer: on an H200 (2026-12-06,
tools/bench/profile_decoders.py, 1.24B Llama, 64 rows, 384 positions, compiled) the engine's step took 2.14 ms against
1.46 ms for the static decoder over a contiguous cache, 0.68 ms of it the gather's copies. This kernel is the
paged-attention read vLLM and Transformers' continuous batching use (there through flash-attn's `block_table`): a
program per (row, KV head, split) walks its share of the row's blocks through the block table, `TILE` positions
(several blocks) an iteration, with the query heads of that KV head (grouped-query attention) and an online softmax in
float32. It is called through `torch.library.triton_op`, so `torch.compile` traces it and a captured graph replays it.

Measured on an H100 (2026-12-06 21:27 UTC, tools/bench/profile_engine.py, 64 rows), the first version (one program per
row and KV head, no split): correct, but not faster: 74 us a layer against ~60 us for the gather and attention (the
gather 35 % of the step's kernel time; one program per row and KV head is latency-bound at a few hundred positions).

This version splits each row's positions (flash-decoding, as vLLM's paged_attention_v2 and FlashDecoding): the grid is
(rows, KV heads, splits); a split takes an even share of its row's tiles (from the row's own position, read on the
device, so rows of any length balance) and writes a float32 partial, (max, sum of exp, unnormalized output), which a
second small kernel merges (`merge_partials`); with one split the first kernel writes the attention itself, as before,
and nothing is merged. The number of splits (`split_count`) comes from shapes and the device only, never from a value
on the device, so a CUDA graph captured once replays the same grid: rows x KV heads x splits is made to reach
`PROGRAMS_PER_SM` x the SM count (Triton's driver's; `DEFAULT_SMS` where it cannot say), at most one split a `TILE` of
the positions a table row addresses (the cache capacity: the longest a row can be) and `MAX_SPLITS`. The longest live
position would fit better but is on the device at capture time; with the capacity, rows shorter than it leave their
last splits empty (a program that writes (-inf, 0, 0)). 64 rows x 8 KV heads x 384 positions on an H100 (132 SMs):
3 splits of two tiles. Where the head size is >= 16, q.K and p.V are `tl.dot`s (tensor cores; the query heads of a KV
head padded to 16 rows; q and the probabilities in the cache's dtype, as the gather path's matmuls; exact float32 for a
float32 cache); `USE_DOT = False` keeps the first version's broadcast products. Not yet measured on a GPU (tested on
CPU under Triton's interpreter, and tests/gpu/test_gpu_paged_attention.py not yet run).

The engine chooses it (`EngineCore(paged_attention=...)`): "gather" (the default), "triton" (needs Triton and a device
it compiles for), "auto" (= "gather", with that reason, until the split is measured). The host and shapes checks are in
`paged_attention_support`, which also registers the op before a compiled step traces it (the first version's op was
built inside the traced call, which Dynamo could not trace: a graph break at each layer's attention).
"""

from __future__ import annotations

from functools import cache
from typing import Any

#: Positions one iteration of the kernel reads (whole blocks: a multiple of the block size, four blocks of 16).
TILE = 64

#: Programs an SM the split aims for (rows x KV heads x splits >= this x the SM count): one program per (row, KV
#: head) was already ~3.9 an SM at 64 rows x 8 KV heads on an H100 and latency-bound, so the aim is fewer serial
#: tiles a program and more warps in flight, not just a full first wave. A first guess, to tune on the GPU.
PROGRAMS_PER_SM = 8

#: SMs assumed where Triton's driver cannot say (Triton's CPU interpreter, a backend without the property).
DEFAULT_SMS = 64

#: Most splits of one row (the merge holds every split's partial output of a head in registers).
MAX_SPLITS = 64

#: Query heads a `tl.dot` needs (its smallest M); fewer heads of one KV head are padded up to it.
DOT_HEADS = 16

#: q.K and p.V as `tl.dot` (tensor cores) where the head size allows it (>= 16); False: broadcast products (the first
#: kernel's). A switch for measuring the two on a GPU.
USE_DOT = True

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
    _op()  # registered now, before a compiled step traces its calls
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


def split_count(rows: int, kv_heads: int, capacity: int, sms: int, tile: int = TILE) -> int:
    """Splits of each row's positions: enough that rows x `kv_heads` x splits reaches `PROGRAMS_PER_SM` x `sms`
    programs, at most one a `tile` of `capacity` (the positions a table row addresses) and `MAX_SPLITS`; at least 1.
    Shapes only (never a device value), so a captured graph replays the same grid."""
    programs = max(1, rows * kv_heads)
    wanted = -(-PROGRAMS_PER_SM * sms // programs)
    return max(1, min(wanted, -(-capacity // tile), MAX_SPLITS))


@cache
def _sms(index: int) -> int:
    """The device's SM count from Triton's driver (NVIDIA's and AMD's report it), else `DEFAULT_SMS`."""
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["multiprocessor_count"])
    except Exception:  # noqa: BLE001 (no driver, or no such property: the default)
        return DEFAULT_SMS


def _device_sms(tensor: Any) -> int:
    return DEFAULT_SMS if tensor.is_cpu else _sms(tensor.device.index or 0)


@cache
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode_split(q_ptr, k_ptr, v_ptr, table_ptr, pos_ptr, out_ptr, best_ptr, total_ptr, acc_ptr, scale,
                           splits, heads_n,
                           stride_qr, stride_qh, stride_kh, stride_kb, stride_ks, stride_tr, stride_or, stride_oh,
                           REP: tl.constexpr, REP_P: tl.constexpr, BS: tl.constexpr, D: tl.constexpr,
                           TILE: tl.constexpr, DOT: tl.constexpr, DIRECT: tl.constexpr):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        pos = tl.load(pos_ptr + row)  # the row's newest position (written this step): attended, as in the mask
        # this split's share of positions 0..pos: whole tiles, the row's tiles spread evenly over the splits (from the
        # row's own length, read on the device: the grid stays a function of shapes); one split walks them all
        count = pos + 1
        span = tl.cdiv(tl.cdiv(count, splits), TILE) * TILE
        first = split * span
        end = tl.minimum(first + span, count)
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
        if DOT:
            q_in = q.to(k_ptr.dtype.element_ty)  # the cache's dtype, as the gather path's matmul reads q
        best = tl.full([REP_P], float("-inf"), tl.float32)
        total = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D], tl.float32)
        for start in range(first, end, TILE):
            at = start + keys  # the tile's positions
            seen = at <= pos
            block = tl.load(table_ptr + row * stride_tr + at // BS, mask=seen, other=0)  # scratch block past pos
            base = kv_head * stride_kh + block * stride_kb + (at % BS) * stride_ks
            k = tl.load(k_ptr + base[:, None] + dims[None, :], mask=seen[:, None], other=0.0)
            v = tl.load(v_ptr + base[:, None] + dims[None, :], mask=seen[:, None], other=0.0)
            if DOT:  # (REP_P, D) x (D, TILE) on tensor cores, float32 accumulation; exact float32 for float32 caches
                scores = tl.dot(q_in, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # (REP_P, TILE)
            scores = tl.where(seen[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            keep = tl.exp(best - new_best)
            p = tl.exp(scores - new_best[:, None])
            total = total * keep + tl.sum(p, axis=1)
            if DOT:  # the probabilities in the cache's dtype, as the gather path's softmax @ values
                acc = acc * keep[:, None] + tl.dot(p.to(v_ptr.dtype.element_ty), v, input_precision="ieee")
            else:
                acc = acc * keep[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            best = new_best
        if DIRECT:  # one split: the attention itself
            out = acc / total[:, None]
            tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=live[:, None])
        else:  # a partial: (max, sum of exp, unnormalized output); an empty split writes (-inf, 0, 0)
            at_split = (row * heads_n + heads) * splits + split
            tl.store(best_ptr + at_split, best, mask=live)
            tl.store(total_ptr + at_split, total, mask=live)
            tl.store(acc_ptr + at_split[:, None] * D + dims[None, :], acc, mask=live[:, None])

    @triton.jit
    def paged_decode_merge(best_ptr, total_ptr, acc_ptr, out_ptr, splits, heads_n, stride_or, stride_oh,
                           SPLITS_P: tl.constexpr, D: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        parts = tl.arange(0, SPLITS_P)
        real = parts < splits
        dims = tl.arange(0, D)
        at = (row * heads_n + head) * splits + parts
        best = tl.load(best_ptr + at, mask=real, other=float("-inf"))
        total = tl.load(total_ptr + at, mask=real, other=0.0)
        acc = tl.load(acc_ptr + at[:, None] * D + dims[None, :], mask=real[:, None], other=0.0)
        top = tl.max(best, axis=0)  # finite: the first split always holds position 0
        weight = tl.exp(best - top)  # 0 for empty splits (-inf)
        out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(total * weight, axis=0)
        tl.store(out_ptr + row * stride_or + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))

    return paged_decode_split, paged_decode_merge


def _merge(best: Any, total: Any, acc: Any, out: Any, launch: Any) -> Any:
    """Write into `out` (rows, heads, dim) the attention of the splits' partials: `best`/`total` (rows, heads, splits)
    float32 maxima and sums of exp, `acc` (rows, heads, splits, dim) float32 unnormalized outputs."""
    import triton

    rows, heads, splits = best.shape
    launch(_kernels()[1])[(rows, heads)](best, total, acc, out, splits, heads, out.stride(0), out.stride(1),
                                        SPLITS_P=max(2, triton.next_power_of_2(splits)), D=acc.shape[-1])
    return out


def merge_partials(best: Any, total: Any, acc: Any, dtype: Any) -> Any:
    """The merge kernel on its own (tests): (rows, heads, dim) attention in `dtype` from the splits' partials."""
    import torch

    out = torch.empty(acc.shape[0], acc.shape[1], acc.shape[3], dtype=dtype, device=acc.device)
    return _merge(best.contiguous(), total.contiguous(), acc.contiguous(), out, lambda kernel: kernel)


@cache
def _op() -> Any:
    import torch
    import triton
    from torch.library import triton_op, wrap_triton

    def paged_decode_attention(q, keys, values, table, positions, scale, splits):  # noqa: ANN001, ANN202 (set below)
        rows, n_heads, dim = q.shape
        kv_heads, block_size = keys.shape[0], keys.shape[2]
        rep = n_heads // kv_heads
        tile = max(block_size, TILE)
        if splits <= 0:  # from shapes and the device only: the same grid at capture and at every replay
            splits = split_count(rows, kv_heads, table.shape[1] * block_size, _device_sms(q), tile)
        dot = USE_DOT and dim >= 16
        rep_p = max(DOT_HEADS if dot else 2, triton.next_power_of_2(rep))
        out = torch.empty_like(q)
        direct = splits == 1
        if direct:  # nothing to merge: no partials (q stands in for their pointers, never written)
            best = total = acc = q
        else:
            best = torch.empty(rows, n_heads, splits, dtype=torch.float32, device=q.device)
            total = torch.empty_like(best)
            acc = torch.empty(rows, n_heads, splits, dim, dtype=torch.float32, device=q.device)
        wrap_triton(_kernels()[0])[(rows, kv_heads, splits)](
            q, keys, values, table, positions, out, best, total, acc, scale, splits, n_heads,
            q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), table.stride(0),
            out.stride(0), out.stride(1),
            REP=rep, REP_P=rep_p, BS=block_size, D=dim, TILE=tile, DOT=dot, DIRECT=direct)
        if not direct:
            _merge(best, total, acc, out, wrap_triton)
        return out

    # real types, not this module's postponed (string) annotations: triton_op reads the schema from them
    paged_decode_attention.__annotations__ = {"q": torch.Tensor, "keys": torch.Tensor, "values": torch.Tensor,
                                              "table": torch.Tensor, "positions": torch.Tensor, "scale": float,
                                              "splits": int, "return": torch.Tensor}
    return triton_op("hwrun::paged_decode_attention", mutates_args=())(paged_decode_attention)


def paged_decode_attention(q: Any, keys: Any, values: Any, table: Any, positions: Any, scale: float,
                           splits: int | None = None) -> Any:
    """Attention of one query per row, `q` (rows, heads, dim), over the row's KV blocks: `keys`/`values` one layer's
    pools (kv heads, blocks, block size, dim; head dim contiguous), `table` (>= rows, blocks per row) long, `positions`
    (rows,) each row's newest position (attended). Returns (rows, heads, dim) in `q`'s dtype. `splits`: of each row's
    positions (None: `split_count` of the shapes and the device's SMs; 1: one program walks the whole row)."""
    import torch

    if not torch.compiler.is_compiling():
        _op()  # registered once, outside any trace (Dynamo cannot trace the registration: it reads it below)
    return torch.ops.hwrun.paged_decode_attention(q.contiguous(), keys, values, table,
                                                  positions.reshape(-1).contiguous(), float(scale), int(splits or 0))
