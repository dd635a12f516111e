"""What a request's extra sampling costs in hwrun's engine step: the token choice alone per step kind (greedy argmax,
sampled, processed = bias + penalties + min-p + logprobs, masked = processed + a grammar bitmask) over a large
vocabulary, and whole `EngineCore.step()`s of the shipped tiny model with every row plain, penalised + logprobs, or
grammar-masked (a fake matcher allowing a fixed set of ids: the engine's share, not a grammar engine's), all in one
run, as ratios to the plain step.

The variants run interleaved in rounds (each round times every variant once) and each figure is the median over
rounds, so a shared machine's load hits them alike. CPU by default; `--device cuda` times on a GPU (synchronized).
Usage: python tools/bench/engine_sampling.py [--rows 1,8] [--vocab 128256] [--rounds 15] [--device cpu]
       [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402


def timed(fn, device, calls):
    """Seconds per call of `fn` over `calls` calls."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


class Allow:
    """A fake grammar matcher: a fixed set of allowed ids (its bitmask row made once: `fill` is one row copy, so the
    figure is the engine's share, not a grammar engine's), never finished."""

    def __init__(self, allowed, vocab):
        import torch

        self.allowed = set(allowed)
        self.row = torch.zeros(-(-vocab // 32), dtype=torch.int32)
        for token in self.allowed:
            word, bit = divmod(token, 32)
            self.row[word] |= (1 << bit) if bit < 31 else -(1 << 31)

    def fill(self, bitmask, row):
        bitmask[row] = self.row

    def accept(self, token):
        return token in self.allowed

    finished = False


def choice_rows(rows, vocab, device, rounds, calls):
    """Microseconds per token choice of `rows` rows by step kind (median over rounds; every row penalised, with
    logprobs and a bitmask, so each kind does all its work)."""
    import torch
    from hwrun.inference.decode import SamplingParams
    from hwrun.inference.engine.choosing import KIND_NAMES, KINDS, RowChoice

    choice = RowChoice(rows, vocab, device)
    penalised = SamplingParams(temperature=0.8, top_p=0.9, seed=1, min_p=0.05, presence_penalty=0.5,
                               frequency_penalty=0.3, repetition_penalty=1.2, logit_bias=((5, 2.0),), logprobs=5)
    for row in range(rows):
        choice.set(row, penalised, list(range(row, row + 64)), constrained=True)
    logits = torch.randn(rows, vocab, device=device).to(torch.bfloat16)
    count = torch.zeros(rows, 1, dtype=torch.long, device=device)
    kinds = KINDS
    samples = {KIND_NAMES[k]: [] for k in kinds}
    with torch.inference_mode():
        for kind in kinds:
            choice.decode(kind, logits, rows, count)  # warm
        for _ in range(rounds):
            for kind in kinds:
                samples[KIND_NAMES[kind]].append(timed(lambda k=kind: choice.decode(k, logits, rows, count), device,
                                                       calls) * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def engine_steps(rows, device, rounds, steps):
    """Milliseconds per `EngineCore.step()` of the shipped tiny model with `rows` requests decoding, by mix."""
    import hwrun
    from hwrun.inference.decode import SamplingParams
    from hwrun.inference.engine import EngineCore

    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device=device.type)
    model, tokenizer = hwrun.load(plan)
    prompt = tokenizer("Once upon a time there was a little house")["input_ids"]
    extras = dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3, logprobs=5)
    sampled = dict(temperature=0.8, top_p=0.9, seed=3)
    mixes = {
        "plain (greedy)": lambda i: {},
        "greedy + penalties + logprobs=5": lambda i: {"sampling": SamplingParams(**extras)},
        "greedy + grammar mask (fake matcher)": lambda i: {
            "matchers": [Allow(range(15, 3000, 7), model.config.vocab_size)]},
        "sampled": lambda i: {"sampling": SamplingParams(**sampled)},
        "sampled + penalties + logprobs=5": lambda i: {"sampling": SamplingParams(**sampled, **extras)},
    }
    budget = 2 + (rounds + 1) * steps
    engines = {}
    for name, extra in mixes.items():
        engine = EngineCore(model, slots=rows, max_cache_len=len(prompt) + budget + 8, use_graphs=False,
                            buckets=[rows])
        for i in range(rows):
            engine.add(f"r{i}", prompt, max_new_tokens=budget, eos_token_id=None, **extra(i))
        engine.step()
        engines[name] = engine
        engine.step()  # warm
    samples = {name: [] for name in mixes}
    for _ in range(rounds):
        for name, engine in engines.items():
            samples[name].append(timed(engine.step, device, steps) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as hwrun serve on a 2-core host)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "vocab": args.vocab, "choice_us": {}, "engine_step_ms": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        calls = max(1, 8 // rows)
        us = choice_rows(rows, args.vocab, device, args.rounds, calls)
        result["choice_us"][rows] = us
        print(f"token choice, {rows} rows x {args.vocab} vocab (us; x greedy / x sampled): " + ", ".join(
            f"{k} {v:.0f} ({v / us['greedy']:.1f}x / {v / us['sampled']:.2f}x)" for k, v in us.items()), flush=True)
    for rows in (1, 8):
        ms = engine_steps(rows, device, args.rounds, 5)
        result["engine_step_ms"][rows] = ms
        base = ms["plain (greedy)"]
        print(f"EngineCore.step(), tiny model, {rows} rows (ms; x plain): " + ", ".join(
            f"{k} {v:.2f} ({v / base:.2f}x)" for k, v in ms.items()), flush=True)
    if args.out is not None:
        stamp(result)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
