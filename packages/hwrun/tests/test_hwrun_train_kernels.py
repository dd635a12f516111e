"""hwrun's Triton training kernels (the loss chunk `ce_kernel`, the SwiGLU backward `swiglu_kernel`).

The kernels themselves run here under Triton's interpreter (TRITON_INTERPRET=1, in a subprocess:
the variable must be set before triton is imported) on CPU tensors, the same Python source that
Triton compiles for CUDA; they are compared with the torch forms and with float64 autograd, also
inside torch.compile(fullgraph=True) and inside a fused Llama model. In this process: which form
each device gets, the bad-value errors, and the torch backward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    import copy, json, sys
    import torch
    import torch.nn.functional as F
    from hwrun.training.patches.ce_kernel import BLOCK, chunk_ce, chunk_ce_op
    from hwrun.training.patches.fused_loss import _chunk_loss_grad, linear_cross_entropy, prepare_linear_cross_entropy
    from hwrun.training.patches.fused_projections import apply_fused_projections
    from hwrun.training.patches.swiglu import prepare_swiglu, swiglu
    from hwrun.training.patches.swiglu_kernel import swiglu_backward
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

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

    prepare_swiglu()
    for dtype in (torch.float64, torch.bfloat16):
        y = torch.randn(3, 5, 2 * 1500, dtype=torch.float64)
        d = torch.randn(3, 5, 1500, dtype=torch.float64)
        y64 = y.clone().requires_grad_()
        gate, up = y64.chunk(2, -1)
        (ref,) = torch.autograd.grad(F.silu(gate) * up, y64, d)
        got = swiglu_backward(y.to(dtype), d.to(dtype))
        out[f"swiglu_{dtype}"] = [(got.double() - ref).abs().max().item(), ref.abs().max().item(), str(got.dtype)]
    y = torch.randn(6, 2 * 40, dtype=torch.float64, requires_grad=True)
    d = torch.randn(6, 40, dtype=torch.float64)
    f = torch.compile(lambda y: swiglu(y, "triton"), fullgraph=True, backend="aot_eager")
    (g,) = torch.autograd.grad(f(y), y, d)
    gate, up = y.chunk(2, -1)
    (rg,) = torch.autograd.grad(F.silu(gate) * up, y, d)
    out["swiglu_compiled"] = (g - rg).abs().max().item()

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=101)
    base = LlamaForCausalLM(cfg).requires_grad_(False)
    reference = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    ours = copy.deepcopy(reference)
    patch = apply_fused_projections(ours, swiglu_kernel="triton")
    ids = torch.randint(0, 101, (2, 12))
    grads = []
    for model in (ours, reference):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    out["model"] = [patch.reason, max((grads[0][n] - grads[1][n]).abs().max().item() for n in grads[1]), len(grads[1])]
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    """The kernels' results under Triton's interpreter (one subprocess for the module)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def test_swiglu_kernel_equals_float64_autograd(interpreted):
    diff, largest, dtype = interpreted["swiglu_torch.float64"]
    assert diff < largest * 1e-6 and dtype == "torch.float64"  # float32 inside the kernel
    diff, largest, dtype = interpreted["swiglu_torch.bfloat16"]
    assert dtype == "torch.bfloat16" and diff <= largest * 2 ** -7  # one bf16 rounding of the result
    assert interpreted["swiglu_compiled"] < 1e-5


def test_fused_model_with_the_swiglu_kernel_gives_the_lora_gradients(interpreted):
    reason, diff, count = interpreted["model"]
    assert reason == "one matmul for q/k/v in 2 layers and gate/up in 2 layers"
    assert count == 12 and diff < 1e-5


def test_each_device_gets_its_chunk_form():
    assert chunk_function(True, "torch", "cuda") is _chunk_loss_grad
    assert chunk_function(False, "auto", "cpu") is _chunk_loss_grad_in_place
    assert chunk_function(True, "auto", "xpu") is _chunk_loss_grad  # the kernel is CUDA-only
    assert chunk_function(True, "auto", "cuda").__name__ == "chunk_ce_triton"  # triton ships with torch's CUDA wheels
    with pytest.raises(TrainingConfigError, match=r"kernel='fast' is not one of \('auto', 'torch', 'triton'\)"):
        chunk_function(True, "fast")


@pytest.mark.parametrize(("keyword", "message"), [("loss_kernel", "kernel='fast'"),
                                                  ("swiglu_kernel", "swiglu_kernel='fast'")])
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
    (got,) = torch.autograd.grad(swiglu(y, "torch"), y, d)
    torch.testing.assert_close(got, reference)
    torch.testing.assert_close(swiglu(y, "auto"), F.silu(gate) * up)  # on CPU: the torch backward
