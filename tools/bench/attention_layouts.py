"""Time causal GQA attention forward + backward as the LoRA benchmark's model calls it, per kernel.

Developer script. The shape of tools/bench/train.py (batch 8, 32 query / 8 KV heads, head dim 64,
sequence 1024, bf16, causal, no mask). Rows:
  sdpa_<backend>_bhsd   torch SDPA on contiguous (batch, heads, seq, dim) tensors (sdpa_backends.py)
  sdpa_<backend>_model  the layout inside a Transformers Llama: projections are (batch, seq, heads,
                        dim) and SDPA gets `.transpose(1, 2)` views; the output goes back the same way
  flex_compiled         torch.compile(flex_attention) with a causal block mask, enable_gqa
  cudnn_mixed           cuDNN with q/k contiguous in (batch, heads, seq, dim) and v a transposed view, as
                        inductor hands them over in a compiled Llama
  cudnn_aligned_bshd / cudnn_aligned_bhsd  the same inputs copied to one layout first
  fa4_func              flash_attn.cute.flash_attn_func (flash-attn-4, carried wheels), eager
Rows with a reference also report the largest difference of output and gradients from SDPA's
default backend on the model layout.
Usage: python tools/bench/attention_layouts.py --out DIR
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from attention import shape_parser, time_call  # noqa: E402
from bench_record import stamp  # noqa: E402


def main(argv=None):
    args = shape_parser(__doc__.splitlines()[0]).parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    b, h, kvh, d, s = args.batch, args.heads, args.kv_heads, args.dim, args.seq
    torch.manual_seed(0)
    q_bshd = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k_bshd = torch.randn(b, s, kvh, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v_bshd = torch.randn(b, s, kvh, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_bshd = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q_bhsd = q_bshd.detach().transpose(1, 2).contiguous().requires_grad_()
    k_bhsd = k_bshd.detach().transpose(1, 2).contiguous().requires_grad_()
    v_bhsd = v_bshd.detach().transpose(1, 2).contiguous().requires_grad_()
    grad_bhsd = grad_bshd.transpose(1, 2).contiguous()
    flops = 4 * b * h * s * s * d / 2 * 3.5  # causal fwd + 2.5x bwd
    results = {"shape": dict(batch=b, heads=h, kv_heads=kvh, dim=d, seq=s), "torch": torch.__version__,
               "device": torch.cuda.get_device_name(0), "rows": []}

    def reference():
        for t in (q_bshd, k_bshd, v_bshd):
            t.grad = None
        o = F.scaled_dot_product_attention(q_bshd.transpose(1, 2), k_bshd.transpose(1, 2), v_bshd.transpose(1, 2),
                                           is_causal=True, enable_gqa=True).transpose(1, 2)
        o.backward(grad_bshd)
        return o.detach().clone(), [t.grad.clone() for t in (q_bshd, k_bshd, v_bshd)]

    ref_out, ref_grads = reference()

    def record(name, step, bshd_fn=None):
        row = {"kernel": name}
        try:
            if bshd_fn is not None:  # correctness against SDPA first
                for t in (q_bshd, k_bshd, v_bshd):
                    t.grad = None
                o = bshd_fn(q_bshd, k_bshd, v_bshd)
                o.backward(grad_bshd)
                row["max_out_diff"] = (o.detach().float() - ref_out.float()).abs().max().item()
                row["max_grad_diff"] = max((t.grad.float() - g.float()).abs().max().item()
                                           for t, g in zip((q_bshd, k_bshd, v_bshd), ref_grads, strict=True))
            ms = time_call(step, "cuda", warmup=5, repeats=30)
            row.update(fwd_bwd_ms=ms, tflops=flops / ms / 1e9)
        except Exception as exc:  # a kernel that refuses or fails is a row, not the end of the script
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}" if str(exc) else type(exc).__name__
            traceback.print_exc()
        results["rows"].append(row)
        print(row, flush=True)

    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for name, backend in backends.items():
        def sdpa_call(q, k, v, backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        record(f"sdpa_{name}_bhsd", lambda f=sdpa_call: f(q_bhsd, k_bhsd, v_bhsd).backward(grad_bhsd))

        def model_layout(q, k, v, f=sdpa_call):
            return f(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

        record(f"sdpa_{name}_model", lambda f=model_layout: f(q_bshd, k_bshd, v_bshd).backward(grad_bshd), model_layout)

    # The layouts a compiled Llama can hand SDPA: inductor writes RoPE's q/k contiguous in
    # (batch, heads, seq, dim) while v stays a transposed view of its (batch, seq, heads, dim) projection
    def cudnn(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def mixed(q, k, v):  # q, k BHSD-contiguous, v BSHD memory, output back to BSHD
        return cudnn(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2)).transpose(1, 2)

    def aligned_bshd(q, k, v):  # the mixed inputs, all copied to BSHD memory first (hwattn.causal's fix)
        qh, kh = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        qh, kh = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (qh, kh))
        return cudnn(qh, kh, v.transpose(1, 2)).transpose(1, 2)

    def aligned_bhsd(q, k, v):  # the mixed inputs with v copied to BHSD memory
        return cudnn(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                     v.transpose(1, 2).contiguous()).transpose(1, 2)

    for name, fn in (("cudnn_mixed", mixed), ("cudnn_aligned_bshd", aligned_bshd), ("cudnn_aligned_bhsd", aligned_bhsd)):
        record(name, lambda f=fn: f(q_bshd, k_bshd, v_bshd).backward(grad_bshd), fn)

    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        mask = create_block_mask(lambda _b, _h, qi, ki: qi >= ki, None, None, s, s, device="cuda")
        flex = torch.compile(flex_attention)

        def flex_bshd(q, k, v):
            return flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask,
                        enable_gqa=True).transpose(1, 2)

        record("flex_compiled", lambda: flex_bshd(q_bshd, k_bshd, v_bshd).backward(grad_bshd), flex_bshd)
    except Exception as exc:
        results["rows"].append({"kernel": "flex_compiled", "error": str(exc)[:300]})

    try:
        from flash_attn.cute import flash_attn_func

        def fa4_func(q, k, v):
            o = flash_attn_func(q, k, v, causal=True)
            return o[0] if isinstance(o, tuple) else o

        record("fa4_func", lambda: fa4_func(q_bshd, k_bshd, v_bshd).backward(grad_bshd), fa4_func)
    except Exception as exc:
        traceback.print_exc()
        results["rows"].append({"kernel": "fa4", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})

    stamp(results, argv, libraries=("flash_attn",))
    (out / "attention_layouts.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
