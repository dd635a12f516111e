"""`hwdist launch | bench`: the command-line face of hwdist.

Every option is checked before anything starts (`hwdist.cli_checks`); errors print one line to
stderr and exit 2 (`hwenv.cli_errors`), a traceback only with `--verbose`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from hwenv.cli_errors import OneLineParser, add_verbose, run_command

from .errors import HwdistError

#: torchrun options passed through unchanged: (our flag, torchrun flag, takes a value).
TORCHRUN_OPTIONS = (
    ("--nnodes", "--nnodes", True), ("--node-rank", "--node-rank", True),
    ("--rdzv-backend", "--rdzv-backend", True), ("--rdzv-endpoint", "--rdzv-endpoint", True),
    ("--rdzv-id", "--rdzv-id", True), ("--rdzv-conf", "--rdzv-conf", True),
    ("--max-restarts", "--max-restarts", True), ("--monitor-interval", "--monitor-interval", True),
    ("--master-addr", "--master-addr", True), ("--master-port", "--master-port", True),
    ("--log-dir", "--log-dir", True), ("--standalone", "--standalone", False),
)


def _kinds() -> tuple[str, ...]:
    """Every registered device kind (plug-ins included), in detection order."""
    import hwenv

    return tuple(p.kind for p in hwenv.platforms())


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _launch_parser(sub: argparse._SubParsersAction) -> None:
    # allow_abbrev=False: the script's own options (`--device` of `-m hwrun.cli train`) must not be read as
    # abbreviations of ours (`--devices`, `--device-count`): argparse matches prefixes before it sees the script
    p = sub.add_parser("launch", help="run SCRIPT with torchrun, one process per selected device",
                       description="Run SCRIPT under torchrun (python -m torch.distributed.run), one process per "
                                   "selected device (G16), the selection's variables set for that command only.",
                       allow_abbrev=False)
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, help="processes on this node (default: selected devices; 1 on CPU)")
    p.add_argument("--devices", help="device ids in the kind's grammar: XPU affinity mask ('0,2'), Gaudi module IDs, "
                   "CUDA/ROCm indices")
    p.add_argument("--kind", choices=_kinds(), help="device kind, from hwenv's platform registry (default: detected)")
    p.add_argument("--by", choices=("module", "index"), default=None, help="Gaudi only, with --devices: module IDs (default) or indices")
    p.add_argument("--device-count", type=int, help="devices of --kind on each node the command is for: --devices and "
                   "--nproc-per-node are checked against it (default: this machine's, only when --kind is detected)")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module (python -m SCRIPT)")
    for ours, _theirs, takes_value in TORCHRUN_OPTIONS:
        alias = ours.replace("-", "_").replace("__", "--", 1)
        names = [ours] if alias == ours else [ours, alias]
        if takes_value:
            p.add_argument(*names, dest=_dest(ours), help="passed to torchrun unchanged")
        else:
            p.add_argument(*names, dest=_dest(ours), action="store_true", help="passed to torchrun unchanged")
    add_verbose(p, top_level=False)
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    from .bench import DTYPES, OPS

    p = sub.add_parser("bench", help="bus bandwidth per message size (nccl-tests formulas), ours vs raw torch",
                       description="Run inside torchrun / hwdist launch (or alone: world size 1).")
    p.add_argument("--op", choices=(*OPS, "all"), default="all_reduce")
    p.add_argument("--sizes", help="8B..1G (powers of two) or a list 1K,1M (default 8B..1G on accelerators, 8B..16M on CPU)")
    p.add_argument("--step-factor", type=int, default=None, help="ratio between sizes in a range (default 2; only with a range)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=20, help="timed calls per repeat (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="repeats; the median is reported (default 3)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a stuck collective fails (default 300)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    add_verbose(p, top_level=False)


def build_parser() -> argparse.ArgumentParser:
    """The `hwdist` argument parser."""
    parser = OneLineParser(prog="hwdist", description="Process groups, launcher and collective benchmark.")
    add_verbose(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{launch,bench}")
    _launch_parser(sub)
    _bench_parser(sub)
    return parser


def _launch(args: argparse.Namespace) -> int:
    from .cli_checks import check_launch
    from .launch import child_environment, plan_launch, run

    check_launch(args)
    passthrough: list[str] = []
    for ours, theirs, takes_value in TORCHRUN_OPTIONS:
        value = getattr(args, _dest(ours))
        if takes_value and value is not None:
            passthrough += [theirs, value]
        elif not takes_value and value:
            passthrough.append(theirs)
    plan = plan_launch(args.script, args.script_args, nproc_per_node=args.nproc_per_node,
                       devices=args.devices, kind=args.kind, device_count=args.device_count,
                       torchrun_args=passthrough, module=args.module, by=args.by)
    if args.dry_run:
        print(json.dumps({"argv": plan.argv, "env": plan.env, "command": shlex.join(plan.argv)}, indent=2))
        return 0
    from .cli_checks import check_master_port

    check_master_port(args)  # last, just before torchrun starts: the port is free now
    return run(plan.argv, child_environment(plan.env, selection=plan.selection))


def _bench(args: argparse.Namespace) -> int:
    from .bench import OPS, available_memory, check_memory, format_table, run_bench, summary
    from .cli_checks import check_bench
    from .context import init, shutdown
    from .sizes import parse_sizes

    check_bench(args)  # bad input is rejected before any group starts
    ops = list(OPS) if args.op == "all" else [args.op]
    factor = args.step_factor or 2
    ctx = init(timeout=args.timeout)
    try:
        text = args.sizes or ("8B..1G" if ctx.on_accelerator else "8B..16M")
        sizes = parse_sizes(text, factor)
        free, where = available_memory(ctx)
        check_memory(ops, sizes, args.dtype, free, where, 1 if ctx.on_accelerator else ctx.local_world_size, text)
        result = run_bench(ops, sizes, args.dtype, iters=args.iters, warmup=args.warmup,
                           repeats=args.repeats, progress=args.progress)
    finally:
        shutdown()
    if ctx.is_main:
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            print(format_table(result))
            print(summary(result))
    return 0 if all(r.correct for r in result.rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hwdist` console script."""
    import hwenv

    args = build_parser().parse_args(argv)
    command = _launch if args.command == "launch" else _bench
    return run_command(f"hwdist {args.command}", lambda: command(args), (HwdistError, hwenv.HwenvError),
                       verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
