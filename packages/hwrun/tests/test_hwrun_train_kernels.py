"""hwrun's Triton training kernel (the loss chunk `ce_kernel`) and the SwiGLU torch backward.

The kernel itself runs here under Triton's interpreter (TRITON_INTERPRET=1, in a subprocess:
the variable must be set before triton is imported) on CPU tensors, the same Python source that
Triton compiles for CUDA; they are compared with the torch forms and with float64 autograd, also
inside torch.compile(fullgraph=True) and inside a fused Llama model. In this process: which form
each device gets, the bad-value errors, and the torch backward."""

from __future__ import annotations

import textwrap

import hwrun
import pytest
import torch
import torch.nn.functional as F
from hwrun.training import TrainingConfigError, train
from hwrun.training.patches.fused_loss import (
    _chunk_loss_grad,
    _chunk_loss_grad_in_place,
    chunk_function,
)
from hwrun.training.patches.swiglu import swiglu, swiglu_backward_torch

INTERPRETED = textwrap.dedent('''
    import json, sys
    import torch
    import torch.nn.functional as F
    from hwrun.training.patches.ce_kernel import BLOCK, chunk_ce, chunk_ce_op
    from hwrun.training.patches.fused_loss import _chunk_loss_grad, linear_cross_entropy, prepare_linear_cross_entropy

    out = {}
    torch.manual_seed(0)
    vocab = BLOCK * 2 + 37  # three column blocks, the last one partial
    targets = torch.tensor([3, -100, vocab - 1, 0, BLOCK, -100, BLOCK - 1])
    scale = torch.tensor(0.25)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        logits = (torch.randn(7, vocab, dtype=torch.float64) * 4).to(dtype)
        loss, grad = chunk_ce(logits, targets, scale)
        ref_loss, ref_grad = _chunk_loss_grad(logits, targets, scale)
        out[f"ce_{dtype}"] = [abs(loss.item() - ref_loss.item()), (grad.double() - ref_grad.double()).abs().max().item(),
                              str(grad.dtype), grad[[1, 5]].abs().max().item()]
    out["op_once"] = chunk_ce_op() is chunk_ce_op()

    hidden = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(300, 16, dtype=torch.float64)
    t = torch.randint(0, 300, (40,)); t[[3, 17]] = -100
    prepare_linear_cross_entropy("triton")
    compiled = torch.compile(lambda x: linear_cross_entropy(x, weight, t, chunk_tokens=16, compiled=True,
                                                            kernel="triton"), fullgraph=True, backend="aot_eager")
    loss = compiled(hidden)
    (g,) = torch.autograd.grad(loss, hidden)
    ref = F.cross_entropy(hidden @ weight.t(), t, ignore_index=-100)
    (rg,) = torch.autograd.grad(ref, hidden)
    out["ce_compiled"] = [abs(loss.item() - ref.item()), (g - rg).abs().max().item()]

    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    """The results under Triton's interpreter (one subprocess for the module)."""
    from hwrun.testing import run_under_triton_interpreter

    return run_under_triton_interpreter(INTERPRETED)


def test_chunk_kernel_equals_the_torch_form(interpreted):
    # the kernel computes in float32 whatever the input (as the torch form does for bf16 logits)
    for dtype, tolerance in (("torch.float64", 1e-6), ("torch.float32", 1e-5), ("torch.bfloat16", 4e-3)):
        loss_diff, grad_diff, grad_dtype, ignored = interpreted[f"ce_{dtype}"]
        assert loss_diff < max(tolerance, 1e-4), dtype  # a sum over rows of values near 10
        assert grad_diff <= tolerance, dtype  # one bf16 rounding of values below 1
        assert grad_dtype == dtype  # the gradient comes back in the logits' dtype
        assert ignored == 0.0  # rows with target -100 get no gradient
    assert interpreted["op_once"]  # the custom op is registered once


def test_chunk_kernel_under_compile_equals_full_cross_entropy(interpreted):
    loss_diff, grad_diff = interpreted["ce_compiled"]
    assert loss_diff < 1e-5 and grad_diff < 2e-6  # float32 inside the kernel


def test_each_device_gets_its_chunk_form():
    assert chunk_function(True, "torch", "cuda") is _chunk_loss_grad
    assert chunk_function(False, "auto", "cpu") is _chunk_loss_grad_in_place
    assert chunk_function(True, "auto", "xpu") is _chunk_loss_grad  # the kernel is CUDA-only
    assert chunk_function(True, "auto", "cuda").__name__ == "chunk_ce_triton"  # triton ships with torch's CUDA wheels
    with pytest.raises(TrainingConfigError, match=r"kernel='fast' is not one of \('auto', 'torch', 'triton'\)"):
        chunk_function(True, "fast")


@pytest.mark.parametrize(("keyword", "message"), [
    ("loss_kernel", r"loss_kernel='fast' is not one of 'auto', 'triton', 'torch'; loss_kernel is deprecated: use "
                    r"kernels=\{'cross_entropy': IMPL\}"),
    ("swiglu_kernel", r"swiglu_kernel='fast' is not one of .* use kernels=\{'swiglu': IMPL\} with IMPL 'auto' "
                      r"or one of inductor, liger")])
def test_train_rejects_an_unknown_kernel_before_anything_loads(tmp_path, keyword, message):
    with pytest.raises(TrainingConfigError, match=message):
        train(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), tmp_path / "missing.txt", output_dir=tmp_path / "out",
              **{keyword: "fast"})
    assert not (tmp_path / "out").exists()


def test_swiglu_torch_backward_equals_autograd():
    torch.manual_seed(0)
    y = torch.randn(4, 2 * 33, dtype=torch.float64, requires_grad=True)
    d = torch.randn(4, 33, dtype=torch.float64)
    gate, up = y.chunk(2, -1)
    (reference,) = torch.autograd.grad(F.silu(gate) * up, y, d)
    torch.testing.assert_close(swiglu_backward_torch(y.detach(), d), reference)
    (got,) = torch.autograd.grad(swiglu(y), y, d)
    torch.testing.assert_close(got, reference)
    torch.testing.assert_close(swiglu(y), F.silu(gate) * up)
