"""Benchmark LoRA and full fine-tuning throughput: plain Transformers `Trainer` vs `hwrun train`, side by side.

One ~1.24B-parameter Llama built from a config (hidden 2048, 16 layers, 32/8 heads, intermediate
8192, vocab 128256, tied embeddings), random weights saved once, LoRA r=16 on q/k/v/o, sequence
1024, batch 8, random token ids (the same blocks for every configuration):

  plain_fp32          Trainer defaults, model in float32
  plain_bf16          model loaded in bfloat16, bf16=True
  plain_bf16_compile  as plain_bf16 plus torch_compile=True
  hwrun               hwrun.training.train_plan(model) + hwrun.train: hwrun picks bf16 + compile
                      itself and adds its own training path (packed blocks, fused chunked loss,
                      fused q/k/v + gate/up projections, RoPE table)
  hwrun_qlora         hwrun.train(qlora=True): 4-bit NF4 base (bitsandbytes), for peak memory
  hwrun_model_loss    as hwrun with fused_loss=False (the model's own loss), to see what the fused loss costs
  hwrun_unfused       as hwrun with fused_projections=False and kernels={"rope": "inductor"} (no RoPE table:
                      hwrun before both)
  hwrun_unfused_projections  as hwrun with fused_projections=False (the fused projections' own share)
  hwrun_reduce_overhead  as hwrun with torch_compile_mode="reduce-overhead" (CUDA graphs over the step)
  plain_bf16_compile_reduce_overhead  plain Trainer with the same mode: what the flag alone gives
  The kernel policy's comparison (hwrun.training.kernel_policy; each as hwrun with one kernels= choice):
  hwrun_torch_loss     cross_entropy=inductor (the loss chunks in the torch form inductor fuses, instead of
                       hwrun's Triton kernel)
  hwrun_liger_ce       cross_entropy=liger (Liger's fused linear cross-entropy)
  hwrun_linear_ce      cross_entropy=torch (torch's own chunked F.linear_cross_entropy, where torch has it)
  hwrun_liger_swiglu   swiglu=liger (Liger's SwiGLU on separate gate/up matmuls)
  hwrun_liger_rmsnorm  rmsnorm=liger;  hwrun_torch_rmsnorm  rmsnorm=torch (F.rms_norm)
  hwrun_liger_rope     rope=liger (Liger's rotation, cos/sin table kept);  hwrun_inductor_rope  rope=inductor
                       (no table: the table's own share)
  hwrun_liger_all      all four ops with Liger's kernels
  plain_liger          plain Trainer, bf16, use_liger_kernel=True (Liger's own patching), eager
  plain_liger_compile  as plain_liger with torch_compile=True
  Full fine-tuning (no LoRA: every weight trains; the same data, shape and steps):
  plain_full_bf16          plain Trainer, bf16=True over float32 weights (mixed precision: float32 master
                           weights, as hwrun's full fine-tune keeps them), no LoRA
  plain_full_bf16_compile  as plain_full_bf16 plus torch_compile=True
  hwrun_full               hwrun.train(lora=None): float32 master weights, bf16 + compile as hwrun picks them,
                           with its fused loss, RoPE table and causal SDPA (fused projections are LoRA-only)
  Their ratio: hwrun_full / the better plain_full row (apart from the LoRA ratio).
  A configuration whose kernels cannot run here (Liger on CPU, torch without its own op) is recorded as
  skipped, with the policy's reason.

Each configuration runs in its own process (clean CUDA memory, compile caches and accelerate
state): `--warmup` untimed steps, then `--steps` timed steps; CUDA events at every step end
(no extra synchronisation inside the window), median step time -> tokens/s; peak memory is
torch.cuda.max_memory_allocated for the whole run. Ratios: hwrun / best plain tokens/s, and
QLoRA peak / hwrun LoRA peak.

    python tools/bench/train.py --out DIR            # H200: DIR/train.{json,md,png}
    python tools/bench/train.py --out DIR --smoke    # tiny model on CPU (compile via aot_eager)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import offline_transformers, stamp  # noqa: E402

# the plain Trainer rows (from_pretrained, then Trainer's model.train()) and every --one child, which inherits
# this environment: no Hub kernels offline (bench_record.OFFLINE_ENV; the plain rows died without it on 2026-12-06)
offline_transformers()

FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256, seq=1024, batch=8, warmup=5, steps=10)
#: issue 29's second shape: the same layers with the shipped tokenizer's 3,072-token vocabulary (0.98B
#: parameters), seq 512 x batch 16 (the same 8,192 tokens a step, a smaller output head).
SHAPES = {"1.24b-s1024-b8": FULL,
          "0.98b-s512-b16": dict(FULL, vocab_size=3072, seq=512, batch=16)}
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, seq=64, batch=4, warmup=2, steps=3)
#: hwrun configurations that differ from `hwrun` by their train(kernels=...) choice (the kernel policy's table).
KERNEL_CONFIGS = {
    "hwrun_torch_loss": {"cross_entropy": "inductor"},
    "hwrun_liger_ce": {"cross_entropy": "liger"},
    "hwrun_linear_ce": {"cross_entropy": "torch"},
    "hwrun_liger_swiglu": {"swiglu": "liger"},
    "hwrun_liger_rmsnorm": {"rmsnorm": "liger"},
    "hwrun_torch_rmsnorm": {"rmsnorm": "torch"},
    "hwrun_liger_rope": {"rope": "liger"},
    "hwrun_inductor_rope": {"rope": "inductor"},
    "hwrun_liger_all": {"cross_entropy": "liger", "swiglu": "liger", "rmsnorm": "liger", "rope": "liger"},
}
#: (op, candidate, its configuration, the configuration of the baseline it is measured against): the ratios
#: that hwrun.training.kernel_policy.MEASUREMENTS takes (candidate tokens/s over baseline tokens/s).
POLICY_PAIRS = (
    ("cross_entropy", "hwrun", "inductor", "hwrun", "hwrun_torch_loss"),
    ("cross_entropy", "liger", "inductor", "hwrun_liger_ce", "hwrun_torch_loss"),
    ("cross_entropy", "torch", "inductor", "hwrun_linear_ce", "hwrun_torch_loss"),
    ("swiglu", "liger", "inductor", "hwrun_liger_swiglu", "hwrun"),
    ("rmsnorm", "liger", "inductor", "hwrun_liger_rmsnorm", "hwrun"),
    ("rmsnorm", "torch", "inductor", "hwrun_torch_rmsnorm", "hwrun"),
    ("rope", "hwrun", "inductor", "hwrun", "hwrun_inductor_rope"),
    ("rope", "liger", "inductor", "hwrun_liger_rope", "hwrun_inductor_rope"),
)
CONFIGS = ("plain_fp32", "plain_bf16", "plain_bf16_compile", "hwrun", "hwrun_qlora", "hwrun_model_loss", "hwrun_unfused",
           "hwrun_unfused_projections", "hwrun_reduce_overhead", "plain_bf16_compile_reduce_overhead", *KERNEL_CONFIGS, "plain_liger",
           "plain_liger_compile", "plain_full_bf16", "plain_full_bf16_compile", "hwrun_full")
PLAIN = ("plain_fp32", "plain_bf16", "plain_bf16_compile")  # the baseline set
PLAIN_FULL = ("plain_full_bf16", "plain_full_bf16_compile")  # full fine-tuning's baseline set (no LoRA)
PLAIN_EXTRA = ("plain_bf16_compile_reduce_overhead", "plain_liger", "plain_liger_compile")  # context rows
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def build_model_dir(sizes: dict, path: Path, device: str) -> Path:
    """Save a random Llama (bf16 safetensors) and a byte-level tokenizer into `path`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["</s>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>").save_pretrained(path)
    config = LlamaConfig(**{k: sizes[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                  "num_attention_heads", "num_key_value_heads", "vocab_size")},
                         max_position_embeddings=max(2048, sizes["seq"]), tie_word_embeddings=True,
                         rope_theta=500000.0, eos_token_id=vocab["</s>"], use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path, safe_serialization=True)
    (path / "bench_params.json").write_text(json.dumps({"parameters": params}))
    del model
    return path


def make_dataset(sizes: dict, blocks: int):
    """Random token blocks as hwrun's PackedDataset (fixed length, no padding) — identical per config."""
    import torch
    from hwrun.training.data import PackedDataset

    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, sizes["vocab_size"] - 1, (blocks, sizes["seq"]), generator=generator)
    return PackedDataset(ids, ["random"])


class StepTimer:
    """Trainer callback: an event (CUDA) or perf_counter (CPU) at the start and at every step end."""

    def __init__(self, cuda: bool) -> None:
        import torch
        from transformers import TrainerCallback

        outer = self
        self.cuda = cuda
        self.marks: list = []

        def mark():
            if outer.cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                outer.marks.append(event)
            else:
                outer.marks.append(time.perf_counter())

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                mark()

            def on_step_end(self, args, state, control, **kwargs):
                mark()

        self.callback = _Callback()

    def step_seconds(self) -> list[float]:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]


class StepProfiler:
    """Trainer callback: torch.profiler over steps [start, stop); `table` is the kernel summary."""

    def __init__(self, start: int, stop: int) -> None:
        from transformers import TrainerCallback

        outer = self
        self.table = None
        self.profiler = None

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == start and outer.profiler is None:
                    import torch

                    outer.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                                        torch.profiler.ProfilerActivity.CUDA])
                    outer.profiler.__enter__()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == stop and outer.profiler is not None and outer.table is None:
                    import torch

                    torch.cuda.synchronize()
                    outer.profiler.__exit__(None, None, None)
                    outer.table = outer.profiler.key_averages().table(sort_by="self_cuda_time_total",
                                                                      row_limit=40, max_name_column_width=90)

        self.callback = _Callback()


def gpu_state() -> dict | None:
    """SM clock (MHz), power (W), temperature (C) and clock-throttle reasons of GPU 0 now (NVML),
    or None where NVML is missing; read as soon as training returns (after hwrun's final save)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "throttle_reasons": hex(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons",
                                                getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))(handle))}
    except Exception as exc:  # NVML present but not answering: say so in the results
        return {"error": str(exc)[:200]}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def run_one(name: str, model_dir: str, sizes: dict, smoke: bool, profile: bool = False) -> dict:
    """Run configuration `name` in this process and return its measurements."""
    import torch

    cuda = torch.cuda.is_available() and not smoke
    device = "cuda" if cuda else "cpu"
    total = sizes["warmup"] + sizes["steps"]
    dataset = make_dataset(sizes, total * sizes["batch"])
    timer = StepTimer(cuda)
    callbacks = [timer.callback]
    profiler = None
    if profile and cuda:
        profiler = StepProfiler(sizes["warmup"] + 2, sizes["warmup"] + 4)
        callbacks.append(profiler.callback)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = tempfile.mkdtemp(prefix=f"bench-train-{name}-")
    backend = "aot_eager" if smoke else None  # CPU smoke: same code path, no C++ compile
    skipped = why_skipped(name, device)
    if skipped is not None:
        return {"config": name, "skipped": skipped}
    started = time.perf_counter()
    decisions = {}
    if name in PLAIN or name in PLAIN_EXTRA or name in PLAIN_FULL:
        from peft import LoraConfig, get_peft_model
        from transformers import (
            AutoModelForCausalLM,
            Trainer,
            TrainingArguments,
            default_data_collator,
        )

        full = name in PLAIN_FULL  # full fine-tuning: float32 master weights under bf16 autocast, as hwrun_full
        dtype = torch.float32 if name == "plain_fp32" or full else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
        model.config.use_cache = False
        if not full:
            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=list(LORA_TARGETS),
                                                     task_type="CAUSAL_LM"))
        compile_kw = {}
        if name.startswith("plain_bf16_compile") or name in ("plain_liger_compile", "plain_full_bf16_compile"):
            compile_kw = {"torch_compile": True, **({"torch_compile_backend": backend} if backend else {})}
            if name.endswith("reduce_overhead") and not smoke:
                compile_kw["torch_compile_mode"] = "reduce-overhead"
        if name.startswith("plain_liger"):
            compile_kw["use_liger_kernel"] = True  # Transformers applies Liger's own (module-global) patching
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=sizes["batch"], max_steps=total,
                                 save_strategy="no", report_to="none", logging_steps=10_000,
                                 bf16=name != "plain_fp32", use_cpu=not cuda, remove_unused_columns=False,
                                 disable_tqdm=True, **compile_kw)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=default_data_collator,
                          callbacks=callbacks)
        trainer.train()
        decisions = {"bf16": args.bf16, "torch_compile": args.torch_compile, "optim": str(args.optim),
                     "torch_compile_mode": args.torch_compile_mode, "fine_tune": "full" if full else "lora",
                     "weights": str(dtype).removeprefix("torch.")}
    else:
        import hwrun
        from hwrun.training import LoraSettings, train_plan

        qlora = name == "hwrun_qlora"
        lora = None if name == "hwrun_full" else LoraSettings(r=16, alpha=32, target_modules=LORA_TARGETS)
        fused_loss = name != "hwrun_model_loss"
        # no fused projections, no RoPE table (kernels' rope choice; rope_table=False is its deprecated spelling)
        layers = {"fused_projections": False, "kernels": {"rope": "inductor"}} if name == "hwrun_unfused" else {}
        if name == "hwrun_unfused_projections":
            layers["fused_projections"] = False
        if name in KERNEL_CONFIGS:
            layers["kernels"] = KERNEL_CONFIGS[name]
        overrides = {"torch_compile_mode": "reduce-overhead"} if name == "hwrun_reduce_overhead" and not smoke else {}
        if smoke:
            plan = train_plan(model_dir, device="cpu", dtype="bfloat16", compile=False if qlora else backend)
        else:
            # QLoRA is measured for memory; its 4-bit layers and gradient checkpointing run eager
            plan = train_plan(model_dir, compile=False if qlora else None)
        result = hwrun.train(plan, dataset, lora=lora, qlora=qlora, max_steps=total, batch_size=sizes["batch"], output_dir=out,
                             save_steps=10**9, plot=False, callbacks=callbacks, disable_tqdm=True, fused_loss=fused_loss, **layers, **overrides,
                             logging_steps=10_000, resume=False)
        decisions = {"device": plan.device, "dtype": plan.dtype, "torch_compile_mode": overrides.get("torch_compile_mode"),
                     "fine_tune": "full" if lora is None else ("qlora" if qlora else "lora"),
                     "compile": None if plan.compile is None else str(plan.compile.backend),
                     **dict(result.reasons)}
    wall = time.perf_counter() - started
    gpu = gpu_state() if cuda else None
    steps = timer.step_seconds()
    timed = steps[sizes["warmup"]:]
    median = statistics.median(timed)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    from torch._dynamo.utils import counters

    breaks = {str(reason): count for reason, count in counters["graph_break"].items()}
    result = {"config": name, "tokens_per_s": sizes["batch"] * sizes["seq"] / median, "median_step_s": median,
              "step_s": steps, "peak_bytes": peak, "wall_s": wall, "decisions": decisions,
              "graph_breaks": breaks, "frames_compiled": counters["stats"].get("unique_graphs", 0), "gpu": gpu}
    if profiler is not None and profiler.table:
        result["profile"] = profiler.table
    return result


def why_skipped(name: str, device: str) -> str | None:
    """Why configuration `name` cannot run on `device` here (its kernels, as the kernel policy checks them
    before any work), or None."""
    from hwrun.devices import kind_of_device_type
    from hwrun.training import TrainingConfigError
    from hwrun.training.kernel_policy import check_kernels, explicit_choice

    kind = kind_of_device_type(device)
    asks = dict(KERNEL_CONFIGS.get(name, {}))
    if name.startswith("plain_liger"):
        asks = {"swiglu": "liger"}  # Transformers' use_liger_kernel needs what every Liger kernel needs
    try:
        for op, impl in check_kernels(asks).items():
            explicit_choice(op, impl, kind)
    except TrainingConfigError as error:
        return str(error)
    return None


def child(args: argparse.Namespace) -> int:
    sizes = SMOKE if args.smoke else SHAPES[args.shape]
    result = run_one(args.one, args.model_dir, sizes, args.smoke, args.profile)
    Path(args.result).write_text(json.dumps(result, default=str))
    return 0


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.1f}"


def combine_runs(runs: list[dict]) -> list[dict]:
    """One row per configuration, in first-run order. A configuration listed more than once in
    --configs (interleaved with the others, so drift in GPU clocks hits each alike) gets the median
    of its runs' tokens/s and step times, the largest peak, and every run's figure in `runs_tokens_per_s`."""
    order: dict[str, list[dict]] = {}
    for run in runs:
        order.setdefault(run["config"], []).append(run)
    rows = []
    for group in order.values():
        good = [r for r in group if "tokens_per_s" in r]
        if not good:
            rows.append(group[0])
            continue
        row = dict(good[0])
        if len(group) > 1:
            row["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in good)
            row["median_step_s"] = statistics.median(r["median_step_s"] for r in good)
            row["peak_bytes"] = max((r["peak_bytes"] or 0) for r in good) or None
            row["runs_tokens_per_s"] = [round(r["tokens_per_s"]) if "tokens_per_s" in r else r.get("error")
                                        for r in group]
            row["gpu_runs"] = [r.get("gpu") for r in good]
        rows.append(row)
    return rows


def write_outputs(out: Path, runs: list[dict], meta: dict) -> str:
    results = combine_runs(runs)
    ok = {r["config"]: r for r in results if "tokens_per_s" in r}
    plain_best = max((ok[c] for c in PLAIN if c in ok), key=lambda r: r["tokens_per_s"], default=None)
    full_best = max((ok[c] for c in PLAIN_FULL if c in ok), key=lambda r: r["tokens_per_s"], default=None)
    ratios = {}
    if full_best and "hwrun_full" in ok:  # full fine-tuning against full fine-tuning only, never against LoRA
        ratios["hwrun_full_vs_best_plain_full"] = ok["hwrun_full"]["tokens_per_s"] / full_best["tokens_per_s"]
        ratios["best_plain_full"] = full_best["config"]
    if plain_best and "hwrun" in ok:
        ratios["hwrun_vs_best_plain"] = ok["hwrun"]["tokens_per_s"] / plain_best["tokens_per_s"]
        ratios["best_plain"] = plain_best["config"]
    if "hwrun" in ok and "hwrun_qlora" in ok and ok["hwrun"]["peak_bytes"] and ok["hwrun_qlora"]["peak_bytes"]:
        ratios["qlora_peak_vs_lora_peak"] = ok["hwrun_qlora"]["peak_bytes"] / ok["hwrun"]["peak_bytes"]
    for key, against in (("layer_path_gain", "hwrun_unfused"), ("fused_projections_gain", "hwrun_unfused_projections")):
        if "hwrun" in ok and against in ok:  # what the fused projections (and the RoPE table) are kept for
            ratios[key] = ok["hwrun"]["tokens_per_s"] / ok[against]["tokens_per_s"]
    def ran(config: str, op: str, impl: str) -> bool:  # the run's own reasons say it ran `impl` for `op`
        return config in ok and str(ok[config]["decisions"].get(f"kernel {op}", "")).startswith(f"{impl}:")

    policy = [{"op": op, "candidate": impl, "baseline": base, "config": config, "baseline_config": against,
               "ratio": ok[config]["tokens_per_s"] / ok[against]["tokens_per_s"]}
              for op, impl, base, config, against in POLICY_PAIRS if ran(config, op, impl) and ran(against, op, base)]
    if policy:
        ratios["kernel_policy"] = policy
    lines = [f"LoRA fine-tuning (r=16 on q/k/v/o) and full fine-tuning (the *_full rows), "
             f"{meta['parameters'] / 1e9:.2f}B-parameter Llama from config, seq "
             f"{meta['sizes']['seq']}, batch {meta['sizes']['batch']}; "
             f"{meta['sizes']['warmup']} warm-up + {meta['sizes']['steps']} timed steps, median step. "
             f"Device: {meta['device']}.", "",
             "| configuration | tokens/s | vs best plain (of its kind) | median step (ms) | peak memory (GiB) | notes |",
             "|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['config']} | skipped | | | | {r['skipped'][:160]} |")
            continue
        if "tokens_per_s" not in r:
            lines.append(f"| {r['config']} | failed | | | | {r.get('error', '')[:120]} |")
            continue
        anchor = full_best if r["config"] in (*PLAIN_FULL, "hwrun_full") else plain_best
        vs = f"{r['tokens_per_s'] / anchor['tokens_per_s']:.2f}x" if anchor else ""
        d = r["decisions"]
        note = ", ".join(f"{k}={v}" for k, v in d.items() if k in ("dtype", "compile", "bf16", "torch_compile", "torch_compile_mode") and v)
        if "loss" in d:
            note += f"; loss: {d['loss']}"
        if d.get("fine_tune") == "full":
            note += "; full fine-tune, float32 master weights"
        if r.get("runs_tokens_per_s"):
            note += f"; median of {len(r['runs_tokens_per_s'])} interleaved runs: " + " / ".join(
                f"{v:,}" if isinstance(v, int) else "failed" for v in r["runs_tokens_per_s"])
        lines.append(f"| {r['config']} | {r['tokens_per_s']:,.0f} | {vs} | {r['median_step_s'] * 1000:.1f} | "
                     f"{gib(r['peak_bytes'])} | {note} |")
    lines.append("")
    if "hwrun_vs_best_plain" in ratios:
        lines.append(f"hwrun / best plain ({ratios['best_plain']}): **{ratios['hwrun_vs_best_plain']:.2f}x** "
                     "(goal >= 1.2x)")
    if "hwrun_full_vs_best_plain_full" in ratios:
        lines.append(f"full fine-tune: hwrun_full / best plain full ({ratios['best_plain_full']}): "
                     f"**{ratios['hwrun_full_vs_best_plain_full']:.2f}x**")
    if "qlora_peak_vs_lora_peak" in ratios:
        lines.append(f"QLoRA peak / LoRA peak: **{ratios['qlora_peak_vs_lora_peak']:.0%}** (goal <= 40%)")
    if ratios.get("kernel_policy"):
        lines += ["", "Kernel policy (end to end, candidate / baseline tokens/s; the figures "
                      "hwrun.training.kernel_policy.MEASUREMENTS takes):", "",
                  "| op | candidate | vs | ratio | configs |", "|---|---|---|---:|---|"]
        lines += [f"| {p['op']} | {p['candidate']} | {p['baseline']} | {p['ratio'] - 1:+.1%} | "
                  f"{p['config']} / {p['baseline_config']} |" for p in ratios["kernel_policy"]]
    table = "\n".join(lines) + "\n"
    (out / "train.md").write_text(table)
    (out / "train.json").write_text(json.dumps({"meta": meta, "results": results, "runs": runs, "ratios": ratios},
                                               indent=2, default=str))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["config"] for r in results if "tokens_per_s" in r]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    left.bar(names, [ok[n]["tokens_per_s"] for n in names],
             color=["#d62728" if n.startswith("hwrun") else "#7f7f7f" for n in names])
    left.set_ylabel("tokens/s (higher is better)")
    left.set_title("fine-tuning throughput (LoRA; *_full: full)")
    left.tick_params(axis="x", rotation=30)
    peaks = [ok[n]["peak_bytes"] or 0 for n in names]
    right.bar(names, [p / 2**30 for p in peaks],
              color=["#d62728" if n.startswith("hwrun") else "#7f7f7f" for n in names])
    right.set_ylabel("peak memory (GiB)")
    right.set_title("peak memory (CUDA only)")
    right.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    figure.savefig(out / "train.png")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder for train.json / train.md / train.png")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, to check the script")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.24b-s1024-b8",
                        help="model and batch shape (issue 29's two shapes)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"subset of {','.join(CONFIGS)}; a name listed again runs again (median of its runs)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    parser.add_argument("--profile", action="store_true", help="add a torch.profiler kernel table per config")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return child(args)
    if args.out is None:
        parser.error("--out is required")
    import torch

    sizes = SMOKE if args.smoke else SHAPES[args.shape]
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("No CUDA device: run on the H200, or pass --smoke to check the script on CPU.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]  # a name twice = run twice, interleaved
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {','.join(CONFIGS)}")
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    model_dir = build_model_dir(sizes, work / "model", "cuda" if cuda else "cpu")
    params = json.loads((model_dir / "bench_params.json").read_text())["parameters"]
    if cuda:
        torch.cuda.empty_cache()
    meta = {"shape": "smoke" if args.smoke else args.shape, "sizes": sizes, "parameters": params, "device": torch.cuda.get_device_name(0) if cuda else "cpu (smoke)",
            "torch": torch.__version__, "python": platform.python_version()}
    try:
        import peft
        import transformers

        meta.update(transformers=transformers.__version__, peft=peft.__version__)
    except ImportError:
        pass
    stamp(meta, argv, libraries=("peft", "accelerate", "liger_kernel", "hwattn"))
    results = []
    for index, name in enumerate(configs):
        result_file = work / f"{name}-{index}.json"
        argv_child = [sys.executable, os.path.abspath(__file__), "--one", name, "--model-dir", str(model_dir),
                      "--result", str(result_file), "--shape", args.shape, *(["--smoke"] if args.smoke else []),
                      *(["--profile"] if args.profile else [])]
        print(f"--- {name}", flush=True)
        try:
            done = subprocess.run(argv_child, timeout=args.timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            results.append({"config": name, "error": f"timed out after {args.timeout}s"})
            continue
        if done.returncode != 0 or not result_file.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            results.append({"config": name, "error": " | ".join(tail)})
            print("\n".join(tail), file=sys.stderr)
            continue
        result = json.loads(result_file.read_text())
        results.append(result)
        if "skipped" in result:
            print(f"{name}: skipped: {result['skipped']}", flush=True)
            continue
        if result.get("profile"):
            (args.out / f"profile-train-{name}.txt").write_text(result.pop("profile"))
        print(f"{name}: {result['tokens_per_s']:,.0f} tokens/s, peak {gib(result['peak_bytes'])} GiB, "
              f"wall {result['wall_s']:.0f}s", flush=True)
        write_outputs(args.out, results, meta)  # after every configuration: a time-out keeps what ran
    print(write_outputs(args.out, results, meta))
    return 0 if all("tokens_per_s" in r or "skipped" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
