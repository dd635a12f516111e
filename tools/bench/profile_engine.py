"""Where the time of hwrun's engine `generate()` goes at many prompts (CUDA): wall time, host phases, device kernels.

Developer script. `tools/bench/profile_decoders.py` times one captured step; this one times the whole
`EngineCore.generate` of `--batch` random prompts (prefills, chunks of captured steps, the host's reads, packing) with
each paged-attention choice, so a gap between `steps x step time` and the wall time shows where the host or the
prefill spends it. Writes profile_engine.json and the profiler's CPU and CUDA tables per choice.
Usage: python tools/bench/profile_engine.py --out DIR [--batch 64] [--new-tokens 256] [--compile inductor|none]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_record import stamp  # noqa: E402
from decode import FULL, build_model  # noqa: E402

#: Host calls the profile counts (each a wait on the device or a launch).
COUNTED = ("cudaGraphLaunch", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
           "cudaMemcpyAsync", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")


def timed(owner, name, totals):
    """Wrap `owner.name` (an instance attribute) so its wall seconds add up in `totals[name]`."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--compile", default="inductor", choices=("inductor", "none"))
    parser.add_argument("--choices", default="gather,triton")
    args = parser.parse_args(argv)

    import torch
    from hwrun.inference.engine import EngineCore, compiled_buckets

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    sizes = FULL
    model = build_model(sizes, device, torch.bfloat16)
    backend = None if args.compile == "none" else "inductor"
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, sizes["vocab_size"], (args.batch, args.prompt_len), generator=generator).tolist()
    length = -(-(args.prompt_len + args.new_tokens) // 128) * 128
    results = {"batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
               "compile": args.compile, "max_cache_len": length, "runs": {}}
    stamp(results, argv)
    with torch.inference_mode():
        for choice in args.choices.split(","):
            engine = EngineCore(model, slots=args.batch, max_cache_len=length, compile_backend=backend,
                                buckets=compiled_buckets(args.batch, backend is not None), paged_attention=choice)
            start = time.perf_counter()
            engine.generate(prompts, args.new_tokens, eos_token_id=None)  # warm-up: captures, compiles
            torch.cuda.synchronize()
            warm = time.perf_counter() - start
            totals = defaultdict(float)
            for owner, name in ((engine, "_prefill"), (engine, "_move"), (engine.runner, "run"),
                                (engine.runner, "produced"), (engine.scheduler, "reserve"),
                                (engine.scheduler, "finish"), (engine.kv, "sync")):
                timed(owner, name, totals)
            walls = []
            for _ in range(3):
                start = time.perf_counter()
                rows = engine.generate(prompts, args.new_tokens, eos_token_id=None)
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - start)
            phases = {k: v / len(walls) for k, v in totals.items()}  # the timed runs only, not the profiled one
            tokens = sum(map(len, rows))
            wall = sorted(walls)[1]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                engine.generate(prompts, args.new_tokens, eos_token_id=None)
                torch.cuda.synchronize()
            averages = prof.key_averages()
            counts = {e.key: e.count for e in averages if e.key in COUNTED}
            cuda_total = sum(e.self_device_time_total for e in averages) / 1e3
            (out / f"engine-{choice}-cuda.txt").write_text(averages.table(
                sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90))
            (out / f"engine-{choice}-cpu.txt").write_text(averages.table(
                sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=90))
            run = {"warm_up_s": warm, "wall_s": wall, "walls_s": walls, "tokens": tokens,
                   "tokens_per_s": tokens / wall, "steps": engine.steps, "prefills": engine.prefills,
                   "wall_ms_per_step": 1e3 * wall / max(engine.steps, 1),
                   "host_phase_s_per_generate": phases,
                   "profiled_cuda_ms": cuda_total, "host_calls": counts,
                   "graphs": len(engine.graphs), "capture_s": engine.capture_seconds,
                   "paged_attention": engine.kv.attention, "prefill_chunk": engine.prefill_chunk}
            results["runs"][choice] = run
            print(choice, json.dumps(run, indent=1), flush=True)
            del engine
            torch.cuda.empty_cache()
    (out / "profile_engine.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
