"""What a prefill chunk costs the running streams: hwrun's engine with `--streams` requests decoding, then one long
prompt admitted and prefilled in chunks of 128 .. 2048 tokens; per chunk size, the time of the steps that carry a
chunk against the plain decode step. This is the measurement behind `prefill_budget.prefill_chunk_for`'s defaults.

Developer script (an accelerator; `--smoke` runs tiny sizes on CPU to prove the script):
    python tools/bench/prefill_chunk.py --out DIR [--streams 63] [--long 2048] [--compile]
Writes DIR/prefill_chunk.json and prints one line per chunk size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_record import stamp  # noqa: E402
from decode import FULL, SMOKE, build_model  # noqa: E402


def timed_steps(engine, n):
    """Wall time (ms) of `n` engine steps (each ends in the host's read of its tokens: a device sync)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def prefill_times(engine, prompt, chunks, device):
    """Median ms of one prefill forward alone (device-synchronised): the first `chunk` tokens of `prompt` into the
    free slot, and a chunk continuing it at position `chunk` (where it fits)."""
    import torch
    from hwrun.inference.engine.scheduler import Chunk

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    slot = engine.kv.owner.index(None)
    times = {}
    for chunk in chunks:
        for start in (0, chunk):
            if start + chunk > len(prompt):
                continue
            runs = []
            for _ in range(5):
                sync()
                begin = time.perf_counter()
                engine.runner.prefill([Chunk(slot, prompt[start:start + chunk], start, False)])
                sync()
                runs.append((time.perf_counter() - begin) * 1e3)
            times[f"{chunk}@{start}"] = statistics.median(runs[1:])
            print(f"prefill of {chunk} tokens at position {start}: {times[f'{chunk}@{start}']:.2f} ms", flush=True)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--streams", type=int, default=63, help="requests decoding while the long prompt arrives")
    parser.add_argument("--long", type=int, default=2048, help="tokens of the long prompt")
    parser.add_argument("--chunks", default="128,256,512,1024,2048")
    parser.add_argument("--compile", action="store_true", help="compile the decode step (inductor)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from hwrun.inference.engine import EngineCore

    device = torch.device("cpu" if args.smoke else "cuda")
    sizes = SMOKE if args.smoke else FULL
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model = build_model(sizes, device, dtype)
    prompt_len, budget = (16, 64) if args.smoke else (128, 4096)
    long_len = min(args.long, 256) if args.smoke else args.long
    engine = EngineCore(model, slots=args.streams + 1, max_cache_len=long_len + budget,
                        compile_backend="inductor" if args.compile else None, prefill_chunk=8192)
    generator = torch.Generator().manual_seed(0)
    vocab = sizes["vocab_size"]
    for index in range(args.streams):
        prompt = torch.randint(1, vocab, (prompt_len,), generator=generator).tolist()
        engine.add(f"s{index}", prompt, max_new_tokens=budget - prompt_len, eos_token_id=None)
    engine.step()  # every stream prefilled, one decode step
    timed_steps(engine, 5)  # warm-up: the step's graph is captured here
    decode = timed_steps(engine, 20)
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "streams": args.streams, "long_prompt": long_len, "compiled": args.compile,
               "decode_step_ms": statistics.median(decode), "chunks": {}}
    print(f"decode step ({args.streams} streams): {results['decode_step_ms']:.2f} ms", flush=True)
    long_prompt = torch.randint(1, vocab, (long_len,), generator=generator).tolist()
    results["prefill_ms"] = prefill_times(engine, long_prompt, [int(c) for c in args.chunks.split(",")], device)
    for chunk in [int(c) for c in args.chunks.split(",")]:
        engine.scheduler.prefill_chunk = chunk
        engine.add("long", long_prompt, max_new_tokens=2, eos_token_id=None)
        steps = -(-long_len // chunk)
        times = timed_steps(engine, steps)  # each carries one chunk and the streams' decode step
        engine.cancel("long")
        timed_steps(engine, 2)
        row = {"steps": steps, "step_ms_median": statistics.median(times), "step_ms_max": max(times),
               "ratio_to_decode": statistics.median(times) / results["decode_step_ms"]}
        results["chunks"][chunk] = row
        print(f"chunk {chunk}: {steps} steps, {row['step_ms_median']:.2f} ms median ({row['ratio_to_decode']:.1f}x a "
              f"decode step), {row['step_ms_max']:.2f} ms max", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp(results, argv)
    (out / "prefill_chunk.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
