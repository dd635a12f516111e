"""Per-call overhead of hwdist's collectives over raw torch.distributed (issue 29 point 5: <= 2 us).

Small messages, so the figure is the wrapper's Python cost, not the transfer. Each repetition
times a block of `--calls` back-to-back calls of every variant on the same tensors, in a rotating
order (raw torch.distributed; hwdist as shipped, checks off; hwdist with `check=True`; for
all_gather also the other raw ways to a stacked result and hwdist with a flat `out`; with
`--compare-src`, an older hwdist tree adopted on the same process group); the overhead is the
median over repetitions of (variant block - raw block) / calls, on two clocks: wall time
(perf_counter) and the calling thread's CPU time (thread_time: what the wrapper itself spends,
robust to the other processes of a shared machine; waiting for the peer or gloo's worker thread
is not in it). Every rank times; the slowest rank's medians are reported.

`--pieces` times the candidate costs of a wrapper the same way (raw all_reduce + one piece vs raw
all_reduce): attribute reads, argument checks, group / backend / platform look-ups, a disabled
logging call, a view, an allocation.

    # world size 1 (gloo on CPU; under torchrun, or alone with an in-memory store):
    uv run python -m torch.distributed.run --nproc-per-node 1 tools/bench/collectives_overhead.py --out DIR --pieces
    # 2 processes on loopback (relaunched through hwdist launch = torch.distributed.run):
    uv run python tools/bench/collectives_overhead.py --out DIR --nproc-per-node 2
    # beside an older tree, e.g. `git archive COMMIT packages/hwdist/src | tar -x -C /tmp/old`:
    uv run python tools/bench/collectives_overhead.py --out DIR --compare-src /tmp/old/packages/hwdist/src/hwdist
    # the plot of DIR's collectives_overhead-ws*.json:
    uv run python tools/bench/collectives_overhead.py --plot DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_gather_object", "barrier")
RAW = "raw torch.distributed"
#: out=None: hwdist allocates the output, so its baseline is the raw call on a new flat output (`torch.empty`, no view)
NEW_RAW, NEW_OURS = "raw, new output each call", "hwdist, out=None"
#: the raw call with the stacked out hwdist fills: gloo needs it viewed flat, one view per call
STACKED_RAW = "raw, stacked out (a view per call)"
BASELINES = {NEW_OURS: NEW_RAW}
GOAL_US = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for collectives_overhead-ws<N>.json (rank 0)")
    parser.add_argument("--numel", type=int, default=4, help="elements per rank's input (default 4: 16 B of fp32)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed block (default 200)")
    parser.add_argument("--repeats", type=int, default=100, help="blocks per variant, interleaved (default 100)")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of " + ",".join(OPS))
    parser.add_argument("--pieces", action="store_true", help="also time the pieces a wrapper may cost (world size 1)")
    parser.add_argument("--compare-src", help="an older hwdist package folder (…/src/hwdist), timed beside")
    parser.add_argument("--compare-label", default="older", help="its name in the table")
    parser.add_argument("--nproc-per-node", type=int, default=None, help="not under torchrun: relaunch with N processes")
    parser.add_argument("--plot", metavar="DIR", help="only plot DIR/collectives_overhead-ws*.json to DIR/*.png")
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


def _raw(op: str, x, out, n: int) -> dict:
    """The raw torch.distributed calls doing what hwdist's `op` does, baseline first."""
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        return {RAW: lambda: dist.all_reduce(x)}
    if op == "broadcast":
        return {RAW: lambda: dist.broadcast(x, 0)}
    if op == "reduce_scatter":
        found = {RAW: lambda: dist.reduce_scatter_tensor(out, x)}
        if hasattr(dist, "reduce_scatter_single"):
            found["raw reduce_scatter_single"] = lambda: dist.reduce_scatter_single(out, x)
        found[NEW_RAW] = lambda: dist.reduce_scatter_tensor(torch.empty(x.shape[0] // n, *x.shape[1:]), x)
        return found
    # all_gather into a stacked (n, numel) out. The baseline: the same bytes through the raw call into the
    # flat buffer, made once (gloo refuses the stacked form; the strictest raw figure). Then what raw code
    # writes for the stacked result itself: a view per call, or the list form and torch.stack.
    flat = out.view(-1)
    parts = [torch.empty_like(x) for _ in range(n)]
    found = {RAW: lambda: dist.all_gather_into_tensor(flat, x)}
    if hasattr(dist, "all_gather_single"):
        found["raw all_gather_single"] = lambda: dist.all_gather_single(flat, x)
    found[STACKED_RAW] = lambda: dist.all_gather_into_tensor(out.view(-1), x)
    found["raw all_gather + torch.stack"] = lambda: (dist.all_gather(parts, x), torch.stack(parts, out=out))
    found[NEW_RAW] = lambda: dist.all_gather_into_tensor(torch.empty(n * x.numel()), x)  # flat: no view

    def new_stacked():
        stacked = torch.empty(n, *x.shape)
        dist.all_gather_into_tensor(stacked.view(-1), x)
        return stacked

    found["raw, new stacked output each call (a view)"] = new_stacked
    return found


def _untensored(op: str, lib, older, n: int) -> dict:
    """all_gather_object and barrier: no tensor, no check= (barrier is hwdist's descriptor exchange)."""
    import torch.distributed as dist

    payload, gathered = {"rank": dist.get_rank(), "step": 1}, [None] * n
    if op == "barrier":
        found = {RAW: dist.barrier, "hwdist": lib.barrier}
    else:
        found = {RAW: lambda: dist.all_gather_object(gathered, payload), "hwdist": lambda: lib.all_gather_object(payload)}
    if older is not None:
        found[f"hwdist {older.__label__}"] = getattr(older, op) if op == "barrier" else (
            lambda: older.all_gather_object(payload))
    return found


def variants(op: str, lib, older, x, out, n: int) -> dict:
    """name -> a no-argument call of `op` on the same tensors; the baseline first."""
    if op in ("all_gather_object", "barrier"):
        return _untensored(op, lib, older, n)

    def ours(module):  # spelt out: a `**kwargs` call costs ~0.5 us more here, even an empty one
        return {"all_reduce": lambda: module.all_reduce(x), "broadcast": lambda: module.broadcast(x, 0),
                "all_gather": lambda: module.all_gather(x, out=out),
                "reduce_scatter": lambda: module.reduce_scatter(x, out=out)}[op]

    def checked(module):
        return {"all_reduce": lambda: module.all_reduce(x, check=True),
                "broadcast": lambda: module.broadcast(x, 0, check=True),
                "all_gather": lambda: module.all_gather(x, out=out, check=True),
                "reduce_scatter": lambda: module.reduce_scatter(x, out=out, check=True)}[op]

    found = {**_raw(op, x, out, n), "hwdist": ours(lib), "hwdist check=True": checked(lib)}
    if op == "all_gather":  # hwdist also takes the flat buffer the raw call takes
        flat = out.view(-1)
        found["hwdist, flat out"] = lambda: lib.all_gather(x, out=flat)
    if out is not None:
        found[NEW_OURS] = {"all_gather": lambda: lib.all_gather(x), "reduce_scatter": lambda: lib.reduce_scatter(x)}[op]
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


def time_calls(calls: dict, args) -> dict[str, dict[str, list[float]]]:
    """Per-call microseconds of every variant on both clocks, `repeats` interleaved blocks each (rotating order)."""
    names = list(calls)
    samples = {name: {"wall": [], "cpu": []} for name in names}
    for fn in calls.values():  # warm-up: first-call set-up, caches
        for _ in range(20):
            fn()
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            fn = calls[name]
            start, start_cpu = wall(), cpu()
            for _ in range(args.calls):
                fn()
            end_cpu, end = cpu(), wall()
            samples[name]["wall"].append((end - start) / args.calls / 1e3)
            samples[name]["cpu"].append((end_cpu - start_cpu) / args.calls / 1e3)
    return samples


def summarise(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Medians per variant and of its paired differences with its baseline: the first variant, or the
    one `BASELINES` names (hwdist's out=None against the raw call on a new output)."""
    first = next(iter(samples))
    rows = {}
    for name, clocks in samples.items():
        base = samples[BASELINES.get(name, first)]
        row = {"baseline": BASELINES.get(name, first)}
        for clock, key in (("wall", "us"), ("cpu", "cpu_us")):
            row[f"median_{key}"] = round(statistics.median(clocks[clock]), 3)
            row[f"over_raw_{key}"] = round(statistics.median(
                v - r for v, r in zip(clocks[clock], base[clock], strict=True)), 3)
        rows[name] = row
    return rows


def pieces(args) -> dict[str, dict[str, float]]:
    """What each candidate piece of a wrapper costs beside a raw all_reduce (the raw call's own state: caches
    as cold or warm as on the hot path), interleaved like the ops."""
    import logging

    import hwdist
    import hwenv
    import torch
    import torch.distributed as dist
    from hwdist import collectives

    ctx = hwdist.current()
    x, out = torch.ones(args.numel), torch.empty(ctx.world_size, args.numel)
    quiet = logging.getLogger("hwdist.bench.quiet")
    quiet.setLevel(logging.WARNING)
    found = {
        "isinstance(tensor, torch.Tensor)": lambda: isinstance(x, torch.Tensor),
        "tensor.is_cpu": lambda: x.is_cpu,
        "tensor.device.type": lambda: x.device.type,
        "tensor.is_contiguous()": lambda: x.is_contiguous(),
        "tensor.is_floating_point()": lambda: x.is_floating_point(),
        "tensor.shape": lambda: x.shape,
        "tensor.dtype": lambda: x.dtype,
        "tensor.numel()": lambda: x.numel(),
        "tensor.data_ptr()": lambda: x.data_ptr(),
        "tensor._version": lambda: x._version,
        "out.view(-1)": lambda: out.view(-1),
        "tensor.new_empty((n, *shape))": lambda: x.new_empty((ctx.world_size, *x.shape)),
        "hwdist.current()": hwdist.current,
        "ctx.device_type (property)": lambda: ctx.device_type,
        "dist.get_world_size()": dist.get_world_size,
        "dist.get_backend()": dist.get_backend,
        "hwenv.get_platform(ctx.kind)": lambda: hwenv.get_platform(ctx.kind),
        "logger.debug (level off)": lambda: quiet.debug("%s", x),
        "hwdist's checks (all_reduce)": lambda: collectives._all_reduce_problem(ctx, x, "sum"),
        "hwdist's checks (all_gather, out=)": lambda: collectives._all_gather_problem(ctx, x, out),
    }

    def beside(piece):
        def call():
            piece()
            dist.all_reduce(x)
        return call

    calls = {RAW + " all_reduce": lambda: dist.all_reduce(x), **{name: beside(fn) for name, fn in found.items()}}
    return summarise(time_calls(calls, args))


def markdown(result: dict) -> str:
    lines = [f"World size {result['world_size']} ({result['backend']} on {result['device']}), {result['numel']} "
             f"fp32 elements per rank, {result['calls']} calls x {result['repeats']} interleaved blocks, medians "
             f"(slowest rank), {result['date']}, torch {result['torch']}, Python {result['python']}, {result['cpus']} "
             f"CPUs, load average {result['load_before'][0]} before / {result['load_after'][0]} after:", "",
             "| op | variant | per call (us) | over raw, wall (us) | over raw, thread CPU (us) |",
             "|---|---|---:|---:|---:|"]
    for op, rows in result["ops"].items():
        for name, row in rows.items():
            wall = "—" if name == RAW else f"{row['over_raw_us']:+.2f}"
            cpu = "—" if name == RAW else f"{row['over_raw_cpu_us']:+.2f}"
            label = name if row["baseline"] == RAW else f"{name} (over: {row['baseline']})"
            lines.append(f"| {op} | {label} | {row['median_us']:.2f} | {wall} | {cpu} |")
    if result.get("pieces"):
        lines += ["", "Pieces, each beside a raw all_reduce (same method):", "",
                  "| piece | over raw, wall (us) | over raw, thread CPU (us) |", "|---|---:|---:|"]
        for name, row in result["pieces"].items():
            if row["baseline"] != name:
                lines.append(f"| {name} | {row['over_raw_us']:+.2f} | {row['over_raw_cpu_us']:+.2f} |")
    return "\n".join(lines)


def plot(folder: Path) -> Path:
    """One panel per world size and clock: each op's overhead over raw for hwdist before / after, all_gather's
    flat out, and the raw call with the stacked out (a view per call) for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [p for p in folder.glob("collectives_overhead-ws*.json")
             if re.fullmatch(r"collectives_overhead-ws\d+\.json", p.name)]
    paths.sort(key=lambda p: int(p.stem.rpartition("ws")[2]))
    results = [json.loads(p.read_text()) for p in paths]
    if not results:
        raise SystemExit(f"--plot: no collectives_overhead-ws<N>.json in {folder}")
    fig, axes = plt.subplots(len(results), 2, figsize=(12, 4.2 * len(results)), squeeze=False)
    for row, result in zip(axes, results, strict=True):
        ops = list(result["ops"])
        present = dict.fromkeys(k for rows in result["ops"].values() for k in rows)
        names = [n for n in present if n.startswith("hwdist ") and "check=True" not in n]  # older trees
        names += [n for n in ("hwdist", "hwdist, flat out", STACKED_RAW) if n in present]
        for ax, (key, clock) in zip(row, (("over_raw_us", "wall"), ("over_raw_cpu_us", "thread CPU")), strict=True):
            width = 0.8 / len(names)
            for i, name in enumerate(names):
                values = [result["ops"][op].get(name, {}).get(key, float("nan")) for op in ops]
                bars = ax.bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(ops))], values, width,
                              label=name, color="lightgray" if name.startswith("raw") else None)
                ax.bar_label(bars, labels=["" if v != v else f"{v:+.1f}" for v in values], fontsize=7)
            ax.axhline(GOAL_US, color="red", linestyle="--", linewidth=1, label="goal: +2 us")
            ax.axhline(0, color="black", linewidth=0.5)
            ax.set_xticks(range(len(ops)), ops)
            ax.set_ylabel(f"over raw torch.distributed, {clock} (us/call)")
            ax.set_title(f"world size {result['world_size']}, {result['backend']}, {clock}, "
                         f"{result['numel']} fp32, {result['date']}", fontsize=9)
            low, high = ax.get_ylim()
            ax.set_ylim(low, high + 0.45 * (high - low))  # room for the legend above the bars
            ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    path = folder / "collectives_overhead.png"
    fig.savefig(path, dpi=110)
    return path


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
    if args.plot:
        print(plot(Path(args.plot)))
        return 0
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
              "calls": args.calls, "repeats": args.repeats,
              "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "launched": ctx.launched,
              "load_before": [round(x, 2) for x in os.getloadavg()], "ops": {}}
    stamp(result, argv, libraries=("hwdist",))  # versions, device_info, env, git beside its own keys
    for op in args.ops.split(","):
        x, out = buffers(op, args.numel, ctx.world_size)
        samples = time_calls(variants(op, hwdist, older, x, out, ctx.world_size), args)
        per_rank = hwdist.all_gather_object(summarise(samples))
        # the slowest rank's figures (by hwdist's median)
        result["ops"][op] = max(per_rank, key=lambda rows: rows["hwdist"]["median_us"])
    if args.pieces and ctx.world_size == 1:
        result["pieces"] = pieces(args)
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
