"""`hwenv doctor | exec | env`: the command-line face of hwenv.

Every option is checked before anything runs (`validate_selection_args`, `resolve_command`);
errors print one line to stderr and exit 2 (`hwenv.cli_errors`); `--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from typing import TYPE_CHECKING

from .cli_errors import OneLineParser, add_verbose, run_command
from .errors import HwenvError, SelectionError
from .platforms import get_platform, platforms

if TYPE_CHECKING:
    from .selection import Selection

BY_CHOICES = ("module", "index")


def selectable_kinds() -> tuple[str, ...]:
    """The kinds whose devices `--devices` selects, from the platform registry (plug-ins included)."""
    return tuple(p.kind for p in platforms() if p.selectable)


def validate_selection_args(kind: str, args: argparse.Namespace) -> None:
    """Refuse options that do nothing for `kind`: `--by` off Gaudi (or without `--devices`), `--no-pci-order` off XPU.

    Which kinds take them is the platform's `selection_grammar` ("module-ids", "affinity-mask").
    """
    grammar = get_platform(kind).selection_grammar
    if args.by is not None:
        if grammar != "module-ids":
            raise SelectionError(
                f"--by {args.by} applies to Gaudi module IDs/indices only, and the kind is {kind} (its --devices are "
                f"{grammar}); leave --by out."
            )
        if args.devices is None:
            raise SelectionError(f"--by {args.by} says how to read --devices, and no --devices were given; pass "
                                 f"--devices (e.g. --by {args.by} --devices 0,1) or leave --by out.")
    if args.no_pci_order and grammar != "affinity-mask":
        raise SelectionError(
            f"--no-pci-order turns off ZE_ENABLE_PCI_ID_DEVICE_ORDER, which only Intel GPUs (xpu) read, and the kind "
            f"is {kind}; leave --no-pci-order out."
        )


def _selection_from_args(args: argparse.Namespace) -> Selection:
    # imported here, not at the top: `hwenv --help` needs neither (issue 29: start-up)
    from .accelerator import detect
    from .selection import select

    kind = args.kind
    device_count = None
    integrated = None
    if kind is None:
        acc = detect()
        kind = acc.kind
        device_count = acc.count
        if kind not in selectable_kinds():
            raise HwenvError(
                f"no selectable accelerator here (detected {kind}); pass --kind {'|'.join(selectable_kinds())} to "
                f"prepare the environment for another machine."
            )
        if get_platform(kind).selection_grammar == "affinity-mask":  # which devices are integrated GPUs (issue 41.7)
            from .probes import run_probe

            flags = run_probe(kind).details.get("integrated_gpus")
            integrated = tuple(flag == "True" for flag in flags.split(",")) if flags else None
    validate_selection_args(kind, args)
    return select(kind, args.devices, by=args.by or "module", device_count=device_count,
                  pci_order=not args.no_pci_order, integrated=integrated)


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", help="device ids: an XPU affinity mask ('0,2', '0.1'), Gaudi module IDs (one card, or a supported 2/4-card group, or all 8), CUDA/ROCm indices")
    parser.add_argument("--kind", choices=selectable_kinds(), help="accelerator kind (default: detected); works without that hardware")
    parser.add_argument("--by", choices=BY_CHOICES, default=None, help="Gaudi only, with --devices: --devices are module IDs (default) or device indices (mapped to module IDs with hl-smi; HABANA_VISIBLE_DEVICES itself is read only when a container starts)")
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
    if selection.note:  # said on stderr: stdout stays the variables alone
        print(f"hwenv env: note: {selection.note}.", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(variables, indent=2))
    elif args.format == "docker":
        print(" ".join(f"-e {key}={shlex.quote(value)}" for key, value in variables.items()))
    else:
        for key, value in variables.items():
            print(f"{key}={shlex.quote(value)}")
    return 0


def resolve_command(program: str, environment: dict[str, str]) -> str:
    """The executable `program` names, found as `os.execvpe` would (PATH of `environment`); checked, not run.

    A missing program, a directory or a file without execute permission is a `HwenvError` naming it.
    """
    if program == "":
        raise HwenvError("hwenv exec: the command is an empty string; give a program name, e.g. -- python train.py")
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.exists(program):
            raise HwenvError(f"command {program!r} does not exist; check the path.")
        if os.path.isdir(program):
            raise HwenvError(f"command {program!r} is a directory, not a program.")
        if not os.access(program, os.X_OK):
            raise HwenvError(f"command {program!r} is not executable; chmod +x it, or run it with its interpreter "
                             f"(e.g. -- python {program}).")
        return program
    found = shutil.which(program, path=environment.get("PATH", os.defpath))
    if found is None:
        here = os.path.exists(program)
        hint = f" (a file {program!r} is in this folder: run it as ./{program})" if here else ""
        raise HwenvError(f"command {program!r} not found on PATH or not executable{hint}.")
    return found


def _exec(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise HwenvError("hwenv exec needs a command after '--', e.g. hwenv exec --devices 0,2 -- torchrun train.py")
    selection = _selection_from_args(args)
    if not selection.selects_in_process:  # a Gaudi index hl-smi could not map: the child would take any card
        raise SelectionError(f"hwenv exec: {selection.note}.")
    environment = selection.apply()
    resolve_command(command[0], environment)
    try:
        os.execvpe(command[0], command, environment)  # replaces this process; no shell
    except OSError as error:  # checked above; a race or an exotic format (e.g. a wrong-architecture binary)
        raise HwenvError(f"command {command[0]!r} cannot be run: {error.strerror or error}.") from error
    return 0  # pragma: no cover


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for `hwenv` (usage errors are one line, exit 2)."""
    parser = OneLineParser(prog="hwenv", description="Which accelerator is here, and which part a run may use.")
    add_verbose(parser, top_level=True)
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="{doctor,env,exec}")
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
    for child in (doctor, env, run):
        add_verbose(child, top_level=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hwenv` console script."""
    args = build_parser().parse_args(argv)
    return run_command(f"hwenv {args.command_name}", lambda: args.func(args), (HwenvError,), verbose=args.verbose)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

__all__ = ["build_parser", "main", "resolve_command", "selectable_kinds", "validate_selection_args"]
