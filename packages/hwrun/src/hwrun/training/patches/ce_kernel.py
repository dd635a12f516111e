"""A Triton kernel for one chunk of the fused loss: cross-entropy and d(loss)/d(logits) of a
(rows x vocab) bf16/fp16/fp32 logits block in two passes over it.

Why: for 1024 x 128256 bf16 logits, the kernel inductor makes of the out-of-place torch form took
436 us on an H200, where reading the block twice and writing the gradient once takes about 190 us:
its logsumexp and its gradient pass each read the row again. Here one program owns a row: pass 1
keeps a running max and sum of exponentials (online softmax), pass 2 writes
(softmax - onehot) * scale in the logits' dtype. It is wrapped as the custom op `hwrun::chunk_ce`
so that `torch.compile` keeps it as one call (no graph break, nothing re-traced).

The default on CUDA because it pays for itself: +2.1 % end to end over the torch form under
inductor on the H200 (89,512 against 87,631 tokens/s, docs/benchmarks/train.md, 2026-12-03), above
the 2 % bar of the kernel policy (`hwrun.training.kernel_policy`), and a lower LoRA peak (11.0
against 12.7 GiB).

Triton runs it on CUDA; with TRITON_INTERPRET=1 set before triton is imported, Triton's interpreter
runs the same kernel on CPU tensors (how the tests check it without a GPU). This module imports triton: import it only where
triton is installed (`fused_loss` checks first)."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

IGNORE_INDEX = -100
BLOCK = 4096
OP_NAME = "hwrun::chunk_ce"
_KERNELS: list[Any] = []
_OP: list[Any] = []


def chunk_ce_kernel(logits, grad, targets, losses, scale, stride_logits, stride_grad, vocab,
                    BLOCK: tl.constexpr):
    """One program per row: online max/sum of exp (pass 1), then the scaled gradient (pass 2)."""
    row = tl.program_id(0).to(tl.int64)
    source = logits + row * stride_logits
    target = tl.load(targets + row)
    offsets = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], -1e30, tl.float32)  # finite: exp(m - m_new) stays defined
    running_sum = tl.full([BLOCK], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + offsets
        x = tl.load(source + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, x)
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.exp(x - new_max)
        running_max = new_max
    row_max = tl.max(running_max, axis=0)
    lse = row_max + tl.log(tl.sum(running_sum * tl.exp(running_max - row_max), axis=0))
    valid = target != -100  # IGNORE_INDEX
    safe = tl.where(valid, target, 0)
    picked = tl.load(source + safe).to(tl.float32)
    tl.store(losses + row, tl.where(valid, lse - picked, 0.0))
    coefficient = tl.where(valid, tl.load(scale).to(tl.float32), 0.0)
    destination = grad + row * stride_grad
    for start in range(0, vocab, BLOCK):
        cols = start + offsets
        inside = cols < vocab
        x = tl.load(source + cols, mask=inside, other=0.0).to(tl.float32)
        g = tl.exp(x - lse) - tl.where(cols == safe, 1.0, 0.0)
        tl.store(destination + cols, (g * coefficient).to(grad.dtype.element_ty), mask=inside)



def _kernel():
    """The jitted kernel, built once (under TRITON_INTERPRET=1, triton.jit gives the interpreter)."""
    if not _KERNELS:
        _KERNELS.append(triton.jit(chunk_ce_kernel))
    return _KERNELS[0]


def chunk_ce(logits: Any, targets: Any, scale: Any):
    """(summed CE of the rows whose target is not -100, d(sum * scale)/d(logits) in logits' dtype)
    for a contiguous-row (rows, vocab) `logits`, (rows,) int `targets` and a 0-d `scale` tensor."""
    import torch

    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    grad = torch.empty_like(logits)
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        scale = scale.reshape(1).to(device=logits.device, dtype=torch.float32)
        _kernel()[(rows,)](logits, grad, targets.contiguous(), losses, scale, logits.stride(0),
                                    grad.stride(0), vocab, BLOCK=BLOCK, num_warps=8)
    return losses.sum(), grad


def chunk_ce_op():
    """The custom op `hwrun::chunk_ce(logits, targets, scale) -> (loss, grad)` (registered once,
    on first use: nothing is registered at import). `torch.compile` keeps it as one opaque call."""
    if _OP:
        return _OP[0]
    import torch

    @torch.library.custom_op(OP_NAME, mutates_args=(),
                             schema="(Tensor logits, Tensor targets, Tensor scale) -> (Tensor, Tensor)")
    def op(logits, targets, scale):
        return chunk_ce(logits, targets, scale)

    @op.register_fake
    def _(logits, targets, scale):
        return logits.new_empty((), dtype=torch.float32), torch.empty_like(logits)

    _OP.append(op)
    return op


def chunk_ce_triton(logits: Any, targets: Any, scale: Any):
    """The chunk function of `fused_loss` (same contract as `_chunk_loss_grad`) through the op."""
    return chunk_ce_op()(logits, targets, scale)
