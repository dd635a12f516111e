"""Time hwrun's two Triton training kernels against inductor's fusion of the same torch code, on CUDA.

Developer script. The LoRA benchmark's sizes (hidden 2048, intermediate 8192, vocab 128256, 8 x 1024
tokens, bf16):
  chunk rows   one (chunk, vocab) logits block: torch.compile(_chunk_loss_grad) vs ce_kernel.chunk_ce,
               with the bytes moved per ms (the kernel reads the block twice and writes it once)
  loss rows    linear_cross_entropy forward + backward over all 8192 tokens under
               torch.compile(fullgraph=True), per kernel and chunk size (the LM-head matmuls included)
  swiglu rows  the backward of silu(gate) * up on one fused [gate | up] matmul output: the compiled
               torch autograd (a pointwise cat of both halves) vs swiglu_kernel, with bytes moved per ms
Loss rows give the largest error of the loss and of d(loss)/d(hidden) against float32
cross-entropy over the full logits; swiglu rows the largest difference from float32 autograd.
Median of CUDA-event timings after warm-up.
Usage: python tools/bench/train_kernels.py --out DIR [--chunks 1024,2048,4096]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from attention import time_call  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--chunks", default="1024,2048,4096")
    args = parser.parse_args(argv)

    import torch
    from hwrun.training.patches.ce_kernel import chunk_ce
    from hwrun.training.patches.fused_loss import (
        _chunk_loss_grad,
        linear_cross_entropy,
        prepare_linear_cross_entropy,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    prepare_linear_cross_entropy("triton")
    torch.manual_seed(0)
    n, h, v = args.tokens, args.hidden, args.vocab
    hidden = (torch.randn(n, h, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, v, (n,), device="cuda")
    targets[::97] = -100
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
               "shape": {"tokens": n, "hidden": h, "vocab": v}, "rows": []}

    full = (hidden.detach().float() @ weight.float().t())
    ref_hidden = hidden.detach().float().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref_hidden @ weight.float().t(), targets, ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_hidden)
    del full

    compiled_chunk = torch.compile(_chunk_loss_grad, fullgraph=True)
    for chunk in [int(c) for c in args.chunks.split(",")]:
        logits = (hidden.detach()[:chunk] @ weight.t())
        t = targets[:chunk]
        scale = torch.tensor(1.0 / chunk, device="cuda")
        bytes_moved = 3 * logits.numel() * logits.element_size()
        expected = _chunk_loss_grad(logits, t, scale)
        for name, fn in (("inductor", compiled_chunk), ("triton", chunk_ce)):
            loss, grad = fn(logits, t, scale)
            ms = time_call(lambda fn=fn, x=logits, t=t, s=scale: fn(x, t, s), "cuda", warmup=3, repeats=20)
            row = {"kind": "chunk", "kernel": name, "rows": chunk, "ms": ms, "gb_per_s": bytes_moved / ms / 1e6,
                   "loss_diff": abs(loss.item() - expected[0].item()),
                   "grad_max_diff": (grad.float() - expected[1].float()).abs().max().item()}
            results["rows"].append(row)
            print(row, flush=True)
        del logits

    for kernel in ("torch", "triton"):
        for chunk in [int(c) for c in args.chunks.split(",")]:
            def loss_fn(x, kernel=kernel, chunk=chunk):
                return linear_cross_entropy(x, weight, targets, chunk_tokens=chunk, compiled=True, kernel=kernel)

            compiled = torch.compile(loss_fn, fullgraph=True)

            def step(compiled=compiled):
                hidden.grad = None
                compiled(hidden).backward()

            try:
                step()
                loss = compiled(hidden)
                loss.backward()
                ms = time_call(step, "cuda", warmup=2, repeats=10)
                err = (hidden.grad.float() - ref_grad).abs().max().item() / ref_grad.abs().max().item()
                row = {"kind": "loss", "kernel": kernel, "chunk": chunk, "ms": ms,
                       "loss_diff": abs(loss.item() - ref_loss.item()), "grad_rel_max_err": err}
            except Exception as exc:  # a failing variant is recorded, the others still run
                row = {"kind": "loss", "kernel": kernel, "chunk": chunk, "error": repr(exc)[:300]}
            results["rows"].append(row)
            print(row, flush=True)
    results["rows"].extend(swiglu_rows(args.tokens, args.intermediate))
    (args.out / "train_kernels.json").write_text(json.dumps(results, indent=2))
    return 0


def swiglu_rows(tokens: int, width: int) -> list[dict]:
    """The SwiGLU backward: compiled torch autograd vs the Triton kernel, one Llama MLP's size."""
    import torch
    import torch.nn.functional as F
    from hwrun.training.patches.swiglu import prepare_swiglu, swiglu

    prepare_swiglu()
    y = torch.randn(tokens, 2 * width, device="cuda").to(torch.bfloat16).requires_grad_()
    d_out = torch.randn(tokens, width, device="cuda").to(torch.bfloat16)
    y32 = y.detach().float().requires_grad_()
    gate, up = y32.chunk(2, dim=-1)
    (reference,) = torch.autograd.grad(F.silu(gate) * up, y32, d_out.float())
    bytes_moved = 5 * tokens * width * y.element_size()  # gate, up, d_out read; both halves written

    def plain(y):
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up

    rows = []
    for name, fn in (("inductor", torch.compile(plain, fullgraph=True)),
                     ("triton", torch.compile(lambda y: swiglu(y, "triton"), fullgraph=True))):
        def step(fn=fn):
            y.grad = None
            fn(y).backward(d_out)

        step()
        ms_fwd_bwd = time_call(step, "cuda", warmup=3, repeats=20)
        with torch.no_grad():
            ms_fwd = time_call(lambda fn=fn: fn(y), "cuda", warmup=3, repeats=20)
        row = {"kind": "swiglu", "kernel": name, "rows": tokens, "width": width, "fwd_bwd_ms": ms_fwd_bwd,
               "fwd_ms": ms_fwd, "bwd_ms": ms_fwd_bwd - ms_fwd,
               "bwd_gb_per_s": bytes_moved / (ms_fwd_bwd - ms_fwd) / 1e6,
               "grad_max_diff": (y.grad.float() - reference).abs().max().item(),
               "grad_max": reference.abs().max().item()}
        rows.append(row)
        print(row, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
