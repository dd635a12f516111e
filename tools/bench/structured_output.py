"""Structured output's cost: compile time per schema (cold and cached) and the per-token mask time of xgrammar and
llguidance, on the shipped tiny tokenizer and a realistic ~128k-token one, and `apply_bitmask` on the device.

For each tokenizer, grammar engine and schema (json_object, a tool-call array as tool_choice="required" sends, a
nested schema) a matcher is driven by seeded random tokens drawn uniformly from its own mask (after `--budget`
tokens, tokens that close a string, array or object are preferred, then "," and ":", then tokens without digits,
so every run ends) and every `fill` and `accept` is timed (this thread's CPU time: what the mask costs, whatever
else the host runs), with one step's masks for `--batch` rows, row by row and batched. No realistic tokenizer is downloaded: one from `--large PATH` (a folder with tokenizer.json), else a
byte-level BPE of 128,256 ids (Llama 3's size, its 256 special tokens included) is trained offline on local text
(this repository's Markdown and the installed Python sources) and cached. `apply_bitmask` is timed on the device
hwenv detects (CUDA: eager and replayed in a captured CUDA graph, next to xgrammar's Triton kernel; CPU: next to
xgrammar's C++ kernel), with the bitmask's host-to-device copy.

Usage: uv run python tools/bench/structured_output.py [--out docs/benchmarks] [--tokenizers tiny,large] [--seeds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LARGE_SIZE = 128_256
LARGE_CACHE = Path.home() / ".cache" / "hwrun-bench" / f"bpe-{LARGE_SIZE}"
CORPUS_BYTES = 160 << 20

TOOL_CALLS = {  # what tool_choice="required" with two functions constrains the text to (parallel calls allowed)
    "type": "array", "minItems": 1,
    "items": {"anyOf": [
        {"type": "object", "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                "required": ["city", "unit", "days"], "additionalProperties": False}},
         "required": ["name", "arguments"], "additionalProperties": False},
        {"type": "object", "properties": {
            "name": {"const": "search"},
            "arguments": {"type": "object", "properties": {"query": {"type": "string"},
                                                           "limit": {"type": "integer"}},
                          "required": ["query", "limit"], "additionalProperties": False}},
         "required": ["name", "arguments"], "additionalProperties": False}]},
}
NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "title": {"type": "string"}, "score": {"type": "number"},
        "status": {"enum": ["draft", "published", "archived"]}, "public": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,15}$"}, "maxItems": 5},
        "author": {"type": "object", "properties": {
            "name": {"type": "string"}, "joined": {"type": "string", "format": "date-time"},
            "links": {"type": "array", "items": {"type": "object", "properties": {
                "rel": {"enum": ["home", "blog", "code"]}, "url": {"type": "string", "format": "uri"}},
                "required": ["rel", "url"], "additionalProperties": False}}},
            "required": ["name", "joined", "links"], "additionalProperties": False},
        "sections": {"type": "array", "items": {"$ref": "#/$defs/section"}, "maxItems": 3},
    },
    "required": ["id", "title", "score", "status", "public", "tags", "author", "sections"],
    "additionalProperties": False,
    "$defs": {"section": {"type": "object", "properties": {
        "heading": {"type": "string"}, "level": {"type": "integer", "minimum": 1, "maximum": 6},
        "body": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["heading", "level", "body"], "additionalProperties": False}},
}
SCHEMAS = {"json_object": None, "tool_calls": TOOL_CALLS, "nested": NESTED}


def corpus_files(limit: int = CORPUS_BYTES) -> list[Path]:
    """Local text to train the large tokenizer on: the repository's Markdown, then installed Python sources (sorted,
    so the same machine always gives the same tokenizer), up to `limit` bytes."""
    import sysconfig

    files = sorted(p for p in ROOT.rglob("*.md") if ".venv" not in p.parts)
    files.append(ROOT / "packages/hwrun/src/hwrun/models/tiny-llama/sample_train.txt")
    files += sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py"))
    chosen, total = [], 0
    for path in files:
        size = path.stat().st_size
        if size and total < limit:
            chosen.append(path)
            total += size
    return chosen


def large_tokenizer(path: Path | None, cache: Path = LARGE_CACHE):
    """A Transformers fast tokenizer of ~128k ids: the one at `path`, else the cached trained BPE (trained now if
    absent); returns (tokenizer, description)."""
    from transformers import PreTrainedTokenizerFast

    if path is not None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path), f"{path} (given)"
    if not (cache / "tokenizer.json").exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] + [
            f"<|reserved_special_token_{i}|>" for i in range(253)]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=LARGE_SIZE, special_tokens=specials, min_frequency=2,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        files = corpus_files()
        started = time.perf_counter()
        tokenizer.train([str(f) for f in files], trainer)
        cache.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(cache / "tokenizer.json"))
        (cache / "trained.json").write_text(json.dumps({
            "files": len(files), "bytes": sum(f.stat().st_size for f in files), "vocab": tokenizer.get_vocab_size(),
            "seconds": round(time.perf_counter() - started, 1)}))
    made = json.loads((cache / "trained.json").read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(cache / "tokenizer.json"),
                                        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    return tokenizer, (f"byte-level BPE of {len(tokenizer):,} ids trained offline on {made['bytes'] / 2**20:.0f} MiB "
                       f"of local text ({made['files']:,} files: this repository's Markdown, installed Python "
                       f"sources), no download")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def allowed_ids(row, shifts, vocab: int) -> list[int]:
    return ((row.unsqueeze(-1) >> shifts) & 1).flatten()[:vocab].nonzero().flatten().tolist()


def pick(allowed: list[int], texts: list[str], rng: random.Random, closing: bool) -> int:
    """A uniform draw from `allowed`; with `closing`, from the tokens that close a string, array or object if any,
    else from "," and ":", else from tokens without digits (a number or a time's fraction ends), else from any token
    that is not whitespace."""
    if closing:
        solid = [i for i in allowed if i < len(texts) and texts[i].strip()]
        shut = [i for i in solid if set(texts[i].strip()) <= set('"}]')]
        punctuation = [i for i in solid if set(texts[i].strip()) <= set(",:")]
        allowed = shut or punctuation or [i for i in solid if not any(c.isdigit() for c in texts[i])] or solid or allowed
    return rng.choice(allowed)


def drive(matcher, texts: list[str], seed: int, budget: int, limit: int = 4000) -> dict:
    """One seeded random run of `matcher` to the end: per-token fill and accept times in µs, wall clock and this
    thread's CPU time (the CPU time is what the fill costs; the wall clock adds whatever else ran on the core)."""
    import torch
    from hwrun.inference.structured import allocate_bitmask

    rng = random.Random(seed)
    vocab = matcher.vocab.vocab_size
    bitmask = allocate_bitmask(1, vocab)
    shifts = torch.arange(32, dtype=torch.int32)
    fills, fills_cpu, accepts = [], [], []
    for step in range(limit):
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        matcher.fill(bitmask, 0)
        fills.append((time.perf_counter_ns() - wall) / 1e3)
        fills_cpu.append((time.thread_time_ns() - cpu) / 1e3)
        token = pick(allowed_ids(bitmask[0], shifts, vocab), texts, rng, step >= budget)
        cpu = time.thread_time_ns()
        ok = matcher.accept(token)
        accepts.append((time.thread_time_ns() - cpu) / 1e3)
        if not ok:
            raise RuntimeError(f"a token from the mask was rejected (seed {seed}, step {step})")
        if token in matcher.stop_token_ids or matcher.finished:
            break
    else:
        if limit > 1:
            raise RuntimeError(f"the grammar did not finish in {limit} tokens (seed {seed})")
    return {"fills": fills, "fills_cpu": fills_cpu, "accepts": accepts, "tokens": len(fills)}


def batch_step(compiler, spec, texts: list[str], rows: int, repeats: int) -> dict:
    """One decode step's masks for `rows` requests of `spec`, each at its own point of the grammar: row by row
    (`matcher.fill`) and all at once (`compiler.fill`, the engine's threads), wall clock in ms (median of repeats).
    Every timed fill meets a state never filled before (each matcher takes a token after each fill): a repeated
    state would be llguidance's cached mask."""
    import torch
    from hwrun.inference.structured import allocate_bitmask

    vocab = compiler.vocab.vocab_size
    shifts = torch.arange(32, dtype=torch.int32)
    bitmask = allocate_bitmask(rows, vocab)
    rngs = [random.Random(row) for row in range(rows)]
    matchers = [compiler.matcher(spec) for _ in range(rows)]

    def advance(row: int) -> None:
        """One random allowed token for `row` (a new matcher once the last one is done)."""
        if matchers[row].stopped or matchers[row].finished:
            matchers[row] = compiler.matcher(spec)
        matchers[row].fill(bitmask, row)
        matchers[row].accept(pick(allowed_ids(bitmask[row], shifts, vocab), texts, rngs[row], False))

    for row in range(rows):  # spread the rows over the grammar
        for _ in range(row % 40):
            advance(row)
    one, together = [], []
    for _ in range(repeats):
        pairs = list(enumerate(matchers))
        started = time.perf_counter()
        for row, matcher in pairs:
            matcher.fill(bitmask, row)
        one.append((time.perf_counter() - started) * 1e3)
        for row in range(rows):
            advance(row)
        pairs = list(enumerate(matchers))
        started = time.perf_counter()
        compiler.fill(bitmask, pairs)
        together.append((time.perf_counter() - started) * 1e3)
        for row in range(rows):
            advance(row)
    return {"rows": rows, "row_by_row_ms": statistics.median(one), "batched_ms": statistics.median(together)}


def measure_engine(tokenizer, texts, backend: str, seeds: int, budget: int, repeats: int, batch_rows: int) -> dict:
    """Set-up, compile and per-token figures of one grammar engine on one tokenizer."""
    from hwrun.inference.structured import StructuredOutput, structured_compiler

    started = time.perf_counter()
    compiler = structured_compiler(tokenizer, len(tokenizer), backend=backend)
    result = {"setup_ms": (time.perf_counter() - started) * 1e3, "schemas": {}}
    for name, schema in SCHEMAS.items():
        spec = StructuredOutput("json_object") if schema is None else StructuredOutput.json_schema(schema)
        cold = []
        for _ in range(repeats):
            compiler._cache.clear()  # a cold compile each time (xgrammar's own cache is off in hwrun)
            started = time.perf_counter()
            compiler.compiled(spec)
            cold.append((time.perf_counter() - started) * 1e3)
        cached, first = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            matcher = compiler.matcher(spec)
            cached.append((time.perf_counter() - started) * 1e3)
            runs = drive(matcher, texts, 0, budget, limit=1)
            first.append(runs["fills"][0] / 1e3)
        fills, fills_cpu, accepts, tokens = [], [], [], []
        for seed in range(seeds):
            run = drive(compiler.matcher(spec), texts, seed, budget)
            fills += run["fills"][1:]  # the first mask is reported apart (first_mask_ms)
            fills_cpu += run["fills_cpu"][1:]
            accepts += run["accepts"]
            tokens.append(run["tokens"])
        result["schemas"][name] = {
            "compile_cold_ms": statistics.median(cold), "compile_cold_all_ms": cold,
            "matcher_cached_ms": statistics.median(cached), "first_mask_ms": statistics.median(first),
            "fill_cpu_us_mean": statistics.fmean(fills_cpu), "fill_cpu_us_p50": percentile(fills_cpu, 0.5),
            "fill_cpu_us_p90": percentile(fills_cpu, 0.9), "fill_cpu_us_p99": percentile(fills_cpu, 0.99),
            "fill_cpu_us_max": max(fills_cpu),
            "fill_wall_us_p50": percentile(fills, 0.5), "fill_wall_us_p99": percentile(fills, 0.99),
            "accept_cpu_us_mean": statistics.fmean(accepts), "tokens": sum(tokens), "runs": seeds,
            "batch": batch_step(compiler, spec, texts, batch_rows, repeats) if batch_rows else None,
        }
        row = result["schemas"][name]
        batch = row["batch"] or {}
        print(f"  {backend:10s} {name:11s} compile cold {row['compile_cold_ms']:8.1f} ms, cached matcher "
              f"{row['matcher_cached_ms']:6.2f} ms, first mask {row['first_mask_ms']:6.2f} ms, fill (CPU time) mean "
              f"{row['fill_cpu_us_mean']:7.1f} us p50 {row['fill_cpu_us_p50']:7.1f} p99 {row['fill_cpu_us_p99']:8.1f}, "
              f"accept {row['accept_cpu_us_mean']:5.1f} us ({row['tokens']} tokens)"
              + (f"; {batch['rows']} rows: row by row {batch['row_by_row_ms']:.2f} ms, batched "
                 f"{batch['batched_ms']:.2f} ms" if batch else ""), flush=True)
    return result


def synchronize(torch) -> None:
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()


def time_us(torch, fn, repeats: int = 20, calls: int = 10) -> float:
    """µs per call of `fn`: the median over `repeats` blocks of `calls` calls (robust to a loaded host). With an
    accelerator, wall clock up to its synchronize; on the CPU, this thread's CPU time (torch on one thread: --threads 1)."""
    clock = time.perf_counter_ns if torch.accelerator.is_available() else time.thread_time_ns
    for _ in range(3):
        fn()
    blocks = []
    for _ in range(repeats):
        synchronize(torch)
        started = clock()
        for _ in range(calls):
            fn()
        synchronize(torch)
        blocks.append((clock() - started) / 1e3 / calls)
    return statistics.median(blocks)


def table_apply(logits, bitmask):
    """hwrun's plain-torch form (a 256 x 8 byte table), what `apply_bitmask` runs on accelerators."""
    from hwrun.inference.structured.bitmask import blocked_tokens

    return logits.masked_fill_(blocked_tokens(bitmask)[:, :logits.shape[1]], float("-inf"))


def shift_apply(logits, bitmask):
    """The other plain-torch form, for comparison: each word shifted 32 ways (8 bytes of temporaries per token)."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    blocked = ((bitmask.unsqueeze(-1) >> shifts) & 1).eq(0).view(logits.shape[0], -1)[:, :logits.shape[1]]
    return logits.masked_fill_(blocked, float("-inf"))


def graph_us(torch, fn, check) -> dict:
    """`fn` captured in a CUDA graph: µs per replay, and whether the replay masked as eager did."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return {"graph_us": time_us(torch, graph.replay), "graph_equal_eager": check(graph.replay)}


def apply_case(platform_, name: str, vocab: int, rows: int, xgrammar) -> dict:
    """One (vocabulary, rows) case of `apply_bitmask` and xgrammar's kernel on hwenv's `platform_`."""
    import torch
    from hwrun.inference.structured import allocate_bitmask, apply_bitmask

    device, accelerator = platform_.device_type, platform_.is_accelerator
    gen = torch.Generator().manual_seed(rows)
    host = allocate_bitmask(rows, vocab, pin_memory=accelerator)
    host.copy_(torch.randint(-(2**31), 2**31 - 1, host.shape, dtype=torch.int32, generator=gen))
    bitmask = host.to(device)
    source = torch.randn(rows, vocab, generator=gen).to(device=device, dtype=torch.bfloat16)
    logits = source.clone()
    reference = apply_bitmask(source.clone(), bitmask)
    row = {"vocab": name, "vocab_size": vocab, "rows": rows,
           "apply_bitmask_us": time_us(torch, lambda: apply_bitmask(logits, bitmask)),
           "torch_us": time_us(torch, lambda: table_apply(logits, bitmask)),
           "torch_shift_us": time_us(torch, lambda: shift_apply(logits, bitmask)),
           "copy_to_device_us": time_us(torch, lambda: bitmask.copy_(host, non_blocking=True)) if accelerator else None}
    if xgrammar is not None:
        try:
            check = source.clone()
            xgrammar.apply_token_bitmask_inplace(check, bitmask)
            row["xgrammar_kernel_equal"] = bool(torch.equal(check, reference))
            row["xgrammar_kernel_us"] = time_us(torch, lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask))
        except Exception as error:  # noqa: BLE001 - a kernel that cannot run here is a result
            row["xgrammar_kernel_error"] = f"{type(error).__name__}: {error}"[:300]
    if platform_.graph_api == "cuda_graphs":
        def replay_equal(replay) -> bool:
            logits.copy_(source)
            replay()
            return bool(torch.equal(logits, reference))

        row.update(graph_us(torch, lambda: table_apply(logits, bitmask), replay_equal))
        row["graph_shift_us"] = graph_us(torch, lambda: shift_apply(logits, bitmask), replay_equal)["graph_us"]
    return row


def measure_apply(platform_, vocabs: dict[str, int], rows_list: list[int]) -> list[dict]:
    """`apply_bitmask` (hwrun's plain torch) next to xgrammar's kernel, and the bitmask's copy to the device."""
    try:
        import xgrammar
    except ImportError:
        xgrammar = None
    results = []
    for name, vocab in vocabs.items():
        for rows in rows_list:
            row = apply_case(platform_, name, vocab, rows, xgrammar)
            results.append(row)
            print(f"  apply_bitmask {name:5s} rows {rows:3d}: {row['apply_bitmask_us']:8.1f} us; torch byte table "
                  f"{row['torch_us']:8.1f} us, shift form {row['torch_shift_us']:8.1f}"
                  + (f", xgrammar kernel {row['xgrammar_kernel_us']:8.1f} us" if "xgrammar_kernel_us" in row else "")
                  + (f", graph replay {row['graph_us']:8.1f} us" if "graph_us" in row else "")
                  + (f", copy {row['copy_to_device_us']:6.1f} us" if row["copy_to_device_us"] else ""), flush=True)
    return results


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("xgrammar", "llguidance", "torch", "transformers", "tokenizers"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def markdown(result: dict) -> str:
    """The tables of docs/benchmarks/structured_output.md from a run's JSON."""
    lines = ["| tokenizer | engine | schema | compile cold (ms) | matcher, cached (ms) | mask CPU µs/token mean | "
             "p50 | p90 | p99 | accept µs | tokens | 64-row step: row by row / batched (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for tok, entry in result["tokenizers"].items():
        for backend, data in entry["engines"].items():
            for schema, r in data["schemas"].items():
                batch = r.get("batch") or {}
                lines.append(
                    f"| {tok} ({entry['vocab_size']:,}) | {backend} | {schema} | {r['compile_cold_ms']:.1f} | "
                    f"{r['matcher_cached_ms']:.3f} | {r['fill_cpu_us_mean']:.1f} | {r['fill_cpu_us_p50']:.1f} | "
                    f"{r['fill_cpu_us_p90']:.1f} | {r['fill_cpu_us_p99']:.1f} | {r['accept_cpu_us_mean']:.1f} | "
                    f"{r['tokens']} | {batch.get('row_by_row_ms', float('nan')):.2f} / "
                    f"{batch.get('batched_ms', float('nan')):.2f} |")
    lines += ["", "| vocabulary | rows | apply_bitmask µs | torch byte-table form µs | torch shifted-word form µs | "
              "xgrammar kernel µs | byte table, graph replay µs | shifted words, graph replay µs | "
              "host-to-device copy µs |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result.get("apply_bitmask", []):
        cells = [f"{r[key]:.1f}" if isinstance(r.get(key), float) else "—" for key in (
            "apply_bitmask_us", "torch_us", "torch_shift_us", "xgrammar_kernel_us", "graph_us", "graph_shift_us",
            "copy_to_device_us")]
        lines.append(f"| {r['vocab']} ({r['vocab_size']:,}) | {r['rows']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Per-token mask time (mean bar, p99 tick) and cold compile time, per engine, schema and tokenizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokenizers = list(result["tokenizers"])
    fig, axes = plt.subplots(2, len(tokenizers), figsize=(6 * len(tokenizers), 7), squeeze=False)
    for column, tok in enumerate(tokenizers):
        engines = result["tokenizers"][tok]["engines"]
        width = 0.8 / max(1, len(engines))
        for index, (backend, data) in enumerate(engines.items()):
            names = list(data["schemas"])
            xs = [i + index * width for i in range(len(names))]
            rows = [data["schemas"][n] for n in names]
            axes[0][column].bar(xs, [r["fill_cpu_us_mean"] for r in rows], width, label=f"{backend} mean")
            axes[0][column].scatter(xs, [r["fill_cpu_us_p99"] for r in rows], marker="_", s=300, color="black",
                                    zorder=3, label="p99" if index == len(engines) - 1 else None)
            axes[1][column].bar(xs, [r["compile_cold_ms"] for r in rows], width, label=backend)
            for ax in (axes[0][column], axes[1][column]):
                ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(names))], names)
        axes[0][column].set_ylabel("µs of CPU per token's mask")
        axes[0][column].set_title(f"{tok}: {result['tokenizers'][tok]['vocab_size']:,} ids")
        axes[1][column].set_ylabel("cold compile (ms)")
        for ax in (axes[0][column], axes[1][column]):
            ax.set_yscale("log")
            ax.legend(fontsize=8)
    fig.suptitle(f"Structured output on {result['device_name']} (xgrammar {result['versions']['xgrammar']}, "
                 f"llguidance {result['versions']['llguidance']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--tokenizers", default="tiny,large", help="comma-separated: tiny, large")
    parser.add_argument("--large", type=Path, default=None, help="a tokenizer folder to use as the large one")
    parser.add_argument("--backends", default="xgrammar,llguidance")
    parser.add_argument("--seeds", type=int, default=8, help="random runs per schema")
    parser.add_argument("--budget", type=int, default=150, help="tokens before closing tokens are preferred")
    parser.add_argument("--repeats", type=int, default=5, help="cold compiles and cached matchers timed per schema")
    parser.add_argument("--rows", default="1,64", help="batch rows for apply_bitmask")
    parser.add_argument("--apply-vocab", default="", help="more vocabulary sizes for apply_bitmask, e.g. 151936")
    parser.add_argument("--large-cache", type=Path, default=LARGE_CACHE, help="where the trained tokenizer is kept")
    parser.add_argument("--batch", type=int, default=64, help="rows of one step's batched mask fill (0: skip)")
    parser.add_argument("--name", default="structured_output", help="output file stem")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)

    import hwenv
    import hwrun
    import torch
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    accel = hwenv.detect()
    platform_ = hwenv.get_platform(accel.kind)
    device = platform_.device_type
    threads = torch.get_num_threads()
    result = {
        "bench": "structured_output", "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device,
        "device_name": accel.names[0] if accel.names else device, "cpu": platform.processor() or platform.machine(),
        "torch_threads": threads, "python": sys.version.split()[0], "versions": versions(),
        "seeds": args.seeds, "budget": args.budget, "load_average_start": os.getloadavg(), "tokenizers": {},
    }
    stamp(result)  # device_info, env, git beside its own command, date and versions
    loaded = {}
    for name in args.tokenizers.split(","):
        if name == "tiny":
            loaded[name] = (AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL), "the shipped tiny model's byte-level "
                            "BPE (hwrun.DEFAULT_MODEL)")
        elif name == "large":
            started = time.perf_counter()
            loaded[name] = large_tokenizer(args.large, args.large_cache)
            print(f"large tokenizer ready in {time.perf_counter() - started:.1f} s: {loaded[name][1]}", flush=True)
        else:
            parser.error(f"--tokenizers takes tiny and/or large, not {name!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (tokenizer, description) in loaded.items():
        texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
        entry = {"vocab_size": len(tokenizer), "description": description, "engines": {}}
        result["tokenizers"][name] = entry
        print(f"{name}: {len(tokenizer):,} ids", flush=True)
        for backend in args.backends.split(","):
            entry["engines"][backend] = measure_engine(tokenizer, texts, backend, args.seeds, args.budget,
                                                       args.repeats, args.batch)
            (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    vocabs = {name: len(tok) for name, (tok, _) in loaded.items()}
    vocabs.update({str(size): int(size) for size in args.apply_vocab.split(",") if size})
    result["apply_bitmask"] = measure_apply(platform_, vocabs, [int(r) for r in args.rows.split(",")])
    result["load_average_end"] = os.getloadavg()
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / f"{args.name}.png")
    (args.out / f"{args.name}.tables.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out / (args.name + '.json')} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
