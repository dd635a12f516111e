"""Decode benchmark: plain Transformers vs hwrun's graph decode at batch 1 (with the memory roofline),
and total tokens/s at 1, 8, 32, 64 concurrent prompts for static vs continuous batching.

    python tools/bench/decode.py --out DIR            # H200: ~1.2B Llama from a config, random bf16 weights
    python tools/bench/decode.py --out DIR --smoke    # tiny model, runs on CPU

Writes DIR/decode.json, DIR/decode.md and DIR/decode.png; prints the table. Each section is
saved as soon as it finishes, so a run cut short keeps what it measured.
Roofline: at batch 1 every token reads all weights once, so tokens/s <= copy bandwidth / weight
bytes; the device copy bandwidth is measured in the same run (2 x bytes per copy / time).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(p) for p in sorted((Path(__file__).resolve().parents[2] / "packages").glob("*/src"))]

FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=4096)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=512)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats):
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device, nbytes, repeats=10):
    """Device-to-device copy bandwidth in bytes/s (read + write counted, as in STREAM copy)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() * src.element_size() / seconds


def build_model(sizes, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**sizes, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs on CPU")
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--batches", default=None, help="comma-separated concurrency levels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--autotune", action="store_true",
                        help="add a row compiled with mode='max-autotune-no-cudagraphs' (minutes of autotuning)")
    parser.add_argument("--profile", action="store_true",
                        help="write profile-decode-*.txt: kernel tables of the compiled steps (run without graphs)")
    parser.add_argument("--skip-hf-compile", action="store_true",
                        help="skip Transformers' static cache + automatic compile row (slow to compile)")
    parser.add_argument("--skip-batch1", action="store_true", help="only the concurrency table")
    parser.add_argument("--skip-generate-batch", action="store_true",
                        help="leave out Transformers' generate_batch rows (slowest at 64 prompts)")
    parser.add_argument("--concurrency-compile", default="inductor", choices=("inductor", "none"),
                        help="compile backend of hwrun's decoders in the concurrency table (hwrun's default: inductor)")
    args = parser.parse_args(argv)

    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = SMOKE if args.smoke else FULL
    prompt_len = args.prompt_len or (16 if args.smoke else 128)
    new_tokens = args.new_tokens or (16 if args.smoke else 256)
    batches = [int(b) for b in (args.batches or ("1,2,4" if args.smoke else "1,8,32,64")).split(",")]
    if device.type != "cuda" and not args.smoke:
        print("no CUDA device: run with --smoke on CPU", file=sys.stderr)
        return 2

    import transformers
    from hwrun.inference.batching import cb_config, workload_cb_config
    from hwrun.inference.decode.slots import SlotDecoder
    from hwrun.inference.decode.static import GraphDecoder

    model = build_model(sizes, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(device, min(2**30, 8 * weight_bytes))
    roofline = bandwidth / weight_bytes
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": str(dtype),
        "parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes,
        "copy_bandwidth_bytes_per_s": bandwidth, "roofline_tokens_per_s": roofline,
        "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": args.repeats, "batch1": [], "batching": [],
    }

    def save():
        (out / "decode.json").write_text(json.dumps(results, indent=2))

    save()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, sizes["vocab_size"], (1, prompt_len), generator=gen).to(device)

    def add_batch1(name, seconds, extra=None):
        tps = new_tokens / seconds
        results["batch1"].append({"name": name, "seconds": seconds, "tokens_per_s": tps,
                                  "fraction_of_roofline": tps / roofline, **(extra or {})})
        print(f"batch 1  {name:45s} {tps:10.1f} tokens/s  {tps / roofline:6.1%} of roofline", flush=True)
        save()

    # --- batch 1 -------------------------------------------------------------------------------
    if not args.skip_batch1:
        with torch.inference_mode():
            ref = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0, prompt_len:]
            add_batch1("transformers generate (defaults)", timed(
                lambda: model.generate(prompt, max_new_tokens=new_tokens, do_sample=False), device, args.repeats))
            if not args.skip_hf_compile and device.type == "cuda":
                start = time.perf_counter()
                model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
                warm = time.perf_counter() - start
                add_batch1("transformers static cache + auto compile", timed(
                    lambda: model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                           cache_implementation="static"), device, args.repeats), {"warmup_s": warm})
            variants = [("hwrun graph decode, model step (StaticCache, CUDA graph)", None, None, "model"),
                        ("hwrun graph decode, model step + inductor", "inductor", None, "model"),
                        ("hwrun graph decode, fused step (CUDA graph)", None, None, "fused"),
                        ("hwrun graph decode, fused step + inductor (hwrun default)", "inductor", None, "fused"),
                        ("hwrun graph decode, fused step + inductor + coordinate-descent tuning (tune=True)",
                         "inductor", "tune", "fused")]
            if args.autotune:
                variants.append(("hwrun graph decode, fused step + inductor max-autotune-no-cudagraphs", "inductor",
                                 "max-autotune-no-cudagraphs", "fused"))
            eager_tokens = None
            for label, backend, mode, step in variants:
                if backend and device.type != "cuda":
                    continue
                try:
                    start = time.perf_counter()
                    decoder = GraphDecoder(model, batch_size=1, max_cache_len=prompt_len + new_tokens,
                                           compile_backend=backend, compile_mode=None if mode == "tune" else mode,
                                           tune=mode == "tune", step=step)
                    first = decoder.generate(prompt, new_tokens, eos_token_id=None)[0]
                    warm = time.perf_counter() - start
                    same = bool(torch.equal(first, ref))
                    if eager_tokens is None:  # the same static-cache step, run eagerly (no graph): same kernels
                        eager = GraphDecoder(model, batch_size=1, max_cache_len=prompt_len + new_tokens, use_graphs=False,
                                             step="model")
                        eager_tokens = eager.generate(prompt, new_tokens, eos_token_id=None)[0]
                        del eager
                    agree = int((first == ref).int().cumprod(0).sum())
                    seconds = timed(lambda d=decoder: d.generate(prompt, new_tokens, eos_token_id=None), device,
                                    args.repeats)
                    add_batch1(label, seconds, {"warmup_s": warm, "graphs": decoder.use_graphs, "step": step,
                                                "tokens_equal_generate": same, "tokens_agreeing_with_generate": agree,
                                                "tokens_equal_eager_step": bool(torch.equal(first, eager_tokens))})
                    if args.profile and backend and device.type == "cuda":
                        profile_step(decoder, prompt, out / f"profile-decode-{step}{'-' + mode if mode else ''}.txt")
                    del decoder
                except Exception as exc:  # noqa: BLE001 - record and keep measuring the rest
                    results["batch1"].append({"name": label, "error": f"{type(exc).__name__}: {exc}"})
                    print(f"batch 1  {label}: FAILED {type(exc).__name__}: {exc}", flush=True)
                    save()
            if device.type == "cuda":
                torch._dynamo.reset()

    # --- concurrency ---------------------------------------------------------------------------
    from transformers import ContinuousBatchingConfig, GenerationConfig

    for batch in batches:
        prompts = torch.randint(1, sizes["vocab_size"], (batch, prompt_len), generator=gen).to(device)
        row = {"batch": batch}
        with torch.inference_mode():
            seconds = timed(lambda p=prompts: model.generate(p, max_new_tokens=new_tokens, do_sample=False,
                                                             attention_mask=torch.ones_like(p)), device, 1)
            row["static_tokens_per_s"] = batch * new_tokens / seconds
            backend = None if args.concurrency_compile == "none" or device.type != "cuda" else "inductor"
            row["hwrun_compile"] = str(backend)
            lists = prompts.tolist()
            decoders = (  # hwrun's static graph batch, and its slot-based continuous batching
                ("hwrun_graphs", lambda b=batch, c=backend: GraphDecoder(model, batch_size=b, max_cache_len=prompt_len + new_tokens,
                                                              compile_backend=c),
                 lambda d, p=prompts: d.generate(p, new_tokens, eos_token_id=None).tolist()),
                ("hwrun_slots", lambda b=batch, c=backend: SlotDecoder(model, slots=b, max_cache_len=prompt_len + new_tokens,
                                                            compile_backend=c),
                 lambda d, p=lists: d.generate(p, new_tokens, eos_token_id=None)),
            )
            if batch == max(batches):  # the same loop, waking the host once per request instead of every 16 steps
                decoders += (("hwrun_slots_one_sync", lambda b=batch, c=backend: SlotDecoder(
                    model, slots=b, max_cache_len=prompt_len + new_tokens, compile_backend=c, check_every=new_tokens),
                    decoders[1][2]),)
            produced = {}
            for key, build, run in decoders:
                try:
                    start = time.perf_counter()
                    decoder = build()
                    produced[key] = run(decoder)
                    assert all(len(r) == new_tokens for r in produced[key]), "a row ended early"
                    row[f"{key}_warmup_s"] = time.perf_counter() - start
                    seconds = timed(lambda d=decoder, r=run: r(d), device, 1)
                    row[f"{key}_tokens_per_s"] = batch * new_tokens / seconds
                    del decoder
                except Exception as exc:  # noqa: BLE001
                    row[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
            if {"hwrun_graphs", "hwrun_slots"} <= produced.keys():  # same arithmetic, other kernels: bf16 rows agree for a prefix at least
                pairs = zip(produced["hwrun_graphs"], produced["hwrun_slots"], strict=True)
                agree = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a)) for a, b in pairs]
                row["slots_tokens_agreeing_with_graphs_median"] = sorted(agree)[len(agree) // 2]
            if device.type == "cuda":
                torch._dynamo.reset()
        ids = prompts.tolist()
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        cb_variants = [("continuous", workload_cb_config(device.type, [prompt_len] * batch, new_tokens))]
        if batch == max(batches) and device.type == "cuda" and not args.skip_hf_compile:
            with torch.inference_mode():
                def static_cache(p=prompts):
                    model.generate(p, max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(p),
                                   cache_implementation="static")
                seconds = timed(static_cache, device, 1)
                row["static_cache_compile_tokens_per_s"] = batch * new_tokens / seconds
        if batch == max(batches):
            if device.type == "cuda":
                cb_variants.append(("continuous_transformers_defaults",
                                    cb_config(ContinuousBatchingConfig, auto_switch_to_flash=False)))
        for key, cb in ([] if args.skip_generate_batch else cb_variants):
            try:
                def run(i=ids, c=cb, g=config):
                    extra = {"warmup": True} if "warmup" in inspect.signature(model.generate_batch).parameters else {}
                    outputs = model.generate_batch(i, generation_config=g, continuous_batching_config=c, **extra)
                    assert len(outputs) == len(i) and all(len(o.generated_tokens) == new_tokens
                                                          for o in outputs.values())
                seconds = timed(run, device, 1)
                row[f"{key}_tokens_per_s"] = batch * new_tokens / seconds
            except Exception as exc:  # noqa: BLE001
                row[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
        if "continuous_tokens_per_s" in row:
            row["continuous_over_static"] = row["continuous_tokens_per_s"] / row["static_tokens_per_s"]
        if "hwrun_slots_tokens_per_s" in row:
            row["slots_over_static"] = row["hwrun_slots_tokens_per_s"] / row["static_tokens_per_s"]
            if "static_cache_compile_tokens_per_s" in row:  # the goal: >= 2x this at 64 prompts
                row["slots_over_static_cache_compile"] = (row["hwrun_slots_tokens_per_s"]
                                                          / row["static_cache_compile_tokens_per_s"])
        results["batching"].append(row)
        print(f"batch {batch:3d} " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in row.items() if k != "batch"), flush=True)
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    write_report(results, out)
    return 0


def profile_step(decoder, prompt, path):
    """Kernel table of 20 compiled decode steps run without the graph (same kernels, launch by launch)."""
    import torch

    with torch.inference_mode():
        decoder._prefill(prompt)
        for _ in range(3):
            decoder._step_fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                decoder._step_fn()
            torch.cuda.synchronize()
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40,
                                              max_name_column_width=90))


def write_report(results, out):
    """decode.md (tables) and decode.png (two panels) from the results dict."""
    lines = [
        f"Device: {results['device']}; torch {results['torch']}, transformers {results['transformers']}; "
        f"{results['parameters'] / 1e9:.2f}B parameters ({results['weight_bytes'] / 1e9:.2f} GB, {results['dtype']}); "
        f"prompt {results['prompt_len']} tokens, {results['new_tokens']} new tokens, median of {results['repeats']}.",
        "",
        f"Measured copy bandwidth {results['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s -> batch-1 roofline "
        f"{results['roofline_tokens_per_s']:,.0f} tokens/s.",
        "",
        "| batch 1 | tokens/s | fraction of roofline | vs transformers defaults | warm-up s | tokens equal generate "
        "(first N agree) | tokens equal eager step |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    base = next((r["tokens_per_s"] for r in results["batch1"] if "tokens_per_s" in r), None)
    for r in results["batch1"]:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['tokens_per_s']:,.1f} | {r['fraction_of_roofline']:.1%} | "
                     f"{r['tokens_per_s'] / base:.2f}x | {r.get('warmup_s', 0):.1f} | "
                     f"{r.get('tokens_equal_generate', '')} ({r.get('tokens_agreeing_with_generate', '')}) | "
                     f"{r.get('tokens_equal_eager_step', '')} |")
    lines += ["", "Total tokens/s. hwrun's decoders are compiled with the backend shown (warm-up seconds in "
              "brackets: compile, tuning and graph capture, paid once per batch size).", "",
              "| concurrent prompts | static generate | static cache + auto compile | hwrun graphs (static batch) | "
              "hwrun continuous (slots, graphs) | continuous generate_batch, hwrun config | "
              "continuous generate_batch, Transformers defaults | hwrun continuous / static generate | compile |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results["batching"]:
        def cell(key, r=r):
            if key not in r:
                return "failed" if key.replace("tokens_per_s", "error") in r else ""
            warm = r.get(key.replace("tokens_per_s", "warmup_s"))
            return f"{r[key]:,.0f}" + (f" ({warm:.0f} s)" if warm else "")
        ratio = f"{r['slots_over_static']:.2f}x" if "slots_over_static" in r else ""
        lines.append(f"| {r['batch']} | {cell('static_tokens_per_s')} | {cell('static_cache_compile_tokens_per_s')} | "
                     f"{cell('hwrun_graphs_tokens_per_s')} | {cell('hwrun_slots_tokens_per_s')} | "
                     f"{cell('continuous_tokens_per_s')} | "
                     f"{cell('continuous_transformers_defaults_tokens_per_s')} | {ratio} | {r.get('hwrun_compile', '')} |")
    for r in results["batching"]:
        if "slots_over_static_cache_compile" in r:
            lines += ["", f"At {r['batch']} prompts hwrun's continuous batching gives "
                          f"{r['slots_over_static_cache_compile']:.2f}x Transformers' static cache + compile figure."]
    errors = [f"- batch {r['batch']}: {k}: {v}" for r in results["batching"] for k, v in r.items() if k.endswith("error")]
    if errors:
        lines += ["", "Errors:", *errors]
    text = "\n".join(lines) + "\n"
    (out / "decode.md").write_text(text)
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no decode.png", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    ok = [r for r in results["batch1"] if "tokens_per_s" in r]
    left.barh([r["name"] for r in ok], [r["tokens_per_s"] for r in ok], color="tab:blue")
    left.axvline(results["roofline_tokens_per_s"], color="red", linestyle="--", label="roofline")
    left.axvline(0.5 * results["roofline_tokens_per_s"], color="orange", linestyle=":", label="50% roofline")
    left.set_xlabel("tokens/s (batch 1)")
    left.legend()
    left.set_title("batch-1 decode")
    for key, label in (("static_tokens_per_s", "static generate"), ("hwrun_graphs_tokens_per_s", "hwrun graphs"),
                       ("hwrun_slots_tokens_per_s", "hwrun continuous (slots, graphs)"),
                       ("continuous_tokens_per_s", "continuous batching (hwrun config)"),
                       ("static_cache_compile_tokens_per_s", "static cache + auto compile"),
                       ("continuous_transformers_defaults_tokens_per_s", "continuous (Transformers defaults)")):
        pts = [(r["batch"], r[key]) for r in results["batching"] if key in r]
        if pts:
            right.plot(*zip(*pts, strict=True), marker="o", label=label)
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("concurrent prompts")
    right.set_ylabel("total tokens/s")
    right.legend()
    right.set_title("throughput")
    fig.tight_layout()
    fig.savefig(out / "decode.png", dpi=120)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
