"""Benchmark hwdist's collectives against raw torch.distributed: bus bandwidth per message size.

A thin wrapper over `hwdist bench` (hwdist.bench.run_bench): every op (all_reduce, all_gather,
reduce_scatter, broadcast) at every size is checked for the exact result, then raw
torch.distributed calls, hwdist's calls without and with the cross-rank descriptor check are
timed interleaved on the same buffers (median of repeats, slowest rank). Bandwidths follow
nccl-tests: algbw = S / t, busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
reduce_scatter), 1 (broadcast). Rank 0 writes OUT/collectives.{json,md,png}.

    # H200, nccl, world size 1:
    python -m torch.distributed.run --nproc-per-node 1 tools/bench/collectives.py --out DIR
    # CPU, gloo, 2 processes (relaunches itself through hwdist launch when not under torchrun):
    python tools/bench/collectives.py --out DIR --smoke --nproc-per-node 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import hwdist
from hwdist.bench import OPS, bus_factor, format_table, run_bench, summary
from hwdist.sizes import format_size, parse_sizes

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

NAME = "collectives"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations (runs on CPU)")
    parser.add_argument("--ops", default="all", help="comma list of " + ",".join(OPS) + " or all")
    parser.add_argument("--sizes", help="default: 8B..1G on accelerators, 8B..16M on CPU, 8B..64K with --smoke")
    parser.add_argument("--dtype", default=None, help="bf16 (default on accelerators), fp32 (default on CPU), ...")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per repeat (default 20; smoke 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls (default 5; smoke 2)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats, median reported (default 5; smoke 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout in seconds")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="when not under torchrun: relaunch with this many processes via hwdist launch")
    return parser.parse_args(argv)


def relaunch(args: argparse.Namespace, argv: list[str]) -> int:
    """Not under a launcher and more than one process asked for: run ourselves under torchrun."""
    from hwdist.launch import child_environment, launch_command, run

    rest, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--nproc-per-node":
            skip = True
            continue
        if item.startswith("--nproc-per-node="):
            continue
        rest.append(item)
    command, changes = launch_command(__file__, rest, nproc_per_node=args.nproc_per_node)
    print("relaunching:", " ".join(command), file=sys.stderr)
    return run(command, child_environment(changes))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in result["rows"]))
    fig, axes = plt.subplots(2, len(ops), figsize=(4.2 * len(ops), 7), squeeze=False, sharex="col")
    n = result["world_size"]
    for column, op in enumerate(ops):
        rows = [r for r in result["rows"] if r["op"] == op]
        sizes = [r["size"] for r in rows]
        top, bottom = axes[0][column], axes[1][column]
        metric, label = ("busbw", "bus bandwidth") if bus_factor(op, n) > 0 else ("algbw", "algorithm bandwidth")
        top.plot(sizes, [r[metric] for r in rows], "o-", label="hwdist (checked)")
        raw = [r["raw_busbw"] if metric == "busbw" else r["size"] / (r["raw_time_us"] * 1e-6) / 1e9 for r in rows]
        top.plot(sizes, raw, "s--", label="raw torch.distributed")
        top.set_xscale("log", base=2)
        top.set_title(f"{op} ({result['backend']}, n={n})")
        top.set_ylabel(f"{label} (GB/s)")
        top.legend(fontsize=8)
        bottom.plot(sizes, [r["overhead"] for r in rows], "o-", label="with descriptor check")
        bottom.plot(sizes, [r["unchecked_overhead"] for r in rows], "^-", label="without check")
        bottom.axhline(1.0, color="grey", linewidth=0.8)
        bottom.set_xscale("log", base=2)
        bottom.set_xlabel("message size S (bytes)")
        bottom.set_ylabel("time ratio hwdist / raw")
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: hwdist.bench.BenchResult, meta: dict) -> str:
    lines = [
        f"# Collectives: hwdist vs raw torch.distributed ({result.backend}, world size {result.world_size})",
        "",
        f"Device `{result.device}` ({meta['device_name']}), torch {meta['torch']}, dtype {result.dtype}, "
        f"{result.iters} timed calls x {result.repeats} repeats (median, slowest rank), {result.warmup} warm-up calls.",
        "",
        "S = buffer bytes as nccl-tests counts them (all_gather: gathered output; reduce_scatter: input). "
        "algbw = S / time; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), "
        "1 (broadcast); GB/s = 1e9 B/s. overhead = hwdist time / raw time on the same buffers "
        "(with the cross-rank dtype/shape descriptor check, and without it). "
        + ("At world size 1 busbw is 0 for all_reduce/all_gather/reduce_scatter by definition, and the "
           "descriptor check is skipped (nothing to compare)." if result.world_size == 1 else ""),
        "",
        format_table(result, markdown=True),
        "",
        summary(result).lstrip("# "),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if "RANK" not in os.environ and (args.nproc_per_node or 1) > 1:
        return relaunch(args, argv)
    ctx = hwdist.init(timeout=args.timeout)
    try:
        accelerated = ctx.device != "cpu"
        sizes = parse_sizes(args.sizes or ("8B..64K" if args.smoke else "8B..1G" if accelerated else "8B..16M"))
        ops = list(OPS) if args.ops == "all" else [op.strip() for op in args.ops.split(",")]
        dtype = args.dtype or ("bf16" if accelerated else "fp32")
        iters = args.iters or (5 if args.smoke else 20)
        warmup = args.warmup if args.warmup is not None else (2 if args.smoke else 5)
        repeats = args.repeats or (3 if args.smoke else 5)
        result = run_bench(ops, sizes, dtype, iters=iters, warmup=warmup, repeats=repeats)
    finally:
        hwdist.shutdown()
    if not ctx.is_main:
        return 0
    import torch

    device_name = "CPU"
    if ctx.device != "cpu":
        try:
            device_name = torch.cuda.get_device_name(0) if ctx.device.startswith("cuda") else ctx.device
        except Exception as error:  # a name is nice to have, never a reason to fail
            device_name = f"unknown ({error})"
    meta = {"torch": torch.__version__, "hwdist": hwdist.__version__, "python": platform.python_version(),
            "device_name": device_name, "host": platform.node(), "argv": argv, "smoke": args.smoke}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = stamp({"meta": meta, **result.to_dict(), "context": ctx.to_dict()}, argv, libraries=("hwdist",))
    (out / f"{NAME}.json").write_text(json.dumps(data, indent=2))
    (out / f"{NAME}.md").write_text(markdown(result, meta))
    plot(data, out / f"{NAME}.png")
    print(format_table(result, markdown=True))
    print(summary(result))
    print(f"wrote {out / NAME}.json, .md, .png ({len(result.rows)} rows, sizes {format_size(sizes[0])}.."
          f"{format_size(sizes[-1])})")
    return 0 if all(r.correct for r in result.rows) else 1


if __name__ == "__main__":
    sys.exit(main())

