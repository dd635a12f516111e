"""Per-call overhead of hwdist's collectives over raw torch.distributed (issue 29 point 5: <= 2 us).

Small messages, so the figure is the wrapper's Python cost, not the transfer. Each repetition
times a block of `--calls` back-to-back calls of every variant on the same tensors, in a rotating
order (raw torch.distributed; hwdist as shipped, checks off; hwdist with `check=True`; all_gather
also with a flat `out=`, the form the raw call takes; and, with `--compare-src`, an older hwdist
tree adopted on the same process group); the overhead is the
median over repetitions of (variant block - raw block) / calls. Every rank times; the slowest
rank's medians are reported.

    # world size 1 (gloo on CPU, an in-memory store):
    uv run python tools/bench/collectives_overhead.py --out DIR
    # 2 processes (relaunched through hwdist launch):
    uv run python tools/bench/collectives_overhead.py --out DIR --nproc-per-node 2
    # beside an older tree, e.g. `git archive COMMIT packages/hwdist/src | tar -x -C /tmp/old`:
    uv run python tools/bench/collectives_overhead.py --out DIR --compare-src /tmp/old/packages/hwdist/src/hwdist
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for collectives_overhead.json (rank 0)")
    parser.add_argument("--numel", type=int, default=4, help="elements per rank's input (default 4: 16 B of fp32)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed block (default 200)")
    parser.add_argument("--repeats", type=int, default=100, help="blocks per variant, interleaved (default 100)")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of " + ",".join(OPS))
    parser.add_argument("--compare-src", help="an older hwdist package folder (…/src/hwdist), timed beside")
    parser.add_argument("--compare-label", default="older", help="its name in the table")
    parser.add_argument("--nproc-per-node", type=int, default=None, help="not under torchrun: relaunch with N processes")
    args = parser.parse_args(argv)
    for name in ("numel", "calls", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    unknown = set(args.ops.split(",")) - set(OPS)
    if unknown:
        parser.error(f"--ops: unknown {sorted(unknown)}; use {', '.join(OPS)}")
    return args


def _load_older(path: str):
    """The older hwdist package as `hwdist_older` (its relative imports resolve inside it); it adopts the group."""
    folder = Path(path).resolve()
    spec = importlib.util.spec_from_file_location("hwdist_older", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["hwdist_older"] = module
    spec.loader.exec_module(module)
    return module


def variants(op: str, lib, older, x, out, n: int) -> dict:
    """name -> a no-argument call of `op` on the same tensors."""
    import torch.distributed as dist

    flat = out.view(-1) if out is not None else None
    raw = {"all_reduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, 0),
           "all_gather": lambda: dist.all_gather_into_tensor(flat, x),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, x)}[op]

    def ours(module, **kw):
        return {"all_reduce": lambda: module.all_reduce(x, **kw), "broadcast": lambda: module.broadcast(x, 0, **kw),
                "all_gather": lambda: module.all_gather(x, out=out, **kw),
                "reduce_scatter": lambda: module.reduce_scatter(x, out=out, **kw)}[op]

    found = {"raw torch.distributed": raw, "hwdist": ours(lib), "hwdist check=True": ours(lib, check=True)}
    if op == "all_gather":  # the raw call needs the flat buffer gloo takes; hwdist takes either (flat: no view)
        found["hwdist, flat out"] = lambda: lib.all_gather(x, out=flat)
    if older is not None:
        found[f"hwdist {older.__label__}"] = ours(older)
    return found


def buffers(op: str, numel: int, n: int):
    import torch

    if op == "all_gather":
        return torch.ones(numel), torch.empty(n, numel)
    if op == "reduce_scatter":
        return torch.ones(numel * n), torch.empty(numel)
    return torch.ones(numel), None


def time_op(op: str, lib, older, args, n: int) -> dict[str, list[float]]:
    """Per-call microseconds of every variant, `repeats` interleaved blocks each (rotating order)."""
    x, out = buffers(op, args.numel, n)
    calls = variants(op, lib, older, x, out, n)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in calls.values():  # warm-up: first-call set-up, caches
        for _ in range(20):
            fn()
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            fn = calls[name]
            start = time.perf_counter_ns()
            for _ in range(args.calls):
                fn()
            samples[name].append((time.perf_counter_ns() - start) / args.calls / 1e3)
    return samples


def summarise(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    raw = samples["raw torch.distributed"]
    rows = {}
    for name, values in samples.items():
        rows[name] = {"median_us": round(statistics.median(values), 3),
                      "over_raw_us": round(statistics.median(v - r for v, r in zip(values, raw, strict=True)), 3)}
    return rows


def markdown(result: dict) -> str:
    lines = [f"World size {result['world_size']} ({result['backend']} on {result['device']}), {result['numel']} "
             f"fp32 elements per rank, {result['calls']} calls x {result['repeats']} interleaved blocks, medians "
             f"(slowest rank), {result['date']}, torch {result['torch']}, Python {result['python']}, {result['cpus']} "
             f"CPUs, load average {result['load_before'][0]} before / {result['load_after'][0]} after:", "",
             "| op | variant | per call (us) | over raw (us) |", "|---|---|---:|---:|"]
    for op, rows in result["ops"].items():
        for name, row in rows.items():
            over = "—" if name.startswith("raw") else f"{row['over_raw_us']:+.2f}"
            lines.append(f"| {op} | {name} | {row['median_us']:.2f} | {over} |")
    return "\n".join(lines)


def relaunch(args: argparse.Namespace, argv: list[str]) -> int:
    from hwdist.launch import child_environment, launch_command, run

    rest, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc-per-node":
            skip = True
        elif not item.startswith("--nproc-per-node="):
            rest.append(item)
    command, changes = launch_command(__file__, rest, nproc_per_node=args.nproc_per_node)
    print("relaunching:", " ".join(command), file=sys.stderr)
    return run(command, child_environment(changes))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.nproc_per_node and args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return relaunch(args, argv)
    import hwdist
    import hwenv
    import torch

    ctx = hwdist.init(backend="gloo", accel=hwenv.Accelerator("cpu"), timeout=120)
    older = None
    if args.compare_src:
        older = _load_older(args.compare_src)
        older.__label__ = args.compare_label
        older.init(backend="gloo", accel=hwenv.Accelerator("cpu"))  # adopts the running group
    result = {"world_size": ctx.world_size, "backend": ctx.backend, "device": ctx.device, "numel": args.numel,
              "calls": args.calls, "repeats": args.repeats, "date": date.today().isoformat(),
              "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in os.getloadavg()], "ops": {}}
    for op in args.ops.split(","):
        samples = time_op(op, hwdist, older, args, ctx.world_size)
        per_rank = hwdist.all_gather_object(summarise(samples))
        # the slowest rank's figures (by hwdist's median)
        result["ops"][op] = max(per_rank, key=lambda rows: rows["hwdist"]["median_us"])
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if ctx.is_main:
        print(markdown(result))
        if args.out:
            folder = Path(args.out)
            folder.mkdir(parents=True, exist_ok=True)
            name = f"collectives_overhead-ws{ctx.world_size}.json"
            (folder / name).write_text(json.dumps(result, indent=2) + "\n")
    hwdist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
