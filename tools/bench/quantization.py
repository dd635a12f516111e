"""Quantized decode benchmark (issue 43.3): bf16 vs torchao int8 and int4 weight-only through hwrun's public API.

    python tools/bench/quantization.py --out DIR            # GPU: ~1.2B Llama from a config (decode.py's FULL sizes)
    python tools/bench/quantization.py --out DIR --smoke    # tiny sizes on CPU (proves the script, not a result)
    python tools/bench/quantization.py --out DIR --model PATH   # a real local checkpoint (agreement means more)

For each method (`--methods`, default bf16,int8-weight-only,int4-weight-only) the model is planned and loaded with
`hwrun.plan(..., quantization=METHOD)` (refused before load where the device does not run it: the row records the
error) and measured at 1 and 64 prompts (`--batches`): new tokens/s and peak device memory of
- `hwrun.generate (decode='auto')`: hwrun's choice, recorded per row with its reason: on CUDA/XPU its graph loops
  for every method (bf16 through the fused Llama step; torchao's int8/int4 weights through the model's own forward
  as the captured step, since the fused step refuses quantized weights rather than build dequantized copies), on
  the CPU Transformers' loop (no graphs there);
- `transformers static cache + compile`: `model.generate(cache_implementation="static")`, Transformers' compiled
  decode, the same loop for every method (torchao's recommended path), which is the fair int4-vs-bf16 ratio.
Quality against float32 (the same weights loaded in float32): teacher-forced argmax agreement (the fraction of
positions where the method's next-token argmax equals float32's, over `--quality-seqs` random sequences of
`--quality-len` tokens and over the text shipped with hwrun, `models/tiny-llama/sample_train.txt`) and perplexity on
that text; for the benchmark model and, without `--model`, for the shipped tiny model, which is trained, so its
figures mean something. Random weights make the benchmark model's agreement a stress test only (on an H100 on
2026-12-06 even bf16 agreed with float32 on 93.75 % of positions there). Goal (issue 43): int4 batch-1 >= 1.6x
bf16's tokens/s, agreement >= 95 %. On an H100 a first, shortened run (64 new tokens, one repeat) took over 5
minutes, most of it compiling Transformers' static-cache rows: give it 15 minutes, or `--skip-hf-compile` (only
hwrun's rows). Each row records `elapsed_s` (load excluded) and the JSON `elapsed_s` per phase, so a run cut short
still shows where its time went.

Each method records its LM head (`lm_head`: the weight's class, dtype and whether it is still tied to the input
embedding; hwrun quantizes it, untied, for int8/int4 weight-only since issue 43.3), and each speed row its class.

Writes DIR/quantization.json (after every row), DIR/quantization.md and DIR/quantization.png; prints each row.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), *(str(p) for p in sorted((HERE.parents[1] / "packages").glob("*/src")))]

from bench_record import offline_transformers, stamp  # noqa: E402
from decode import FULL, SMOKE, Device, measure, prompts_of, save_model_folder  # noqa: E402

METHODS = ("bf16", "int8-weight-only", "int4-weight-only")
SAMPLE_TEXT = HERE.parents[1] / "packages" / "hwrun" / "src" / "hwrun" / "models" / "tiny-llama" / "sample_train.txt"


def quality_ids(vocab_size, seqs, length, seed=0):
    """Fixed random token sequences for the teacher-forced comparison (the same for every method)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (seqs, length), generator=generator)


def text_ids(tokenizer, length):
    """The shipped sample text as token ids (at most `length`), for perplexity."""
    ids = tokenizer(SAMPLE_TEXT.read_text(), add_special_tokens=False)["input_ids"][:length]
    import torch

    return torch.tensor([ids])


def forward_logits(model, ids, chunk=1):
    """Teacher-forced logits of `ids` (float32, on the CPU), `chunk` sequences per forward."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, ids.shape[0], chunk):
            batch = ids[start:start + chunk].to(model.device)
            out.append(model(input_ids=batch).logits.float().cpu())
    return torch.cat(out)


def perplexity(logits, ids):
    import torch

    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:].to(logits.device))
    return float(torch.exp(loss))


def free_memory():
    """Collect and give cached device memory back between methods (each method loads its own copy)."""
    try:
        import torch

        torch._dynamo.reset()  # compiled code and CUDA graphs of the previous method hold its model
    except Exception:  # noqa: BLE001
        pass
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        elif hasattr(torch, "xpu") and torch.xpu.is_available():
            torch.xpu.empty_cache()
    except Exception:  # noqa: BLE001 - best effort between methods
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: proves the script, measures nothing")
    parser.add_argument("--model", default=None, help="a local checkpoint instead of random weights from a config")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batches", default=None, help="comma-separated prompt counts (default 1,64)")
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quality-seqs", type=int, default=None)
    parser.add_argument("--quality-len", type=int, default=None)
    parser.add_argument("--skip-hf-compile", action="store_true", help="leave out Transformers' static cache + compile")
    parser.add_argument("--compile", action="store_true",
                        help="hwrun.plan(compile=True) for the speed rows: hwrun's graph step compiled by Inductor "
                             "(default: the eager step captured as one graph, hwrun's default)")
    parser.add_argument("--skip-quality", action="store_true",
                        help="leave out the argmax-agreement / perplexity pass (speed rows only)")
    parser.add_argument("--profile", action="store_true",
                        help="after each method's hwrun.generate rows, one more call per batch under torch.profiler: "
                             "the device-kernel table goes to OUT/profile-METHOD-bBATCH.txt")
    args = parser.parse_args(argv)
    offline_transformers()  # Transformers' static cache + compile rows: no Hub kernels offline (bench_record)

    import hwrun
    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_kind = "cpu" if args.smoke else "auto"
    probe = hwrun.plan(hwrun.DEFAULT_MODEL, device=device_kind)
    if not probe.accelerator.platform.is_accelerator and not args.smoke:
        print("no accelerator here: run with --smoke on the host", file=sys.stderr)
        return 2
    prompt_len = args.prompt_len or (16 if args.smoke else 128)
    new_tokens = args.new_tokens or (8 if args.smoke else 256)
    batches = [int(b) for b in (args.batches or ("1,4" if args.smoke else "1,64")).split(",")]
    quality_seqs = args.quality_seqs or (2 if args.smoke else 8)
    quality_len = args.quality_len or (32 if args.smoke else 512)
    half = "bfloat16" if probe.accelerator.platform.is_accelerator else "float32"
    if args.model:
        folder, weights = Path(args.model), "checkpoint"
    else:
        folder = save_model_folder(SMOKE if args.smoke else FULL,
                                   Path(tempfile.mkdtemp(prefix="hwrun-bench-quant-")) / "model", torch.bfloat16)
        weights = "random (from a config)"

    results = {"smoke": args.smoke, "weights": weights, "model": str(folder), "torch": torch.__version__,
               "transformers": transformers.__version__, "hwrun": hwrun.__version__, "prompt_len": prompt_len,
               "new_tokens": new_tokens, "repeats": args.repeats, "quality_seqs": quality_seqs,
               "quality_len": quality_len, "methods": {}, "rows": [],
               "compile": args.compile, "command": [sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None
                                                                            else argv)]}
    try:
        import torchao

        results["torchao"] = torchao.__version__
    except ImportError:
        results["torchao"] = None
    stamp(results, argv, libraries=("torchao", "hwenv"))

    def save():
        (out / "quantization.json").write_text(json.dumps(results, indent=2))

    methods = args.methods.split(",")
    started = time.perf_counter()
    elapsed = results.setdefault("elapsed_s", {})
    # quality on the shipped tiny model first: it is trained (on the shipped text), so its agreement and perplexity
    # mean something; the benchmark model's random weights make its figures a stress test only
    if not args.model and not args.skip_quality:
        results["tiny_trained_quality"] = quality(hwrun, hwrun.DEFAULT_MODEL, methods, device_kind, half,
                                                  quality_seqs, quality_len, label="shipped tiny model")
        elapsed["tiny quality"] = round(time.perf_counter() - started, 1)
        save()
    mark = time.perf_counter()
    if not args.skip_quality:
        results["quality"] = quality(hwrun, str(folder), methods, device_kind, half, quality_seqs, quality_len,
                                     label="benchmark model")
        elapsed["quality"] = round(time.perf_counter() - mark, 1)
    probe = hwrun.plan(str(folder), device=device_kind, dtype=half)
    results.update(device=probe.accelerator.names[0] if probe.accelerator.names else probe.device,
                   kind=probe.accelerator.kind)
    save()
    for method in methods:
        mark = time.perf_counter()
        entry = results["methods"].setdefault(method, {})
        speed(hwrun, torch, folder, method, entry, results["rows"], device_kind=device_kind, half=half,
              batches=batches, prompt_len=prompt_len, new_tokens=new_tokens, repeats=args.repeats,
              hf_compile=not args.skip_hf_compile, save=save, compile_step=args.compile,
              profile_to=out if args.profile else None)
        free_memory()
        elapsed[f"speed {method}"] = round(time.perf_counter() - mark, 1)
    results["ratios"] = ratios(results["rows"])
    elapsed["total"] = round(time.perf_counter() - started, 1)
    print(f"done in {elapsed['total']:.0f} s (after building the model): {elapsed}", flush=True)
    save()
    write_report(results, out)
    return 0


def quantization_of(method):
    return None if method in ("bf16", "bfloat16", "none") else method


def lm_head_of(model):
    """{"weight": the LM head weight's class (a torchao tensor when hwrun quantized it), "dtype", "tied": whether it
    is still the input embedding's weight} for the JSON rows (issue 43.3: the head is quantized, untied, by default)."""
    head = model.get_output_embeddings().weight
    embedding = model.get_input_embeddings().weight
    return {"weight": type(head).__name__ if type(head).__name__ != "Parameter" else "Tensor",
            "dtype": str(head.dtype).removeprefix("torch."), "tied": head is embedding}


def quality(hwrun, folder, methods, device_kind, half, seqs, length, label):
    """{"float32_perplexity", "parameters", method: {argmax_agreement, perplexity} or {error}} for the model at
    `folder`: teacher-forced next-token argmax of each method against float32, on fixed random sequences and on the
    shipped text, and perplexity on the shipped text."""
    out = {}
    ref_plan = hwrun.plan(str(folder), device=device_kind, dtype="float32")
    model, tokenizer = hwrun.load(ref_plan)
    out["parameters"] = sum(p.numel() for p in model.parameters())
    vocab = min(model.config.vocab_size, len(tokenizer))
    ids = quality_ids(vocab, seqs, length)
    sample = text_ids(tokenizer, length)
    ref = forward_logits(model, ids).argmax(-1)
    ref_text = forward_logits(model, sample)
    out["float32_perplexity"] = perplexity(ref_text, sample)
    ref_text = ref_text.argmax(-1)
    model = None
    free_memory()
    for method in methods:
        try:
            plan = hwrun.plan(str(folder), device=device_kind, dtype=half, quantization=quantization_of(method))
            model, _ = hwrun.load(plan)
        except Exception as exc:  # noqa: BLE001 - a method this device refuses is a result too
            out[method] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{label}: {method:18s} not run: {out[method]['error'][:200]}", flush=True)
            continue
        text_logits = forward_logits(model, sample)
        agree = (forward_logits(model, ids).argmax(-1) == ref).float().mean()
        out[method] = {"argmax_agreement": float(agree),
                       "text_argmax_agreement": float((text_logits.argmax(-1) == ref_text).float().mean()),
                       "perplexity": perplexity(text_logits, sample), "reason": plan.reasons["quantization"],
                       "lm_head": lm_head_of(model)}
        print(f"{label}: {method:18s} agreement {out[method]['argmax_agreement']:.4f} (text "
              f"{out[method]['text_argmax_agreement']:.4f})  perplexity {out[method]['perplexity']:.2f} "
              f"(float32 {out['float32_perplexity']:.2f})", flush=True)
        model = None
        free_memory()
    return out


def speed(hwrun, torch, folder, method, entry, rows, *, device_kind, half, batches, prompt_len, new_tokens, repeats,
          hf_compile, save, compile_step=False, profile_to=None):
    """Load `method` and measure each batch and path into `rows` (the model is freed when this returns)."""
    try:
        plan = hwrun.plan(str(folder), device=device_kind, dtype=half, quantization=quantization_of(method),
                          compile=compile_step)
        entry["reason"] = plan.reasons["quantization"]
        model, tokenizer = hwrun.load(plan)
    except Exception as exc:  # noqa: BLE001 - a method this device refuses is a result too
        entry["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{method:18s} not run: {entry['error'][:200]}", flush=True)
        save()
        return
    entry["lm_head"] = lm_head_of(model)
    print(f"{method:18s} LM head: {entry['lm_head']}", flush=True)
    device = Device(plan)
    for batch in batches:
        texts = prompts_of(tokenizer, batch, prompt_len, seed=batch)
        encoded = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)

        def auto(t=texts):
            return hwrun.generate(plan, t, new_tokens, model=model, tokenizer=tokenizer)

        def static_cache(e=encoded):
            with torch.inference_mode():
                return model.generate(**e, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)

        runs = [("hwrun.generate (decode='auto')", auto, lambda r: r.total_new_tokens)]
        if hf_compile:
            runs.append(("transformers static cache + compile", static_cache, lambda r, b=batch: b * new_tokens))
        for name, run, produced in runs:
            row = {"method": method, "batch": batch, "name": name, "lm_head": entry["lm_head"]["weight"]}
            mark = time.perf_counter()
            try:
                seconds, peak, result = measure(run, device, repeats)
                tokens = produced(result)
                row.update(seconds=seconds, new_tokens=tokens, tokens_per_s=tokens / seconds, peak_bytes=peak)
                if isinstance(result, hwrun.GenerationResult):
                    row.update(decode=result.decode, decode_reason=result.decode_reason)
            except Exception as exc:  # noqa: BLE001 - record and keep measuring the rest
                row.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
            row["elapsed_s"] = round(time.perf_counter() - mark, 1)  # warm-up (capture, compile) and repeats
            rows.append(row)
            shown = f"{row['tokens_per_s']:10.1f} tokens/s" if "tokens_per_s" in row else f"FAILED {row['error'][:120]}"
            print(f"{method:18s} {batch:3d} {name:40s} {shown}", flush=True)
            save()
        if profile_to is not None:
            entry.setdefault("profiles", {})[str(batch)] = profile_kernels(torch, auto, profile_to, method, batch)
            save()


def profile_kernels(torch, run, out, method, batch):
    """One more `run()` under torch.profiler (host and device activity): its kernel table, sorted by device time,
    into OUT/profile-METHOD-bBATCH.txt; returns that file's name (or the error)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():  # platform-boundary: bench host probe (the profiler's device activity)
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    name = f"profile-{method}-b{batch}.txt"
    try:
        with torch.profiler.profile(activities=activities) as prof:
            run()
        sort = "self_cuda_time_total" if len(activities) > 1 else "self_cpu_time_total"
        (Path(out) / name).write_text(prof.key_averages().table(sort_by=sort, row_limit=40,
                                                                max_name_column_width=90))
        return name
    except Exception as exc:  # noqa: BLE001 - a profile that fails is noted, the rows stand
        return f"failed: {type(exc).__name__}: {exc}"


def ratios(rows):
    """tokens/s of each method over bf16's, per (batch, path)."""
    base = {(r["batch"], r["name"]): r["tokens_per_s"] for r in rows if r["method"] == "bf16" and "tokens_per_s" in r}
    return [{"method": r["method"], "batch": r["batch"], "name": r["name"],
             "vs_bf16": r["tokens_per_s"] / base[(r["batch"], r["name"])]}
            for r in rows if "tokens_per_s" in r and (r["batch"], r["name"]) in base and r["method"] != "bf16"]


def write_report(results, out):
    """quantization.md (tables) and quantization.png (tokens/s per method and batch) from the results."""
    quality = results.get("quality", {})
    lines = [f"# Quantized decode ({results.get('device')}, {results['weights']} weights, "
             f"{quality.get('parameters', 0) / 1e9:.2f}B parameters, {results['date']})", "",
             f"torch {results['torch']}, transformers {results['transformers']}, torchao {results['torchao']}; "
             f"prompt {results['prompt_len']} tokens, {results['new_tokens']} new tokens, median of "
             f"{results['repeats']}; hwrun's step "
             f"{'compiled (--compile)' if results.get('compile') else 'not compiled (the eager step as one graph)'}."
             + (" **Smoke run: sizes prove the script, not a result.**"
                                         if results["smoke"] else "")]
    for key, title in (("tiny_trained_quality", "Quality on the shipped trained tiny model"),
                       ("quality", f"Quality on the benchmark model ({results['weights']} weights)")):
        table = results.get(key)
        if not table:
            continue
        lines += ["", f"## {title}", "", "| method | argmax agreement vs fp32 (random ids) | on the shipped text | "
                  f"perplexity (fp32 {table['float32_perplexity']:.2f}) |", "|---|---|---|---|"]
        for method, entry in table.items():
            if not isinstance(entry, dict):
                continue
            if "error" in entry:
                lines.append(f"| {method} | not run: {entry['error'][:160]} | | |")
            else:
                lines.append(f"| {method} | {entry['argmax_agreement']:.2%} | {entry['text_argmax_agreement']:.2%} | "
                             f"{entry['perplexity']:.2f} |")
    lines += ["", "## Decode speed"]
    lines += ["", "| method | prompts | path | tokens/s | vs bf16 | peak memory | decode | LM head |",
              "|---|---|---|---|---|---|---|---|"]
    versus = {(r["method"], r["batch"], r["name"]): r["vs_bf16"] for r in results.get("ratios", [])}
    for row in results["rows"]:
        if "tokens_per_s" not in row:
            lines.append(f"| {row['method']} | {row['batch']} | {row['name']} | failed: {row['error'][:100]} | | | | "
                         f"{row.get('lm_head', '')} |")
            continue
        ratio = versus.get((row["method"], row["batch"], row["name"]))
        peak = f"{row['peak_bytes'] / 2**30:.2f} GiB" if row.get("peak_bytes") is not None else "n/a"
        lines.append(f"| {row['method']} | {row['batch']} | {row['name']} | {row['tokens_per_s']:.1f} | "
                     f"{f'{ratio:.2f}x' if ratio else '–'} | {peak} | {row.get('decode', '')} | {row.get('lm_head', '')} |")
    (out / "quantization.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = sorted({r["name"] for r in results["rows"] if "tokens_per_s" in r})
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(6 * max(1, len(names)), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=False):
        methods = list(dict.fromkeys(r["method"] for r in results["rows"]))
        batches = sorted({r["batch"] for r in results["rows"]})
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            values = [next((r["tokens_per_s"] for r in results["rows"] if r["method"] == method and r["batch"] == b
                            and r["name"] == name and "tokens_per_s" in r), 0) for b in batches]
            ax.bar([j + i * width for j in range(len(batches))], values, width, label=method)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"{b} prompts" for b in batches])
        ax.set(ylabel="new tokens/s (all prompts)", title=name, yscale="log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "quantization.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
