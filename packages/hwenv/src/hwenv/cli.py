"""`hwenv doctor | exec | env`: the command-line face of hwenv.

Errors print one line to stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .accelerator import detect
from .errors import HwenvError
from .selection import Selection, select

SELECTABLE = ("xpu", "hpu", "cuda")


def _selection_from_args(args: argparse.Namespace) -> Selection:
    kind = args.kind
    device_count = None
    if kind is None:
        acc = detect()
        kind = acc.kind
        device_count = acc.count
        if kind not in SELECTABLE:
            raise HwenvError(
                f"no selectable accelerator here (detected {kind}); pass --kind xpu|hpu|cuda to prepare the "
                f"environment for another machine."
            )
    return select(kind, args.devices, by=args.by, device_count=device_count, pci_order=not args.no_pci_order)


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", help="device ids: an XPU affinity mask ('0,2', '0.1'), Gaudi module IDs (one card, or a supported 2/4-card group, or all 8), CUDA indices")
    parser.add_argument("--kind", choices=SELECTABLE, help="accelerator kind (default: detected); works without that hardware")
    parser.add_argument("--by", choices=("module", "index"), default="module", help="Gaudi only: --devices are module IDs (default) or device indices (several are mapped to module IDs with hl-smi; one card stays HABANA_VISIBLE_DEVICES)")
    parser.add_argument("--no-pci-order", action="store_true", help="XPU only: do not set ZE_ENABLE_PCI_ID_DEVICE_ORDER=1")


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose

    report = diagnose()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.render())
    return 1 if args.strict and not report.to_dict()["ok"] else 0


def _env(args: argparse.Namespace) -> int:
    selection = _selection_from_args(args)
    variables = selection.env()
    if args.format == "json":
        print(json.dumps(variables, indent=2))
    elif args.format == "docker":
        print(" ".join(f"-e {key}={shlex.quote(value)}" for key, value in variables.items()))
    else:
        for key, value in variables.items():
            print(f"{key}={shlex.quote(value)}")
    return 0


def _exec(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise HwenvError("hwenv exec needs a command after '--', e.g. hwenv exec --devices 0,2 -- torchrun train.py")
    selection = _selection_from_args(args)
    environment = selection.apply()
    try:
        os.execvpe(command[0], command, environment)  # replaces this process; no shell
    except FileNotFoundError as error:
        raise HwenvError(f"command {command[0]!r} not found on PATH") from error
    return 0  # pragma: no cover


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for `hwenv`."""
    parser = argparse.ArgumentParser(prog="hwenv", description="Which accelerator is here, and which part a run may use.")
    sub = parser.add_subparsers(dest="command_name", required=True)
    doctor = sub.add_parser("doctor", help="report the accelerator, versions and problems with their fixes")
    doctor.add_argument("--json", action="store_true", help="machine-readable report")
    doctor.add_argument("--strict", action="store_true", help="exit 1 when the report has an error")
    doctor.set_defaults(func=_doctor)
    env = sub.add_parser("env", help="print the environment for a device selection")
    _add_selection_arguments(env)
    env.add_argument("--format", choices=("shell", "docker", "json"), default="shell")
    env.set_defaults(func=_env)
    run = sub.add_parser("exec", help="run one command with a device selection (no shell)")
    _add_selection_arguments(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(func=_exec)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hwenv` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HwenvError as error:
        print(f"hwenv {args.command_name}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `hwenv doctor --json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

__all__ = ["main", "build_parser"]
