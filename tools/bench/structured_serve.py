"""Structured output's cost behind `hwrun serve`: output tokens/s with and without a grammar at 1 and 64 streams.

One server (hwrun's engine, the shipped tiny model unless --model), the same chat requests three ways, side by side
in one run: free text, `response_format={"type": "json_object"}` and a `json_schema` (a tool-call-like object with an
enum, a boolean and a free string). Every request samples (temperature 0.7, its own seed) `--max-tokens` tokens at
most; a constrained request may end sooner (its JSON closed), so the figure is output tokens per second of wall
time over all streams, and the ratio constrained / free is the cost of the grammar (the host's mask fill, the copy
and the masked step). Writes OUT/structured_serve.json (device, versions, command, every row) and .png.

    uv run python tools/bench/structured_serve.py --out OUT [--streams 1,64] [--rounds 2] [--device auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import offline_transformers, stamp  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["tool", "urgent", "note"],
          "properties": {"tool": {"type": "string", "enum": ["get_weather", "get_time", "search"]},
                         "urgent": {"type": "boolean"}, "note": {"type": "string", "maxLength": 80}}}
FORMATS = {"free": None, "json_object": {"type": "json_object"},
           "json_schema": {"type": "json_schema", "json_schema": {"name": "call", "schema": SCHEMA, "strict": True}}}
ASK = [{"role": "user", "content": "Which tool should answer: what is the weather in Paris?"}]


async def _one_round(client, model: str, streams: int, fmt: dict | None, max_tokens: int, seed: int,
                     repeat: int = 1) -> tuple[int, float]:
    """(completion tokens, seconds of wall time) of one round: `streams` concurrent clients, each sending `repeat`
    requests one after the other."""
    async def one(i: int) -> int:
        extra = {"response_format": fmt} if fmt is not None else {}
        tokens = 0
        for j in range(repeat):
            answer = await client.chat.completions.create(model=model, messages=ASK, max_tokens=max_tokens,
                                                          temperature=0.7, seed=seed + 100 * i + j, **extra)
            tokens += answer.usage.completion_tokens
        return tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts), time.perf_counter() - start


def main() -> int:
    """Run the benchmark; 0 when every request answered."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default=None, help="model folder (default: the shipped tiny model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--streams", default="1,64", help="concurrent streams, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per (streams, format), interleaved")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256,
                        help="requests per (streams, format, round) at least: each stream sends its share in turn")
    args = parser.parse_args()
    offline_transformers()  # USE_HUB_KERNELS=NO before transformers is imported (bench_record.OFFLINE_ENV)

    import hwrun
    import openai
    import torch
    import transformers
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.server import ServerThread

    streams = [int(s) for s in args.streams.split(",")]
    plan = hwrun.plan(args.model or _chat_model(Path(args.out)), device=args.device)
    model_id = "bench"
    config = ServeConfig(port=0, max_concurrency=max(streams), max_queue=max(streams), model_id=model_id,
                         engine="slots")
    server = ServerThread(config, plan, say=lambda line: None).start()
    rows = []
    try:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)

        async def run_all() -> None:
            await _one_round(client, model_id, 1, FORMATS["json_schema"], 8, 0)  # warm the grammar path once
            for count in streams:
                totals = {name: [0, 0.0] for name in FORMATS}
                for round_ in range(args.rounds):  # the formats interleaved, so a drifting machine hits each alike
                    for name, fmt in FORMATS.items():
                        tokens, seconds = await _one_round(client, model_id, count, fmt, args.max_tokens,
                                                           1000 * round_, -(-args.requests // count))
                        totals[name][0] += tokens
                        totals[name][1] += seconds
                free = totals["free"][0] / totals["free"][1]
                for name, (tokens, seconds) in totals.items():
                    rate = tokens / seconds
                    rows.append({"streams": count, "format": name, "tokens": tokens, "seconds": round(seconds, 3),
                                 "tokens_per_second": round(rate, 1), "vs_free": round(rate / free, 3)})
                    print(f"streams {count:3d}  {name:12s} {rate:9.1f} tok/s  ({tokens} tokens in {seconds:.1f} s)"
                          f"  x{rate / free:.3f} of free text", flush=True)

        asyncio.run(run_all())
    finally:
        server.stop(timeout=30)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": [sys.executable, *sys.argv], "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "device": plan.accelerator.name, "cores": os.cpu_count(), "load": os.getloadavg(),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": platform.python_version()},
              "max_tokens": args.max_tokens, "rounds": args.rounds, "requests": args.requests, "schema": SCHEMA, "rows": rows}
    stamp(report, libraries=("openai", "xgrammar", "llguidance"))
    (out / "structured_serve.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(rows, out / "structured_serve.png", plan.accelerator.name)
    return 0


def _chat_model(out: Path) -> str:
    """The shipped tiny model with hwrun's shipped chat template (the model itself has none), copied under `out`."""
    import shutil
    from importlib import resources

    import hwrun

    folder = out / "tiny-chat-model"
    if not folder.exists():
        shutil.copytree(hwrun.DEFAULT_MODEL, folder)
        template = resources.files("hwrun") / "data" / "chat_template.jinja"
        (folder / "chat_template.jinja").write_text(template.read_text())
    return str(folder)


def _plot(rows: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = sorted({r["streams"] for r in rows})
    figure, axis = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(FORMATS)
    for i, name in enumerate(FORMATS):
        values = [next(r["tokens_per_second"] for r in rows if r["streams"] == s and r["format"] == name)
                  for s in streams]
        axis.bar([j + i * width for j in range(len(streams))], values, width, label=name)
    axis.set_xticks([j + width for j in range(len(streams))], [f"{s} stream(s)" for s in streams])
    axis.set_ylabel("output tokens/s")
    axis.set_title(f"hwrun serve, structured output vs free text ({device})")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
