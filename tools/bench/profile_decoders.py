"""Per-step time and kernel tables of hwrun's static graph decoder vs its engine (slots) at one batch size.

Developer script (CUDA): both decoders run the fused step over the same random ~1B Llama; the
difference between their tables is what the slot bookkeeping (per-row K/V writes, counters) and the paged KV read
cost: the engine runs once gathering each row's blocks (`paged_attention="gather"`) and once with the Triton
paged-attention kernel (`"triton"`).
Usage: python tools/bench/profile_decoders.py --out DIR [--batch 64] [--compile inductor|none]
DIR/profile_decoders.json carries bench_record.stamp's record (command, UTC date, device, versions, git) beside the
step times, as every bench's JSON does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_record import stamp  # noqa: E402
from decode import FULL, build_model  # noqa: E402


def step_ms(step, repeats=50):
    import torch

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def run_record(args: argparse.Namespace, argv: list[str] | None, device_name: str) -> dict:
    """The JSON's header: what ran (the model, batch, cache length, compile) and where, stamped by
    bench_record.stamp (command, UTC date, device_info, versions, host, env, git) like the other benches."""
    return stamp({"device": device_name, "model": "random Llama from decode.FULL", "batch": args.batch,
                  "cache_len": args.cache_len, "compile": args.compile}, argv, libraries=("hwenv", "triton"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cache-len", type=int, default=384)
    parser.add_argument("--compile", default="inductor", choices=("inductor", "none"))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)

    import torch

    if not torch.cuda.is_available():
        print("profile_decoders.py times CUDA graphs and CUDA kernels: no CUDA device here. Run it on the GPU "
              "(tools/bench/run_h200.sh OUT profile_decoders).", file=sys.stderr)
        return 2
    from hwrun.inference.decode.static import GraphDecoder
    from hwrun.inference.engine import EngineCore
    from hwrun.inference.engine.graphs import capture_graph

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    model = build_model(FULL, device, torch.bfloat16)
    backend = None if args.compile == "none" else "inductor"
    prompts = torch.randint(1, FULL["vocab_size"], (args.batch, 128), device=device)
    results = run_record(args, argv, torch.cuda.get_device_name(0))

    def graphs_per_row():  # the static decoder's step with the engine's per-row K/V writes
        decoder = GraphDecoder(model, batch_size=args.batch, max_cache_len=args.cache_len, compile_backend=backend,
                               use_graphs=False)
        decoder.fused.per_row_positions = True
        return decoder

    with torch.inference_mode():
        for name, build in (
                ("graphs", lambda: GraphDecoder(model, batch_size=args.batch, max_cache_len=args.cache_len,
                                                compile_backend=backend, use_graphs=False)),
                ("graphs_per_row_writes", graphs_per_row),
                ("slots_gather", lambda: EngineCore(model, slots=args.batch, max_cache_len=args.cache_len,
                                                    compile_backend=backend, use_graphs=False,
                                                    paged_attention="gather")),
                ("slots_triton", lambda: EngineCore(model, slots=args.batch, max_cache_len=args.cache_len,
                                                    compile_backend=backend, use_graphs=False,
                                                    paged_attention="triton"))):
            decoder = build()
            if name.startswith("graphs"):
                decoder._prefill(prompts)
                buffers = [decoder.token, decoder.position, decoder.count]
                step = decoder._step_fn
            else:  # every slot's prompt prefilled through the scheduler (KV blocks held), then the greedy step
                for slot, row in enumerate(prompts.tolist()):
                    decoder.add(slot, row, max_new_tokens=args.cache_len - 129, eos_token_id=None)
                while any(not r.decoding for r in decoder.scheduler.requests.values()):
                    decoder.step()
                runner = decoder.runner
                buffers = runner.step_buffers()
                step = runner.step_function(0, args.batch, args.cache_len)  # kind 0: greedy, plain
            results[f"{name}_step_ms"] = step_ms(step)
            graph, _ = capture_graph(step, device, buffers)
            results[f"{name}_replay_ms"] = step_ms(graph.replay)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
            (out / f"profile-{name}.txt").write_text(prof.key_averages().table(
                sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=100))
            from torch._dynamo.utils import counters

            results[f"{name}_graph_breaks"] = {str(k)[:300]: v for k, v in counters["graph_break"].items()}
            results[f"{name}_unique_graphs"] = counters["stats"].get("unique_graphs", 0)
            print(name, f"step {results[f'{name}_step_ms']:.3f} ms, replay {results[f'{name}_replay_ms']:.3f} ms, "
                  f"graphs so far {results[f'{name}_unique_graphs']}, breaks {results[f'{name}_graph_breaks']}",
                  flush=True)
            del decoder, graph
    (out / "profile_decoders.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
