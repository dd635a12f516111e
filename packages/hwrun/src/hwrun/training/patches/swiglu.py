"""SwiGLU (`silu(gate) * up`) on the output of one fused gate/up matmul, with a backward in torch that writes
both halves of the gradient, [d_gate | d_up], from the saved [gate | up]; `torch.compile` fuses forward and
backward. It is what the fused projections' MLP runs (the kernel policy's 'inductor' SwiGLU). hwrun's Triton
kernel for this backward was deleted: +1.8 % end to end on the H200, below the policy's 2 % bar."""

from __future__ import annotations

from typing import Any

_FUNCTION: list[Any] = []  # the autograd.Function, built by prepare_swiglu


def swiglu_backward_torch(y: Any, d_out: Any) -> Any:
    """The backward in torch (float32 inside, y's dtype out): [d_gate | d_up]."""
    import torch

    gate, up = y.float().chunk(2, dim=-1)
    d = d_out.float()
    s = torch.sigmoid(gate)
    return torch.cat([d * up * s * (1 + gate * (1 - s)), d * gate * s], dim=-1).to(y.dtype)


def prepare_swiglu() -> None:
    """Define the autograd.Function; call before `torch.compile` traces `swiglu` (Dynamo cannot trace a class
    definition). Idempotent."""
    if not _FUNCTION:
        _FUNCTION.append(_build_function())


def _build_function():
    import torch
    import torch.nn.functional as F

    class FusedSwiGLU(torch.autograd.Function):
        """silu(gate) * up for y = [gate | up]; y is saved, the backward writes [d_gate | d_up]."""

        @staticmethod
        def forward(ctx, y):  # noqa: D401
            gate, up = y.chunk(2, dim=-1)
            ctx.save_for_backward(y)
            return F.silu(gate) * up

        @staticmethod
        def backward(ctx, d_out):
            (y,) = ctx.saved_tensors
            return swiglu_backward_torch(y, d_out)

    return FusedSwiGLU


def swiglu(y: Any) -> Any:
    """silu(gate) * up for y = [gate | up] on the last dimension. Under `torch.compile`, call `prepare_swiglu()`
    first."""
    prepare_swiglu()
    return _FUNCTION[0].apply(y)
