"""Time the training kernels of the kernel policy (hwrun's, Liger's, torch's own) against inductor's fusion of
the same torch code, on CUDA.

Developer script. The LoRA benchmark's sizes (hidden 2048, intermediate 8192, vocab 128256, 8 x 1024
tokens, 32/8 heads of 64, bf16):
  chunk rows    one (chunk, vocab) logits block: torch.compile(_chunk_loss_grad) vs ce_kernel.chunk_ce,
                with the bytes moved per ms (the kernel reads the block twice and writes it once)
  loss rows     linear + cross-entropy forward + backward over all 8192 tokens: hwrun's linear_cross_entropy
                under torch.compile(fullgraph=True) per chunk form and chunk size (the LM-head matmuls
                included), Liger's fused linear cross-entropy (eager and compiled) and torch's own chunked
                F.linear_cross_entropy where torch has it
  swiglu rows   the backward of silu(gate) * up: on one fused [gate | up] matmul output, the compiled torch
                autograd (a pointwise cat of both halves) vs hwrun's `swiglu` (its own torch backward, what
                the fused MLP runs); on separate gate and up, the compiled torch autograd vs Liger's kernel;
                with bytes moved per ms
  rmsnorm rows  Llama's RMSNorm forward + backward (tokens x hidden): compiled torch vs Liger vs F.rms_norm
  rope rows     Llama's rotation of q and k forward + backward: compiled torch vs Liger
Loss rows give the largest error of the loss and of d(loss)/d(hidden) against float32 cross-entropy over
the full logits; the other rows the largest difference of the gradient from float32 autograd. Median of
CUDA-event timings after warm-up. A row whose kernel cannot run here is recorded with the reason.
Usage: python tools/bench/train_kernels.py --out DIR [--chunks 1024,2048,4096]
       python tools/bench/train_kernels.py --out DIR --smoke   # tiny sizes on CPU: checks the script
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from attention import time_call  # noqa: E402
from bench_record import stamp  # noqa: E402

SMOKE = dict(tokens=64, hidden=32, vocab=1000, intermediate=48, heads=4, kv_heads=2, head_dim=16, chunks="32")


class Setup:
    """Where the rows run: the device, and how they compile (inductor on CUDA, aot_eager for the CPU smoke)."""

    def __init__(self, smoke: bool) -> None:
        import torch

        self.smoke = smoke
        self.device = "cpu" if smoke else "cuda"
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.backend = "aot_eager" if smoke else "inductor"
        self.repeats = 2 if smoke else 20

    def compile(self, fn, fullgraph: bool = True):
        import torch

        return torch.compile(fn, fullgraph=fullgraph, backend=self.backend)

    def time(self, fn, repeats: int | None = None) -> float:
        return time_call(fn, self.device, warmup=1 if self.smoke else 3, repeats=repeats or self.repeats)

    def cannot(self, source: str) -> str | None:
        """Why kernels from `source` (hwrun's Triton, liger) cannot run in this setup, or None."""
        if source == "liger" and importlib.util.find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install hwrun[liger])"
        if self.smoke and source in ("liger", "triton"):
            return f"{source} kernels are Triton GPU kernels; the CPU smoke skips them"
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--chunks", default="1024,2048,4096")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (compile via aot_eager)")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)

    import torch

    setup = Setup(args.smoke)
    if not args.smoke and not torch.cuda.is_available():
        print("No CUDA device: run on the H200, or pass --smoke to check the script on CPU.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"torch": torch.__version__, "device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(0),
               "shape": {"tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab,
                         "intermediate": args.intermediate}, "rows": []}
    for rows in (loss_rows(args, setup), swiglu_rows(args.tokens, args.intermediate, setup),
                 rmsnorm_rows(args.tokens, args.hidden, setup),
                 rope_rows(args.tokens, args.heads, args.kv_heads, args.head_dim, setup)):
        results["rows"].extend(rows)
    stamp(results, argv, libraries=("liger_kernel", "transformers"))
    (args.out / "train_kernels.json").write_text(json.dumps(results, indent=2))
    return 0


def _skip(row: dict, why: str) -> dict:
    row = {**row, "skipped": why}
    print(row, flush=True)
    return row


def loss_rows(args, setup: Setup) -> list[dict]:
    """The chunk rows and the loss rows (see the module doc)."""
    import torch
    from hwrun.training.patches.fused_loss import (
        _chunk_loss_grad,
        linear_cross_entropy,
        prepare_linear_cross_entropy,
    )

    rows: list[dict] = []
    triton_missing = setup.cannot("triton")
    prepare_linear_cross_entropy("torch" if triton_missing else "triton")  # before torch.compile traces it
    if triton_missing is None:
        from hwrun.training.patches.ce_kernel import chunk_ce
    torch.manual_seed(0)
    n, h, v, device = args.tokens, args.hidden, args.vocab, setup.device
    hidden = (torch.randn(n, h, device=device) * 0.5).to(setup.dtype).requires_grad_()
    weight = (torch.randn(v, h, device=device) * 0.02).to(setup.dtype)
    targets = torch.randint(0, v, (n,), device=device)
    targets[::97] = -100
    ref_hidden = hidden.detach().float().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref_hidden @ weight.float().t(), targets, ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_hidden)

    compiled_chunk = setup.compile(_chunk_loss_grad)
    chunks = [int(c) for c in args.chunks.split(",")]
    for chunk in chunks:
        logits = (hidden.detach()[:chunk] @ weight.t())
        t = targets[:chunk]
        scale = torch.tensor(1.0 / chunk, device=device)
        bytes_moved = 3 * logits.numel() * logits.element_size()
        expected = _chunk_loss_grad(logits, t, scale)
        for name, fn in (("inductor", compiled_chunk), ("triton", None if triton_missing else chunk_ce)):
            row = {"kind": "chunk", "kernel": name, "rows": chunk}
            if fn is None:
                rows.append(_skip(row, triton_missing))
                continue
            loss, grad = fn(logits, t, scale)
            ms = setup.time(lambda fn=fn, x=logits, t=t, s=scale: fn(x, t, s))
            row.update(ms=ms, gb_per_s=bytes_moved / ms / 1e6, loss_diff=abs(loss.item() - expected[0].item()),
                       grad_max_diff=(grad.float() - expected[1].float()).abs().max().item())
            rows.append(row)
            print(row, flush=True)
        del logits

    def measure(row: dict, loss_fn) -> dict:
        def step():
            hidden.grad = None
            loss_fn(hidden).backward()

        try:
            step()
            loss = loss_fn(hidden)
            loss.backward()
            ms = setup.time(step, repeats=2 if setup.smoke else 10)
            err = (hidden.grad.float() - ref_grad).abs().max().item() / ref_grad.abs().max().item()
            row.update(ms=ms, loss_diff=abs(loss.item() - ref_loss.item()), grad_rel_max_err=err)
        except Exception as exc:  # a failing variant is recorded, the others still run
            row["error"] = repr(exc)[:300]
        print(row, flush=True)
        return row

    for kernel in ("torch", "triton"):
        for chunk in chunks:
            row = {"kind": "loss", "kernel": kernel, "chunk": chunk}
            if kernel == "triton" and triton_missing:
                rows.append(_skip(row, triton_missing))
                continue
            rows.append(measure(row, setup.compile(
                lambda x, kernel=kernel, chunk=chunk: linear_cross_entropy(x, weight, targets, chunk_tokens=chunk,
                                                                           compiled=True, kernel=kernel))))
    liger_missing = setup.cannot("liger")
    liger_loss = None
    if liger_missing is None:
        from hwrun.training.patches.fused_loss import library_linear_cross_entropy

        liger_loss = library_linear_cross_entropy("liger")

    def liger_fn(x):
        return liger_loss(x, weight, targets)

    for compiled in (False, True):
        row = {"kind": "loss", "kernel": "liger", "compiled": compiled}
        if liger_missing:
            rows.append(_skip(row, liger_missing))
            continue
        rows.append(measure(row, setup.compile(liger_fn, fullgraph=False) if compiled else liger_fn))
    row = {"kind": "loss", "kernel": "torch_linear_cross_entropy"}
    from hwrun.training.kernel_policy import torch_has

    if not torch_has("cross_entropy"):
        rows.append(_skip(row, f"torch {torch.__version__} has no F.linear_cross_entropy with "
                               "LinearCrossEntropyOptions"))
    else:
        from hwrun.training.patches.fused_loss import library_linear_cross_entropy

        own = library_linear_cross_entropy("torch")
        rows.append(measure(row, lambda x: own(x, weight, targets)))
    return rows


def _grad_rows(kind: str, candidates, inputs, upstream, reference, bytes_moved: int, setup: Setup,
               extra: dict) -> list[dict]:
    """Forward + backward of each (name, fn or None, why) in `candidates` on `inputs` (leaves), timed, with the
    largest gradient difference from `reference` (float32 autograd)."""
    import torch

    rows = []
    for name, fn, why in candidates:
        row = {"kind": kind, "kernel": name, **extra}
        if fn is None:
            rows.append(_skip(row, why))
            continue

        def step(fn=fn):
            for x in inputs:
                x.grad = None
            outputs = fn(*inputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            torch.autograd.backward(outputs, upstream)

        try:
            step()
            ms_fwd_bwd = setup.time(step)
            with torch.no_grad():
                ms_fwd = setup.time(lambda fn=fn: fn(*inputs))
            diff = max((x.grad.float() - r).abs().max().item() for x, r in zip(inputs, reference, strict=True))
            row.update(fwd_bwd_ms=ms_fwd_bwd, fwd_ms=ms_fwd, bwd_ms=ms_fwd_bwd - ms_fwd,
                       bwd_gb_per_s=bytes_moved / max(ms_fwd_bwd - ms_fwd, 1e-6) / 1e6, grad_max_diff=diff,
                       grad_max=max(r.abs().max().item() for r in reference))
        except Exception as exc:  # a failing variant is recorded, the others still run
            row["error"] = repr(exc)[:300]
        rows.append(row)
        print(row, flush=True)
    return rows


def swiglu_rows(tokens: int, width: int, setup: Setup) -> list[dict]:
    """The SwiGLU backward, one Llama MLP's size: on the fused [gate | up] output (inductor's autograd vs hwrun's
    `swiglu` with its torch backward, both compiled), and on separate gate and up tensors (inductor vs Liger's
    kernel, as Liger's MLP runs it)."""
    import torch
    import torch.nn.functional as F

    device = setup.device
    y = torch.randn(tokens, 2 * width, device=device).to(setup.dtype).requires_grad_()
    d_out = torch.randn(tokens, width, device=device).to(setup.dtype)
    y32 = y.detach().float().requires_grad_()
    gate, up = y32.chunk(2, dim=-1)
    (reference,) = torch.autograd.grad(F.silu(gate) * up, y32, d_out.float())
    bytes_moved = 5 * tokens * width * y.element_size()  # gate, up, d_out read; both halves written

    def plain(y):
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up

    from hwrun.training.patches.swiglu import prepare_swiglu, swiglu

    prepare_swiglu()
    rows = _grad_rows("swiglu", [("inductor", setup.compile(plain), None), ("hwrun_torch", setup.compile(swiglu), None)],
                      [y], [d_out], [reference], bytes_moved, setup, {"rows": tokens, "width": width, "fused": True})

    a = y.detach()[:, :width].contiguous().requires_grad_()
    b = y.detach()[:, width:].contiguous().requires_grad_()
    ref_a, ref_b = reference[:, :width], reference[:, width:]
    liger_missing = setup.cannot("liger")
    liger = None
    if liger_missing is None:
        from hwrun.training.patches.library_kernels import liger_swiglu_function

        liger = liger_swiglu_function()
    rows += _grad_rows("swiglu", [("inductor", setup.compile(lambda a, b: F.silu(a) * b), None),
                                  ("liger", liger, liger_missing)],
                       [a, b], [d_out], [ref_a, ref_b], bytes_moved, setup,
                       {"rows": tokens, "width": width, "fused": False})
    return rows


def rmsnorm_rows(tokens: int, hidden: int, setup: Setup) -> list[dict]:
    """Llama's RMSNorm forward + backward on (tokens, hidden): compiled torch vs Liger vs torch's F.rms_norm."""
    import torch

    device = setup.device
    x = torch.randn(tokens, hidden, device=device).to(setup.dtype).requires_grad_()
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(setup.dtype).requires_grad_()
    d_out = torch.randn(tokens, hidden, device=device).to(setup.dtype)
    eps = 1e-5

    def llama(x, weight):
        h = x.float()
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    x32, w32 = x.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    reference = torch.autograd.grad(llama(x32, w32), (x32, w32), d_out.float())
    from hwrun.training.kernel_policy import torch_has
    from hwrun.training.patches.library_kernels import (
        liger_rmsnorm_function,
        torch_rmsnorm_function,
    )

    liger_missing = setup.cannot("liger")
    liger = None if liger_missing else liger_rmsnorm_function()
    own = torch_rmsnorm_function() if torch_has("rmsnorm") else None
    bytes_moved = 4 * tokens * hidden * x.element_size()  # x and d_out read twice-ish; dx written: a floor
    return _grad_rows("rmsnorm", [("inductor", setup.compile(llama), None),
                                  ("liger", None if liger is None else (lambda x, w: liger(x, w, eps)), liger_missing),
                                  ("torch_rms_norm", None if own is None else setup.compile(lambda x, w: own(x, w, eps)),
                                   "this torch has no F.rms_norm")],
                      [x, weight], [d_out], list(reference), bytes_moved, setup, {"rows": tokens, "hidden": hidden})


def rope_rows(tokens: int, heads: int, kv_heads: int, head_dim: int, setup: Setup) -> list[dict]:
    """Llama's rotation of q and k, forward + backward, `tokens` as 8 sequences: compiled torch vs Liger."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    device, batch = setup.device, 8
    seq = max(1, tokens // batch)
    q = torch.randn(batch, heads, seq, head_dim, device=device).to(setup.dtype).requires_grad_()
    k = torch.randn(batch, kv_heads, seq, head_dim, device=device).to(setup.dtype).requires_grad_()
    angles = torch.arange(seq, device=device).float()[:, None] / (10000 ** (torch.arange(0, head_dim, 2,
                                                                                        device=device) / head_dim))
    angles = torch.cat([angles, angles], dim=-1)[None]
    cos, sin = angles.cos().to(setup.dtype), angles.sin().to(setup.dtype)
    d_q, d_k = torch.randn_like(q), torch.randn_like(k)
    q32, k32 = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    reference = torch.autograd.grad(apply_rotary_pos_emb(q32, k32, cos.float(), sin.float()), (q32, k32),
                                    (d_q.float(), d_k.float()))
    liger_missing = setup.cannot("liger")
    liger = None
    if liger_missing is None:
        from hwrun.training.patches.library_kernels import liger_rope_function

        rotate = liger_rope_function()

        def liger(q, k):
            return rotate(q, k, cos, sin)
    bytes_moved = 4 * (q.numel() + k.numel()) * q.element_size()  # q, k and their gradients, read and written
    return _grad_rows("rope", [("inductor", setup.compile(lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)), None),
                               ("liger", liger, liger_missing)],
                      [q, k], [d_q, d_k], list(reference), bytes_moved, setup,
                      {"batch": batch, "seq": seq, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim})


if __name__ == "__main__":
    sys.exit(main())
