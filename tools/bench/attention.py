"""Benchmark hwattn.sdpa's native grouped-query attention against the repeat-KV path and eager attention.

Side by side in one run, on the same q/k/v tensors (GQA: 32 query heads, 8 KV heads, head dim
128, bf16, batch 1, sequence 1k-16k), for each sequence length:
  * native  -- hwattn.sdpa(..., enable_gqa=True): SDPA reads the 8 KV heads as they are;
  * auto    -- hwattn.sdpa(..., enable_gqa=None): what hwattn/Transformers pick on this device
               (Transformers' use_gqa_in_sdpa rule), reported with the path it chose;
  * repeat  -- hwattn.sdpa(..., enable_gqa=False): KV heads repeated to 32 first (repeat_kv);
  * eager   -- hwattn.eager_attention(..., upcast=False): matmul/softmax/matmul in bf16, as
               Transformers' eager attention does.
Causal without a mask (the prefill case where CUDA SDPA uses its fused kernels), plus a padded
boolean-mask series at the shorter lengths (where Transformers' rule repeats KV on CUDA).
Median time over repeats (CUDA events, warm-up first), peak extra memory of one call
(torch.cuda.max_memory_allocated above the inputs), max |difference| to eager, and ratios.

    python tools/bench/attention.py --out DIR            # CUDA (H200): writes DIR/attention.{json,md,png}
    python tools/bench/attention.py --out DIR --smoke    # tiny sizes, CPU ok
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import hwattn
import hwenv
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

FULL = dict(heads=32, kv_heads=8, head_dim=128, batch=1, seqs=[1024, 2048, 4096, 8192, 16384],
            masked_seqs=[1024, 2048, 4096], warmup=3, repeats=10, dtype="bfloat16")
SMOKE = dict(heads=8, kv_heads=2, head_dim=16, batch=1, seqs=[32, 64], masked_seqs=[32],
             warmup=1, repeats=3, dtype="float32")
VARIANTS = ("native", "auto", "repeat", "eager")


def make_inputs(sizes: dict, seq: int, device: str, dtype: torch.dtype, masked: bool):
    """Fixed random q/k/v (batch, heads, seq, dim) and, for the masked series, a left-padding + causal bool mask."""
    generator = torch.Generator(device="cpu").manual_seed(seq)
    shape_q = (sizes["batch"], sizes["heads"], seq, sizes["head_dim"])
    shape_kv = (sizes["batch"], sizes["kv_heads"], seq, sizes["head_dim"])
    q, k, v = (torch.randn(s, generator=generator).to(device=device, dtype=dtype) for s in (shape_q, shape_kv, shape_kv))
    mask = None
    if masked:
        mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None, None].repeat(sizes["batch"], 1, 1, 1)
        mask[..., : seq // 8] = False  # the first eighth is padding ...
        mask[..., seq // 8] = True  # ... and every row keeps one key
    return q, k, v, mask


def call(variant: str, q, k, v, mask):
    """One attention call of the given variant (causal when there is no mask)."""
    causal = mask is None
    if variant == "eager":
        return hwattn.eager_attention(q, k, v, attn_mask=mask, is_causal=causal, upcast=False)
    enable = {"native": True, "repeat": False, "auto": None}[variant]
    return hwattn.sdpa(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=enable)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def shape_parser(description: str) -> argparse.ArgumentParser:
    """The attention micro-benchmarks' arguments: --out and the LoRA benchmark's attention shape
    (batch 8, 32 query / 8 KV heads, head dim 64, sequence 1024)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1024)
    return parser


def time_call(fn, device: str, warmup: int, repeats: int) -> float:
    """Median milliseconds of `fn()`: CUDA events on CUDA, perf_counter elsewhere; warm-up first."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def peak_extra_bytes(fn, device: str) -> int | None:
    """Peak memory one call allocates above what is already allocated (None off CUDA)."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def measure(sizes: dict, seq: int, device: str, dtype: torch.dtype, masked: bool) -> dict:
    """All variants on the same inputs for one sequence length."""
    q, k, v, mask = make_inputs(sizes, seq, device, dtype, masked)
    row: dict = {"seq": seq, "masked": masked,
                 "auto_path": "native" if hwattn.uses_native_gqa(q, k, v, mask) else "repeat"}
    outputs = {}
    for variant in VARIANTS:
        fn = functools.partial(call, variant, q, k, v, mask)
        try:
            outputs[variant] = fn()
            row[f"{variant}_ms"] = time_call(fn, device, sizes["warmup"], sizes["repeats"])
            row[f"{variant}_peak_bytes"] = peak_extra_bytes(fn, device)
        except (RuntimeError, torch.OutOfMemoryError) as error:
            if not is_oom(error):
                raise
            row[f"{variant}_ms"] = None
            row[f"{variant}_peak_bytes"] = None
            row[f"{variant}_error"] = "out of memory"
            outputs.pop(variant, None)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    reference = outputs.get("eager")
    for variant in ("native", "auto", "repeat"):
        if reference is not None and variant in outputs:
            row[f"{variant}_max_abs_diff_vs_eager"] = (outputs[variant].float() - reference.float()).abs().max().item()
    if "native" in outputs and "repeat" in outputs:
        row["native_vs_repeat_max_abs_diff"] = (outputs["native"].float() - outputs["repeat"].float()).abs().max().item()
    native_ms = row.get("native_ms")
    for other in ("repeat", "eager"):
        other_ms = row.get(f"{other}_ms")
        row[f"{other}_over_native_time"] = other_ms / native_ms if native_ms and other_ms else None
        mem_native, mem_other = row.get("native_peak_bytes"), row.get(f"{other}_peak_bytes")
        row[f"{other}_over_native_memory"] = mem_other / mem_native if mem_native and mem_other else None
    if native_ms:
        flops = 4 * sizes["batch"] * sizes["heads"] * seq * seq * sizes["head_dim"] * 0.5  # causal half
        row["native_tflops"] = flops / (native_ms * 1e-3) / 1e12
    del q, k, v, mask, outputs, reference
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def fmt_ms(value) -> str:
    return "OOM" if value is None else f"{value:.3f}"


def fmt_mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f}"


def fmt_ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(result: dict) -> str:
    """The table: one row per (series, sequence length), times, memory, ratios, errors."""
    s = result["sizes"]
    lines = [
        f"GQA attention: {s['heads']} query heads, {s['kv_heads']} KV heads, head dim {s['head_dim']}, "
        f"batch {s['batch']}, {s['dtype']}, on {result['device_name']} (torch {result['torch']}). "
        "Median of repeats; memory = peak allocated by one call above the inputs. "
        "`auto` is hwattn.sdpa(enable_gqa=None); its path is the Transformers rule's choice.",
        "",
        "| series | seq | native ms | auto ms (path) | repeat ms | eager ms | native MiB | repeat MiB | eager MiB "
        "| repeat/native time | eager/native time | repeat/native mem | eager/native mem | native TFLOP/s "
        "| max abs diff native vs eager |",
        "|---" * 15 + "|",
    ]
    for row in result["rows"]:
        diff = row.get("native_max_abs_diff_vs_eager")
        tflops = row.get("native_tflops")
        lines.append(
            f"| {'masked' if row['masked'] else 'causal'} | {row['seq']} | {fmt_ms(row.get('native_ms'))} | "
            f"{fmt_ms(row.get('auto_ms'))} ({row['auto_path']}) | {fmt_ms(row.get('repeat_ms'))} | "
            f"{fmt_ms(row.get('eager_ms'))} | {fmt_mib(row.get('native_peak_bytes'))} | "
            f"{fmt_mib(row.get('repeat_peak_bytes'))} | {fmt_mib(row.get('eager_peak_bytes'))} | "
            f"{fmt_ratio(row.get('repeat_over_native_time'))} | {fmt_ratio(row.get('eager_over_native_time'))} | "
            f"{fmt_ratio(row.get('repeat_over_native_memory'))} | {fmt_ratio(row.get('eager_over_native_memory'))} | "
            f"{'n/a' if tflops is None else f'{tflops:.1f}'} | {'n/a' if diff is None else f'{diff:.2e}'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Time and peak memory against sequence length (log-log), causal series, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if not r["masked"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant in ("native", "repeat", "eager"):
        seqs = [r["seq"] for r in rows if r.get(f"{variant}_ms") is not None]
        axes[0].plot(seqs, [r[f"{variant}_ms"] for r in rows if r.get(f"{variant}_ms") is not None], "o-", label=variant)
        mem = [(r["seq"], r[f"{variant}_peak_bytes"] / 2**20) for r in rows if r.get(f"{variant}_peak_bytes")]
        if mem:
            axes[1].plot(*zip(*mem, strict=True), "o-", label=variant)
    axes[0].set(title="time per call (median)", xlabel="sequence length", ylabel="ms", xscale="log", yscale="log")
    axes[1].set(title="peak extra memory per call", xlabel="sequence length", ylabel="MiB", xscale="log",
                yscale="log")
    if not any(line for line in axes[1].get_lines()):
        axes[1].text(0.5, 0.5, "memory is measured on CUDA only", ha="center", transform=axes[1].transAxes)
    for axis in axes:
        if axis.get_lines():
            axis.legend()
        axis.grid(True, which="both", alpha=0.3)
    s = result["sizes"]
    fig.suptitle(f"GQA {s['heads']}q/{s['kv_heads']}kv, head dim {s['head_dim']}, {s['dtype']}, causal - "
                 f"{result['device_name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="directory for attention.json/.md/.png")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (runs on CPU)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--seqs", default=None, help="comma-separated sequence lengths (override)")
    args = parser.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    if args.seqs:
        sizes["seqs"] = [int(x) for x in args.seqs.split(",")]
        sizes["masked_seqs"] = [x for x in sizes["masked_seqs"] if x in sizes["seqs"]]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not args.smoke and not device.startswith("cuda"):
        parser.error("the full benchmark needs a CUDA GPU; use --smoke on CPU")
    dtype = getattr(torch, sizes["dtype"])
    accel = hwenv.detect()
    result = {
        "bench": "attention", "smoke": args.smoke, "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__, "python": sys.version.split()[0], "accelerator": accel.to_dict(),
        "resolve_auto": hwattn.resolve_attention(accel, "auto").to_dict(), "sizes": sizes, "rows": [],
    }
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    for masked, seqs in ((False, sizes["seqs"]), (True, sizes["masked_seqs"])):
        for seq in seqs:
            row = measure(sizes, seq, device, dtype, masked)
            result["rows"].append(row)
            print(f"{'masked' if masked else 'causal'} seq={seq}: native {fmt_ms(row.get('native_ms'))} ms, "
                  f"repeat {fmt_ms(row.get('repeat_ms'))} ms, eager {fmt_ms(row.get('eager_ms'))} ms", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp(result, argv, libraries=("hwattn", "hwenv"))
    (args.out / "attention.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (args.out / "attention.md").write_text(table)
    plot(result, args.out / "attention.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
