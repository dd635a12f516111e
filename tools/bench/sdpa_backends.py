"""Time torch SDPA's CUDA backends (cuDNN, flash, memory-efficient) forward + backward at one shape.

Developer script: the LoRA benchmark's attention shape by default (batch 8, 32 query / 8 KV heads,
head dim 64, sequence 1024, bf16, causal, no mask). Each backend is forced with
torch.nn.attention.sdpa_kernel; GQA natively (enable_gqa=True) and with KV repeated; a backend
that refuses an input is recorded as such. Median of CUDA-event timings after warm-up.
Usage: python tools/bench/sdpa_backends.py --out DIR [--batch 8 --heads 32 --kv-heads 8 --dim 64 --seq 1024]
"""

from __future__ import annotations

import json
import sys
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
    shape = dict(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, dim=args.dim, seq=args.seq)
    q = torch.randn(args.batch, args.heads, args.seq, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(args.batch, args.kv_heads, args.seq, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grad = torch.randn_like(q)
    rep = args.heads // args.kv_heads
    flops = 4 * args.batch * args.heads * args.seq * args.seq * args.dim / 2 * 3.5  # causal fwd + 2.5x bwd
    results = {"shape": shape, "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": []}
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for name, backend in backends.items():
        for gqa in (True, False):
            def step(backend=backend, gqa=gqa):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
                if backend is None:  # torch's own choice
                    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                else:
                    with sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                o.backward(grad)
            row = {"backend": name, "gqa": "native" if gqa else "repeat"}
            try:
                ms = time_call(step, "cuda", warmup=3, repeats=20)
                row.update(fwd_bwd_ms=ms, tflops=flops / ms / 1e9)
            except RuntimeError as exc:
                row["error"] = str(exc).splitlines()[0][:200]
            results["rows"].append(row)
            print(row, flush=True)
    stamp(results, argv)
    (out / "sdpa_backends.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
