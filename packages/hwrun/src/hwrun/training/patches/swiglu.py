"""SwiGLU (`silu(gate) * up`) on the output of one fused gate/up matmul, with a backward that
writes both halves of the gradient in one pass: hwrun's Triton kernel (`swiglu_kernel`) or the
same formula in torch, which inductor compiles. The forward stays torch code, which `torch.compile` fuses.

Which one 'auto' runs is the kernel policy's choice (`hwrun.training.kernel_policy`): the Triton
kernel measured +1.8 % end to end on the H200 (88,821 against 87,213 tokens/s, docs/benchmarks/
train.md, 2026-12-04), below the 2 % a kernel of our own must gain, so 'auto' runs the torch form
everywhere; `kernel='triton'` (train(kernels={"swiglu": "hwrun"})) still selects the kernel."""

from __future__ import annotations

import importlib.util
from typing import Any

_FUNCTION: list[Any] = []  # [the autograd.Function, the Triton op or None], filled by prepare_swiglu


def triton_swiglu_usable(kind: str) -> bool:
    """Whether the Triton backward can run on the platform `kind` (the same `TRITON_KERNELS` rule as
    the loss kernel: CUDA, with triton installed). Whether 'auto' runs it is the kernel policy's choice."""
    from .fused_loss import triton_kernel_usable

    return triton_kernel_usable(kind)


def auto_swiglu_kernel(kernel: str, device_type: str) -> str:
    """`kernel` with 'auto' resolved for tensors on `device_type`: 'triton' where the kernel policy
    chooses hwrun's own SwiGLU (measured >= 2 % ahead there; nowhere at present), else 'torch'."""
    if kernel != "auto":
        return kernel
    from hwrun.devices import kind_of_device_type

    from ..kernel_policy import auto_choice

    return "triton" if auto_choice("swiglu", kind_of_device_type(device_type)).impl == "hwrun" else "torch"


def swiglu_backward_torch(y: Any, d_out: Any) -> Any:
    """The backward in torch (float32 inside, y's dtype out): [d_gate | d_up]."""
    import torch

    gate, up = y.float().chunk(2, dim=-1)
    d = d_out.float()
    s = torch.sigmoid(gate)
    return torch.cat([d * up * s * (1 + gate * (1 - s)), d * gate * s], dim=-1).to(y.dtype)


def prepare_swiglu() -> None:
    """Define the autograd.Function and, where triton is installed, register the
    `hwrun::swiglu_backward` op; call before `torch.compile` traces `swiglu` (Dynamo can trace
    neither a class definition nor an op registration). Idempotent."""
    if _FUNCTION:
        return
    op = None
    if importlib.util.find_spec("triton") is not None:
        from .swiglu_kernel import swiglu_backward_op

        op = swiglu_backward_op()
    _FUNCTION.extend([_build_function(), op])


def _build_function():
    import torch
    import torch.nn.functional as F

    class FusedSwiGLU(torch.autograd.Function):
        """silu(gate) * up for y = [gate | up]; y is saved, the backward writes [d_gate | d_up]."""

        @staticmethod
        def forward(ctx, y, use_triton):  # noqa: D401
            gate, up = y.chunk(2, dim=-1)
            ctx.save_for_backward(y)
            ctx.use_triton = use_triton
            return F.silu(gate) * up

        @staticmethod
        def backward(ctx, d_out):
            (y,) = ctx.saved_tensors
            if ctx.use_triton:
                return _FUNCTION[1](y, d_out.contiguous()), None
            return swiglu_backward_torch(y, d_out), None

    return FusedSwiGLU


KERNELS = ("auto", "triton", "torch")


def check_swiglu_kernel(kernel: str) -> None:
    """Reject a `kernel` value that is not one of KERNELS, saying what each one does."""
    from ...errors import TrainingConfigError

    if kernel not in KERNELS:
        raise TrainingConfigError(f"swiglu_kernel={kernel!r} is not one of {KERNELS}: 'auto' runs what the kernel "
                                  "policy chooses for the device (the torch form: hwrun's kernel gained 1.8 %, "
                                  "below its 2 % bar), 'triton' always hwrun's kernel (needs triton), 'torch' "
                                  "always torch.")


def swiglu(y: Any, kernel: str = "auto") -> Any:
    """silu(gate) * up for y = [gate | up] on the last dimension. `kernel`: 'auto' (the kernel
    policy's choice), 'triton' or 'torch'. Under `torch.compile`, call `prepare_swiglu()` first."""
    check_swiglu_kernel(kernel)
    if not _FUNCTION:
        prepare_swiglu()
    has_op = _FUNCTION[1] is not None
    if kernel == "triton" and not has_op:
        raise RuntimeError("swiglu(kernel='triton') needs the triton package, which is not installed; "
                           "use kernel='torch' or 'auto'.")
    use_triton = has_op and auto_swiglu_kernel(kernel, y.device.type) == "triton"
    return _FUNCTION[0].apply(y, use_triton)
