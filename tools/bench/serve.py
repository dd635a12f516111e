"""Serving benchmark: `hwrun serve` (and, beside it in the same run, `transformers serve --continuous-batching`)
under N concurrent streaming clients, with the official async `openai` client as the load generator.

    python tools/bench/serve.py --out DIR                       # H200: ~1.2B Llama from a config, bf16
    python tools/bench/serve.py --out DIR --transformers-serve  # ... and transformers serve on the same model
    python tools/bench/serve.py --out DIR --smoke               # the shipped tiny model on CPU (proves it runs)

Each server runs as its own process on a free 127.0.0.1 port. At each concurrency C (default 1, 8, 32, 64)
the generator keeps C streaming requests in flight until `--requests` (default max(4C, 16)) are done;
prompt lengths (words) and output lengths (max_tokens, greedy) are drawn from `--seed`, the same for
every server. Per level: requests/s, output tokens/s (usage counts), time to first token (first text
chunk) p50/p99 and inter-token latency (gaps between text chunks, over all requests) p50/p99.
`--generate-baseline` also times `hwrun.generate`'s batch-1 decode on the same model (the goal: hwrun
serve's concurrency-1 ITL within 10% of it). Writes DIR/serve.json, DIR/serve.md, DIR/serve.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]

#: The ~1.2B Llama of tools/bench/decode.py, with the shipped tokenizer's vocabulary (random bf16 weights).
FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, tie_word_embeddings=True, max_position_embeddings=4096)
WORDS = ("the king said unto them and it came to pass that all the people of the land went out to see what was "
         "done in the city of david where the lord had spoken by the mouth of his servants the prophets saying "
         "behold a time shall come when every man shall sit under his vine").split()
MODEL_ID = "bench"


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank on sorted values), None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def workload(seed: int, count: int, prompt_words: tuple[int, int], new_tokens: tuple[int, int]):
    """`count` (prompt, max_tokens) pairs drawn from `seed` (the same for every server)."""
    rng = random.Random(seed)
    return [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(*prompt_words))).capitalize(),
             rng.randint(*new_tokens)) for _ in range(count)]


async def one_request(client, model_id: str, prompt: str, max_tokens: int) -> dict:
    """Stream one completion; its TTFT, inter-chunk gaps and token count."""
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    tokens = chunks = 0
    stream = await client.completions.create(model=model_id, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            chunks += 1
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
        if getattr(chunk, "usage", None) is not None:
            tokens = chunk.usage.completion_tokens
    return {"ttft": (first - start) if first is not None else None, "gaps": gaps, "tokens": tokens or chunks,
            "seconds": time.perf_counter() - start}


async def run_level(base_url: str, model_id: str, concurrency: int, jobs: list[tuple[str, int]]) -> dict:
    """Keep `concurrency` requests in flight until `jobs` are done; the level's figures."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=os.environ.get("HWRUN_BENCH_KEY", "none"),
                                max_retries=0, timeout=3600)
    await one_request(client, model_id, jobs[0][0], 4)  # the client's own first-call costs stay out of the figures
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    results: list[dict] = []
    errors: list[str] = []

    async def worker():
        while not queue.empty():
            prompt, max_tokens = queue.get_nowait()
            try:
                results.append(await one_request(client, model_id, prompt, max_tokens))
            except Exception as exc:  # noqa: BLE001 - counted and shown, the level goes on
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    return {"concurrency": concurrency, "requests": len(results), "errors": len(errors), "error_examples": errors[:3],
            "seconds": round(wall, 3), "requests_per_s": round(len(results) / wall, 3),
            "output_tokens": tokens, "output_tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_ms": ms(percentile(ttfts, 50)), "ttft_p99_ms": ms(percentile(ttfts, 99)),
            "itl_p50_ms": ms(percentile(gaps, 50)), "itl_p99_ms": ms(percentile(gaps, 99))}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process; `ready_pattern` on its output (or GET /health 200) means it serves."""

    def __init__(self, name: str, command: list[str], port: int | None, log: Path) -> None:
        self.name, self.command, self.port, self.log = name, command, port, log
        self.lines: list[str] = []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        cwd=ROOT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log, "w") as handle:
            for line in iter(self.process.stdout.readline, ""):
                self.lines.append(line)
                handle.write(line)
                handle.flush()

    def wait_ready(self, timeout: float) -> str:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {''.join(self.lines[-20:])}")
            if self.port is None:
                found = [re.search(r"listening on (http://\S+)", line) for line in self.lines]
                found = [m for m in found if m]
                if found:
                    self.port = int(found[0].group(1).rsplit(":", 1)[1])
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                        if response.status == 200:
                            return f"http://127.0.0.1:{self.port}"
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s: {''.join(self.lines[-20:])}")

    def stop(self, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        return self.process.returncode


def build_model_folder(folder: Path, device: str) -> Path:
    """A ~1.2B Llama with random bf16 weights and the shipped tokenizer (nothing to download)."""
    import shutil

    import hwrun
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    config = LlamaConfig(**FULL, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name in ("generation_config.json",):
        shutil.copy(Path(hwrun.DEFAULT_MODEL) / name, folder / name)
    return folder


def generate_baseline(model: str, new_tokens: int, compile_on: bool) -> dict:
    """`hwrun.generate`'s batch-1 decode on `model`: ms per token (median of 3 calls after a warm one), with
    torch's threads set as hwrun serve sets them (the same host work per step)."""
    import hwrun
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.startup import apply_torch_threads

    plan = hwrun.plan(model, compile=compile_on)
    threads, _, _ = apply_torch_threads(plan, ServeConfig())
    loaded_model, tokenizer = hwrun.load(plan)
    times = []
    for index in range(4):
        result = hwrun.generate(plan, "The king said unto them", new_tokens, model=loaded_model, tokenizer=tokenizer)
        if index:
            times.append(result.seconds / max(1, result.total_new_tokens))
    return {"decode": result.decode, "decode_reason": result.decode_reason, "torch_threads": threads,
            "ms_per_token": round(1000 * statistics.median(times), 3), "new_tokens": result.total_new_tokens}


def run_server(name: str, command: list[str], port: int | None, model_id: str, levels: list[int], jobs_of,
               out: Path, ready_timeout: float) -> dict:
    server = Server(name, command, port, out / f"{name}.log")
    try:
        base = server.wait_ready(ready_timeout)
        rows = []
        for concurrency in levels:
            row = asyncio.run(run_level(base, model_id, concurrency, jobs_of(concurrency)))
            print(f"{name:>20} C={concurrency:<3} {row['output_tokens_per_s']:>9} tok/s  "
                  f"{row['requests_per_s']:>7} req/s  TTFT p50/p99 {row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms  "
                  f"ITL p50/p99 {row['itl_p50_ms']}/{row['itl_p99_ms']} ms  errors {row['errors']}", flush=True)
            rows.append(row)
        engine = next((line.split("engine: ", 1)[1].strip() for line in server.lines if "engine: " in line), None)
        return {"rows": rows, "engine": engine, "command": command}
    finally:
        code = server.stop()
        print(f"{name}: exit code {code} after SIGTERM", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="the shipped tiny model on CPU, short requests")
    parser.add_argument("--model", default=None, help="a local model folder (default: built from a config; "
                                                      "--smoke: the shipped tiny model)")
    parser.add_argument("--concurrency", default=None, help="comma list (default 1,8,32,64; --smoke 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default max(4C, 16))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="auto",
                        help="hwrun serve --engine, or a comma list to run each (auto, slots, transformers)")
    parser.add_argument("--compile", action="store_true", help="hwrun serve --compile (compiles the slot step)")
    parser.add_argument("--transformers-serve", action="store_true",
                        help="also run `transformers serve MODEL --continuous-batching` (needs fastapi)")
    parser.add_argument("--generate-baseline", action="store_true", help="also time hwrun.generate at batch 1")
    parser.add_argument("--ready-timeout", type=float, default=900)
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"  # platform-boundary: bench host probe
    if device == "cpu" and not args.smoke:
        print("no CUDA device: run with --smoke on CPU", file=sys.stderr)
        return 2
    if args.model:
        model = args.model
    elif args.smoke:
        import hwrun

        model = hwrun.DEFAULT_MODEL
    else:
        model = str(build_model_folder(out / "model", device))
    if Path(model).exists():  # one spelling for both servers (transformers serve names a local model by its path)
        model = str(Path(model).resolve())
    levels = [int(c) for c in (args.concurrency or ("1,2,4,8" if args.smoke else "1,8,32,64")).split(",")]
    prompt_words, new_tokens = ((4, 24), (16, 48)) if args.smoke else ((64, 512), (128, 512))

    def jobs_of(concurrency: int):
        return workload(args.seed + concurrency, args.requests or max(4 * concurrency, 16), prompt_words, new_tokens)

    most = max(levels)
    python = [sys.executable, "-c", "import sys; from hwrun.cli.main import main; sys.exit(main())"]
    report: dict = {"model": model, "device": device, "levels": levels, "seed": args.seed, "smoke": args.smoke,
                    "prompt_words": prompt_words, "new_tokens": new_tokens, "servers": {},
                    "versions": _versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "cores": os.cpu_count(), "load_average_start": _load_average()}
    for engine in args.engine.split(","):
        command = [*python, "serve", model, "--port", "0", "--max-concurrency", str(most), "--max-queue",
                   str(4 * most + 16), "--served-model-name", MODEL_ID, "--engine", engine]
        if args.compile:
            command.append("--compile")
        result = run_server(f"hwrun-serve-{engine}", command, None, MODEL_ID, levels, jobs_of, out,
                            args.ready_timeout)
        chosen = (result["engine"] or "?").split(" ", 1)[0]
        report["servers"][f"hwrun serve ({engine}: {chosen})" if engine == "auto" else f"hwrun serve ({engine})"] = (
            result)
        _save(report, out)
    if args.transformers_serve:
        from transformers.utils.import_utils import is_serve_available

        if not is_serve_available():
            report["servers"]["transformers serve"] = {"skipped": "transformers serve needs fastapi, pydantic, "
                                                                  "uvicorn and openai (pip install fastapi)"}
            print(f"transformers serve skipped: {report['servers']['transformers serve']['skipped']}")
        else:
            port = free_port()
            theirs = [sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--continuous-batching",
                      "--host", "127.0.0.1", "--port", str(port), "--device", device,
                      "--dtype", "bfloat16" if device == "cuda" else "float32"]
            report["servers"]["transformers serve"] = run_server("transformers-serve", theirs, port, model, levels,
                                                                 jobs_of, out, args.ready_timeout)
        _save(report, out)
    if args.generate_baseline:
        report["generate_baseline"] = generate_baseline(model, 64 if args.smoke else 256, args.compile)
        print(f"hwrun.generate batch 1: {report['generate_baseline']['ms_per_token']} ms/token "
              f"({report['generate_baseline']['decode']})")
    report["load_average_end"] = _load_average()
    _save(report, out)
    _plot(report, out)
    print(_markdown(report))
    return 0


def _load_average() -> list[float] | None:
    """The host's 1/5/15-minute load averages (a loaded host slows a CPU run), None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _versions() -> dict:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "hwrun", "starlette", "uvicorn", "openai"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return versions


def _save(report: dict, out: Path) -> None:
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(_markdown(report))


def _markdown(report: dict) -> str:
    lines = ["| server | concurrency | requests | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
             "ITL p99 ms | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, server in report["servers"].items():
        if "skipped" in server:
            lines.append(f"| {name} | skipped: {server['skipped']} |||||||||")
            continue
        for r in server["rows"]:
            lines.append(f"| {name} | {r['concurrency']} | {r['requests']} | {r['requests_per_s']} | "
                         f"{r['output_tokens_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['itl_p50_ms']} | "
                         f"{r['itl_p99_ms']} | {r['errors']} |")
    if "generate_baseline" in report:
        base = report["generate_baseline"]
        lines.append(f"\nhwrun.generate batch 1 ({base['decode']}): {base['ms_per_token']} ms per token")
    return "\n".join(lines) + "\n"


def _plot(report: dict, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no serve.png", file=sys.stderr)
        return
    panels = [("output_tokens_per_s", "output tokens/s"), ("requests_per_s", "requests/s"),
              ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
              ("itl_p50_ms", "ITL p50 (ms)"), ("itl_p99_ms", "ITL p99 (ms)")]
    figure, axes = plt.subplots(2, 3, figsize=(13, 7))
    for axis, (key, label) in zip(axes.flat, panels, strict=True):
        for name, server in report["servers"].items():
            rows = server.get("rows") or []
            points = [(r["concurrency"], r[key]) for r in rows if r[key] is not None]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    axes.flat[0].legend()
    title = "CPU smoke run (tiny model)" if report["smoke"] else f"{report['device']}: {Path(report['model']).name}"
    figure.suptitle(f"hwrun serve benchmark, {title}")
    figure.tight_layout()
    figure.savefig(out / "serve.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
