"""A Triton kernel for the backward of SwiGLU on a fused gate/up output: from y = [gate | up]
(rows x 2*width) and the gradient of silu(gate) * up, it writes [d_gate | d_up] in one pass.

Why: with gate and up from one matmul, inductor builds that gradient as a pointwise `cat` over
both halves; on an H200 the kernel took 299 us per Llama layer (8192 x 8192 per half, bf16) where
its data (three halves read, two written) moves in about 135 us. Here each program reads one
(gate, up, d_out) slice and writes both halves of the gradient. It is wrapped as the custom op
`hwrun::swiglu_backward` so that `torch.compile` keeps it as one call.

Kept, but not the default: end to end it gained 1.8 % on the H200 (88,821 against 87,213 tokens/s,
docs/benchmarks/train.md, 2026-12-04), below the 2 % a kernel of our own must gain under the kernel
policy (`hwrun.training.kernel_policy`); `train(kernels={"swiglu": "hwrun"})` selects it.

Under TRITON_INTERPRET=1 set before triton is imported, Triton's interpreter runs the same kernel on
CPU tensors (how the tests check it without a GPU). This module imports triton: import it only
where triton is installed (`swiglu` checks first)."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

BLOCK = 1024
OP_NAME = "hwrun::swiglu_backward"
_KERNELS: list[Any] = []
_OP: list[Any] = []


def swiglu_backward_kernel(y, d_out, d_y, stride_y, stride_out, stride_dy, width, BLOCK: tl.constexpr):
    """One (row, column block): d_gate = d * up * s * (1 + gate * (1 - s)), d_up = d * gate * s."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    gate = tl.load(y + row * stride_y + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(y + row * stride_y + width + cols, mask=inside, other=0.0).to(tl.float32)
    d = tl.load(d_out + row * stride_out + cols, mask=inside, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-gate))
    d_gate = d * up * s * (1.0 + gate * (1.0 - s))
    d_up = d * gate * s
    tl.store(d_y + row * stride_dy + cols, d_gate.to(d_y.dtype.element_ty), mask=inside)
    tl.store(d_y + row * stride_dy + width + cols, d_up.to(d_y.dtype.element_ty), mask=inside)


def _kernel():
    """The jitted kernel, built once (under TRITON_INTERPRET=1, triton.jit gives the interpreter)."""
    if not _KERNELS:
        _KERNELS.append(triton.jit(swiglu_backward_kernel))
    return _KERNELS[0]


def swiglu_backward(y: Any, d_out: Any):
    """d(silu(gate) * up)/d(y) for y = [gate | up] on its last dimension, given d_out, in y's dtype."""
    import torch

    width = d_out.shape[-1]
    if y.shape[-1] != 2 * width or y.shape[:-1] != d_out.shape[:-1]:
        raise ValueError(f"swiglu_backward: y {tuple(y.shape)} must be [gate | up] of d_out {tuple(d_out.shape)}")
    y2 = y.reshape(-1, 2 * width)
    out2 = d_out.reshape(-1, width)
    y2 = y2 if y2.stride(-1) == 1 else y2.contiguous()
    out2 = out2 if out2.stride(-1) == 1 else out2.contiguous()
    d_y = torch.empty(y2.shape, dtype=y.dtype, device=y.device)
    if y2.shape[0]:
        grid = (y2.shape[0], triton.cdiv(width, BLOCK))
        _kernel()[grid](y2, out2, d_y, y2.stride(0), out2.stride(0), d_y.stride(0), width, BLOCK=BLOCK,
                        num_warps=4)
    return d_y.view(y.shape)


def swiglu_backward_op():
    """The custom op `hwrun::swiglu_backward(y, d_out) -> d_y` (registered once, on first use:
    nothing is registered at import). `torch.compile` keeps it as one opaque call."""
    if _OP:
        return _OP[0]
    import torch

    @torch.library.custom_op(OP_NAME, mutates_args=(), schema="(Tensor y, Tensor d_out) -> Tensor")
    def op(y, d_out):
        return swiglu_backward(y, d_out)

    @op.register_fake
    def _(y, d_out):
        return torch.empty_like(y)

    _OP.append(op)
    return op
