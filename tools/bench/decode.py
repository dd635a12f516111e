"""Decode benchmark through hwrun's public API (`hwrun.plan` -> `load` -> `generate`) beside Transformers'
static cache + compile and Transformers' continuous batching, in one process.

    python tools/bench/decode.py --out DIR            # H200: ~1.2B Llama from a config, random bf16 weights
    python tools/bench/decode.py --out DIR --smoke    # tiny sizes, runs on CPU (proves the script, not a result)

For 1, 8, 32, 64 prompts, greedy and sampled (temperature 0.7, top-p 0.9): total new tokens/s and peak
device memory of each row; the batch-1 fraction of the copy-bandwidth roofline (every token reads all
weights once); the weight storage before and after hwrun's fused decoders exist (the fused q/k/v and
gate/up matrices must cost nothing extra); and the wall time of the CLI, `hwrun generate --compile
--max-new-tokens 256`, in a fresh process with a cold and then a warm compile cache. Writes
DIR/decode.json (saved after every row, so a run cut short keeps what it measured), DIR/decode.md and
DIR/decode.png; prints each row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path[:0] = [str(p) for p in sorted((Path(__file__).resolve().parents[2] / "packages").glob("*/src"))]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import offline_transformers, stamp  # noqa: E402

FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=4096)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=320, tie_word_embeddings=True, max_position_embeddings=512)
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.9, seed=0)


def build_model(sizes, device, dtype):
    """A random Llama from `sizes` on `device` (also used by tools/bench/profile_decoders.py)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**sizes, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def save_model_folder(sizes, folder, dtype):
    """A model folder `hwrun.plan` accepts: random Llama weights (safetensors) and hwrun.testing's tokenizer.
    No EOS in the generation config, so every row makes all its tokens (ids past the tokenizer decode to "")."""
    from hwrun.testing import build_tokenizer

    model = build_model(sizes, "cpu", dtype)
    model.save_pretrained(folder, safe_serialization=True)
    build_tokenizer().save_pretrained(folder)
    return folder


def prompts_of(tokenizer, count, length, seed):
    """`count` distinct prompts of `length` tokens each (decoded from random ids, re-encoded to check)."""
    import random

    rng = random.Random(seed)
    words = [w for w in (tokenizer.decode([i]) for i in range(3, len(tokenizer))) if w.strip() and w.isascii()]
    out = []
    while len(out) < count:
        text = "".join(rng.choice(words) for _ in range(length))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
        text = tokenizer.decode(ids)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == length:
            out.append(text)
    return out


class Device:
    """Synchronise and read peak memory through hwenv's platform runtime (None on the host)."""

    def __init__(self, plan):
        from hwenv.platforms import runtime

        self.runtime, self.platform = runtime, plan.accelerator.platform
        self.device = plan.device

    def sync(self):
        self.runtime.synchronize(self.platform, self.device)

    def reset_peak(self):
        self.runtime.reset_peak_memory_stats(self.platform, self.device)

    def peak(self):
        return self.runtime.max_memory_allocated(self.platform, self.device)


def measure(run, device, repeats):
    """(median seconds, peak bytes or None, last result) of `repeats` calls after one warm-up call."""
    run()
    device.sync()
    device.reset_peak()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        device.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), device.peak(), result


def storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (shared storage counted once)."""
    seen = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def weight_storage(model):
    """The model's parameters and buffers plus every cached hwrun decoder's fused matrices."""
    import importlib

    tensors = [*model.parameters(), *model.buffers()]
    generate_module = importlib.import_module("hwrun.inference.generate")
    for decoder in generate_module.decoders_of(model).values():
        fused = getattr(decoder, "fused", None)
        for layer in getattr(fused, "layers", []):
            tensors += [layer[k] for k in ("qkv", "qkv_bias", "gate_up", "gate_up_bias") if layer[k] is not None]
    return storage_bytes(tensors)


def copy_bandwidth(device_name, nbytes, device, repeats=10):
    """Device copy bandwidth in bytes/s (read + write counted, as in STREAM copy)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device_name)
    dst = torch.empty_like(src)
    seconds, _, _ = measure(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() * src.element_size() / seconds


def cli_wall_time(folder, new_tokens, cache_dir, device_kind):
    """Seconds for `hwrun generate --compile` in a fresh process (TORCHINDUCTOR_CACHE_DIR=`cache_dir`)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(sys.path[:5] + [env.get("PYTHONPATH", "")])
    entry = "import sys; from hwrun.cli.main import main; sys.exit(main())"  # the `hwrun` script's entry point
    command = [sys.executable, "-c", entry, "generate", "--model", str(folder), "--device", device_kind,
               "--compile", "--max-new-tokens", str(new_tokens), "--no-stream", "--timings", "The king said"]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    phases = [line.strip("[]") for line in done.stderr.splitlines() if line.startswith("[timings: ")]
    return {"seconds": seconds, "rc": done.returncode, "stderr_tail": done.stderr[-400:],
            "timings": phases[-1] if phases else None}  # where the time went: start-up, plan, load, generate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: proves the script, measures nothing")
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--batches", default=None, help="comma-separated prompt counts (default 1,8,32,64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf-compile", action="store_true", help="leave out Transformers' static cache + compile")
    parser.add_argument("--skip-generate-batch", action="store_true", help="leave out Transformers' generate_batch")
    parser.add_argument("--skip-sampled", action="store_true", help="greedy rows only")
    parser.add_argument("--skip-cli", action="store_true", help="leave out the CLI wall times")
    args = parser.parse_args(argv)
    # Transformers' static cache + compile and continuous batching are the anchors here, and the CLI rows run in
    # subprocesses that inherit this: no Hub kernels offline (bench_record.OFFLINE_ENV)
    offline_transformers()

    import hwrun
    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = SMOKE if args.smoke else FULL
    prompt_len = args.prompt_len or (16 if args.smoke else 128)
    new_tokens = args.new_tokens or (8 if args.smoke else 256)
    batches = [int(b) for b in (args.batches or ("1,2,4" if args.smoke else "1,8,32,64")).split(",")]
    device_kind = "cpu" if args.smoke else "auto"
    probe = hwrun.plan(hwrun.DEFAULT_MODEL, device=device_kind)
    if not probe.accelerator.platform.is_accelerator and not args.smoke:
        print("no accelerator here: run with --smoke on the host", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if probe.dtype == "bfloat16" else torch.float32
    folder = save_model_folder(sizes, Path(tempfile.mkdtemp(prefix="hwrun-bench-decode-")) / "model", dtype)

    plan = hwrun.plan(str(folder), device=device_kind, compile=True)
    model, tokenizer = hwrun.load(plan)
    device = Device(plan)
    weights = storage_bytes([*model.parameters(), *model.buffers()])
    bandwidth = copy_bandwidth(plan.device, min(2**30, 8 * weights), device)
    results = {
        "smoke": args.smoke, "device": plan.accelerator.names[0] if plan.accelerator.names else plan.device,
        "kind": plan.accelerator.kind, "torch": torch.__version__, "transformers": transformers.__version__,
        "hwrun": hwrun.__version__, "dtype": plan.dtype, "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weights, "copy_bandwidth_bytes_per_s": bandwidth, "roofline_tokens_per_s": bandwidth / weights,
        "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": args.repeats, "sampled": SAMPLED,
        "rows": [], "cli": {},
    }
    stamp(results, argv, libraries=("hwenv", "accelerate"))

    def save():
        (out / "decode.json").write_text(json.dumps(results, indent=2))

    def add(batch, mode, name, run, produced):
        try:
            seconds, peak, result = measure(run, device, args.repeats)
            tokens = produced(result)
            row = {"batch": batch, "mode": mode, "name": name, "seconds": seconds, "new_tokens": tokens,
                   "tokens_per_s": tokens / seconds, "peak_bytes": peak}
            if isinstance(result, hwrun.GenerationResult):
                row.update(decode=result.decode, decode_reason=result.decode_reason, batching=result.batching)
        except Exception as exc:  # noqa: BLE001 - record and keep measuring the rest
            row = {"batch": batch, "mode": mode, "name": name, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-6000:]}
        results["rows"].append(row)
        shown = f"{row['tokens_per_s']:10.1f} tokens/s" if "tokens_per_s" in row else f"FAILED {row['error'][:120]}"
        print(f"{batch:3d} {mode:7s} {name:40s} {shown}", flush=True)
        save()

    save()
    from hwrun.inference.batching import cb_config, workload_cb_config
    from transformers import ContinuousBatchingConfig, GenerationConfig

    for batch in batches:
        texts = prompts_of(tokenizer, batch, prompt_len, seed=batch)
        encoded = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
        ids = [tokenizer(t)["input_ids"] for t in texts]
        for mode in ("greedy",) if args.skip_sampled else ("greedy", "sampled"):
            options = SAMPLED if mode == "sampled" else {}
            hf_options = {k: v for k, v in options.items() if k != "seed"} or {"do_sample": False}
            add(batch, mode, "hwrun.generate (decode='graphs')",
                lambda t=texts, o=options: hwrun.generate(plan, t, new_tokens, decode="graphs", model=model,
                                                          tokenizer=tokenizer, **o),
                lambda r: r.total_new_tokens)
            add(batch, mode, "hwrun.generate (decode='auto')",
                lambda t=texts, o=options: hwrun.generate(plan, t, new_tokens, model=model, tokenizer=tokenizer, **o),
                lambda r: r.total_new_tokens)
            if not args.skip_hf_compile:
                def static_cache(e=encoded, o=hf_options):
                    with torch.inference_mode():
                        return model.generate(**e, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                              cache_implementation="static", pad_token_id=0, **o)
                add(batch, mode, "transformers static cache + compile", static_cache,
                    lambda r, b=batch: b * new_tokens)
            if not args.skip_generate_batch:
                config = GenerationConfig(max_new_tokens=new_tokens, eos_token_id=-1, pad_token_id=0, **hf_options)
                variants = [("transformers generate_batch (hwrun's config)",
                             workload_cb_config(plan.accelerator.kind, [len(i) for i in ids], new_tokens))]
                if not args.smoke:  # Transformers' defaults size the cache from 90% of device memory
                    variants.append(("transformers generate_batch (defaults)",
                                     cb_config(ContinuousBatchingConfig, auto_switch_to_flash=False)))
                for name, cb in variants:
                    def continuous(i=ids, c=cb, g=config):
                        with torch.no_grad():
                            return model.generate_batch(i, generation_config=g, continuous_batching_config=c,
                                                        progress_bar=False)
                    add(batch, mode, name, continuous,
                        lambda r: sum(len(o.generated_tokens) for o in r.values()))
    results["weight_storage_after_decoders"] = weight_storage(model)
    results["fused_weight_extra_bytes"] = results["weight_storage_after_decoders"] - weights
    save()
    if not args.skip_cli:
        with tempfile.TemporaryDirectory(prefix="hwrun-bench-inductor-") as cache:
            for label in ("cold", "warm"):
                results["cli"][label] = cli_wall_time(folder, new_tokens, cache, device_kind)
                print(f"CLI hwrun generate --compile ({label} compile cache): "
                      f"{results['cli'][label]['seconds']:.1f} s rc={results['cli'][label]['rc']}", flush=True)
                save()
    write_report(results, out)
    return 0


def write_report(results, out):
    """decode.md (tables) and decode.png (tokens/s per prompt count) from the results dict."""
    rows = results["rows"]
    head = (f"{'CPU smoke run (tiny sizes; not a performance result)' if results['smoke'] else 'Device: ' + results['device']}"
            f", {results['date']}; torch {results['torch']}, transformers {results['transformers']}, hwrun "
            f"{results['hwrun']}; {results['parameters'] / 1e6:,.1f}M parameters ({results['weight_bytes'] / 1e9:.2f} GB, "
            f"{results['dtype']}); prompt {results['prompt_len']} tokens, {results['new_tokens']} new tokens, median of "
            f"{results['repeats']}; sampled = temperature 0.7, top-p 0.9.")
    lines = [head, "", f"Copy bandwidth {results['copy_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s -> batch-1 roofline "
             f"{results['roofline_tokens_per_s']:,.0f} tokens/s. Weight storage {results['weight_bytes']:,} B before "
             f"hwrun's decoders, {results.get('weight_storage_after_decoders', 0):,} B after (fused weights: "
             f"{results.get('fused_weight_extra_bytes', 'n/a'):,} B extra).", "",
             "| prompts | mode | path | tokens/s | batch-1 roofline | vs best Transformers row | peak memory | decode |",
             "|---:|---|---|---:|---:|---:|---:|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['batch']} | {row['mode']} | {row['name']} | failed: {row['error'][:80]} | | | | |")
            continue
        theirs = [r["tokens_per_s"] for r in rows if r["batch"] == row["batch"] and r["mode"] == row["mode"]
                  and "tokens_per_s" in r and r["name"].startswith("transformers")]
        roof = f"{row['tokens_per_s'] / results['roofline_tokens_per_s']:.1%}" if row["batch"] == 1 else ""
        ratio = f"{row['tokens_per_s'] / max(theirs):.2f}x" if theirs else ""
        peak = f"{row['peak_bytes'] / 2**30:.2f} GiB" if row.get("peak_bytes") is not None else "n/a"
        lines.append(f"| {row['batch']} | {row['mode']} | {row['name']} | {row['tokens_per_s']:,.1f} | {roof} | "
                     f"{ratio} | {peak} | {row.get('decode', '')} |")
    for label, cli in results["cli"].items():
        lines.append(f"\nCLI `hwrun generate --compile --max-new-tokens {results['new_tokens']}`, {label} compile "
                     f"cache: {cli['seconds']:.1f} s wall (rc {cli['rc']}).")
    (out / "decode.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, ("greedy", "sampled"), strict=True):
        names = sorted({r["name"] for r in rows if r["mode"] == mode and "tokens_per_s" in r})
        for name in names:
            points = sorted((r["batch"], r["tokens_per_s"]) for r in rows
                            if r["mode"] == mode and r["name"] == name and "tokens_per_s" in r)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="concurrent prompts", title=mode)
    axes[0].set_ylabel("new tokens/s (all prompts)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "decode.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
