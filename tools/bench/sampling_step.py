"""What the graph decoders' sampling costs per step, by part, and whether it compiles, at 1, 8 and 64 rows.

Developer script (CUDA): random bf16 logits over Llama-3's vocabulary (128,256); each variant runs
inside a captured CUDA graph (as in the decoders) and is timed over many replays. Variants: the greedy
argmax (the baseline), `next_tokens` eager and compiled, and its parts (the sort-based top-k/top-p filter,
the counter-based noise), and the filter's plain form (float32 sort, torch.cumsum: what Inductor failed to
compile at 8 rows on 2026-12-05) with its sort or its cumsum replaced. Since then hwrun's own filter sorts
in the logits' dtype and, compiled, sums by `block_cumsum`, so its "compiled" rows are not comparable with that
day's JSON. A compile that fails is recorded with its full traceback.
Usage: python tools/bench/sampling_step.py --out DIR [--rows 1,8,64] [--vocab 128256]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402


def replay_us(fn, repeats=200):
    """Microseconds per call of `fn` captured in one CUDA graph (eager fallback if capture fails)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def candidate_filter(logits, temperature, top_k, top_p, cumsum=None, sort=None):
    """The filter's plain form (float32 sort, torch.cumsum), with the cumulative sum and the sort replaceable: the
    reference the candidates are checked and timed against."""
    import torch

    scaled = logits.to(torch.float32) / torch.where(temperature > 0, temperature, 1.0)[:, None]
    vocab = scaled.shape[-1]
    ordered = (sort or (lambda v: v.sort(dim=-1, descending=True).values))(scaled)
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)[:, None]
    in_k = ranks < k
    probs = torch.softmax(ordered.masked_fill(~in_k, float("-inf")), dim=-1)
    before = (cumsum or (lambda v: v.cumsum(dim=-1)))(probs) - probs
    keep = in_k & ((before < top_p[:, None]) | (top_p[:, None] >= 1))
    last = keep.sum(dim=-1, keepdim=True).clamp(min=1) - 1
    threshold = ordered.gather(1, last)
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def measure_rows(rows, vocab):
    """Microseconds per variant at `rows` rows (a failed compile: its error and traceback)."""
    import torch
    from hwrun.inference.decode.sampling import (
        block_cumsum,
        filter_logits,
        next_tokens,
        uniform_noise,
    )

    gen = torch.Generator(device="cuda").manual_seed(rows)
    logits = torch.randn(rows, vocab, device="cuda", generator=gen).mul_(4).to(torch.bfloat16)
    temperature = torch.full((rows,), 0.7, device="cuda")
    top_p = torch.full((rows,), 0.9, device="cuda")
    top_k = torch.zeros(rows, dtype=torch.long, device="cuda")
    seed = torch.arange(rows, dtype=torch.long, device="cuda")
    counter = torch.zeros((rows, 1), dtype=torch.long, device="cuda")
    sink = torch.zeros(rows, dtype=torch.long, device="cuda")
    eager_sort = torch.compiler.disable(lambda v: v.sort(dim=-1, descending=True).values)
    variants = {
        "greedy argmax": lambda: sink.copy_(logits.argmax(dim=-1)),
        "next_tokens eager": lambda: sink.copy_(next_tokens(logits, temperature, top_p, top_k, seed, counter)),
        "sort only eager": lambda: logits.float().sort(dim=-1, descending=True),
        "filter eager": lambda: filter_logits(logits, temperature, top_k, top_p),
        "noise eager": lambda: uniform_noise(seed, counter, vocab),
        "cumsum only eager": lambda: logits.float().cumsum(dim=-1),
        "topk 1024 eager": lambda: logits.float().topk(1024, dim=-1),
    }
    compiled = {
        "next_tokens compiled": (next_tokens, (logits, temperature, top_p, top_k, seed, counter)),
        "filter compiled": (filter_logits, (logits, temperature, top_k, top_p)),
        "noise compiled": (uniform_noise, (seed, counter, vocab)),
        "cumsum compiled": (lambda x: x.float().cumsum(dim=-1), (logits,)),
        "filter block-cumsum compiled": (lambda *a: candidate_filter(*a, cumsum=block_cumsum),
                                         (logits, temperature, top_k, top_p)),
        "filter eager-sort compiled": (lambda *a: candidate_filter(*a, sort=eager_sort),
                                       (logits, temperature, top_k, top_p)),
        "filter both compiled": (lambda *a: candidate_filter(*a, cumsum=block_cumsum, sort=eager_sort),
                                 (logits, temperature, top_k, top_p)),
    }
    reference = candidate_filter(logits, temperature, top_k, top_p)
    row = {"block-cumsum filter equals eager": bool(torch.equal(
        torch.isinf(candidate_filter(logits, temperature, top_k, top_p, cumsum=block_cumsum)), torch.isinf(reference)))}
    for name, fn in variants.items():
        row[name] = replay_us(fn)
        print(f"rows {rows:3d} {name:24s} {row[name]:9.1f} us", flush=True)
    for name, (fn, inputs) in compiled.items():
        torch._dynamo.reset()
        step = torch.compile(fn)
        try:
            row[name] = replay_us(lambda s=step, i=inputs: s(*i))
            print(f"rows {rows:3d} {name:24s} {row[name]:9.1f} us", flush=True)
        except Exception as exc:  # noqa: BLE001 - a failing compile is a result here
            row[name] = f"{type(exc).__name__}: {exc}"[:300]
            row[f"{name} traceback"] = traceback.format_exc()[-8000:]
            print(f"rows {rows:3d} {name:24s} FAILED {row[name][:200]}", flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--vocab", type=int, default=128256)
    args = parser.parse_args(argv)

    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = stamp({"torch": torch.__version__, "vocab": args.vocab, "device": torch.cuda.get_device_name(),
                     "rows": {}}, argv)
    for rows in (int(r) for r in args.rows.split(",")):
        results["rows"][rows] = measure_rows(rows, args.vocab)
        (out / "sampling_step.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
