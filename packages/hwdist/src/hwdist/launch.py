"""`hwdist launch`: torchrun underneath, one process per selected device (G16), no shell.

The selection's variables (hwenv: `ZE_AFFINITY_MASK`, `HABANA_VISIBLE_MODULES`, ...) go to
the torchrun child only (X4); torchrun's multi-node options pass through unchanged.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

import hwenv

from .errors import LaunchError

logger = logging.getLogger(__name__)

TORCHRUN = ("-m", "torch.distributed.run")
SELECTABLE = ("xpu", "hpu", "cuda")
_OWN_OPTIONS = ("--nproc-per-node", "--nproc_per_node")


def _selection(kind: str, devices: str | None, by: str, device_count: int | None) -> hwenv.Selection:
    try:
        if devices is None:
            if kind not in SELECTABLE:
                return hwenv.Selection(kind)
            inherited = hwenv.current_selection(kind)  # a selection already in this environment
            return hwenv.Selection(kind, inherited.devices)  # with XPU's stable PCI order (X5)
        if kind not in SELECTABLE:
            raise LaunchError(
                f"--devices {devices!r} selects nothing on {kind}: only xpu, hpu and cuda devices are selected; "
                f"leave --devices out, or pass --kind xpu|hpu|cuda."
            )
        return hwenv.select(kind, devices, by=by, device_count=device_count)
    except hwenv.HwenvError as error:
        raise LaunchError(f"cannot select devices {devices!r} on {kind}: {error}") from error


def _nproc(kind: str, requested: int | None, selection: hwenv.Selection, seen: int | None) -> int:
    if requested is not None:
        if not isinstance(requested, int) or requested < 1:
            raise LaunchError(f"--nproc-per-node {requested!r} must be a positive integer.")
        available = selection.count if selection.count is not None else (seen if kind in SELECTABLE else None)
        if available is not None and requested > available:
            raise LaunchError(
                f"--nproc-per-node {requested} exceeds the {available} {kind} device(s) selected; run one process "
                f"per device (G16): pass --nproc-per-node {available} or select more --devices."
            )
        if kind == "hpu" and selection.count is not None and 1 < requested < selection.count:
            raise LaunchError(
                f"--nproc-per-node {requested} uses part of the {selection.count} selected Gaudi modules; Intel "
                f"supports partial-server groups only as selected (G8): select exactly the modules to use."
            )
        return requested
    if selection.count is not None:
        return selection.count
    if kind not in SELECTABLE:
        logger.info("launch on %s: one process unless --nproc-per-node says otherwise", kind)
        return 1
    if seen is None:
        raise LaunchError(
            f"cannot count {kind} devices on this machine (it has none); pass --nproc-per-node N or --devices."
        )
    return seen


def launch_command(
    script: str,
    script_args: Sequence[str] = (),
    *,
    nproc_per_node: int | None = None,
    devices: str | None = None,
    kind: str | None = None,
    torchrun_args: Sequence[str] = (),
    module: bool = False,
    by: str = "module",
) -> tuple[list[str], dict[str, str]]:
    """The torchrun argv and the selection's environment changes for the child process.

    `nproc_per_node` defaults to the selected device count (G16), else the devices of `kind`
    this process sees, else 1 on CPU/MPS. `torchrun_args` (`--nnodes 2`, `--rdzv-endpoint ...`)
    go to torchrun unchanged; `module=True` runs `script` as `python -m script`.
    """
    if not script:
        raise LaunchError("hwdist launch needs a script (or -m MODULE) to run, e.g. hwdist launch train.py")
    torchrun_args = [str(a) for a in torchrun_args]
    clash = [a for a in torchrun_args if a.split("=")[0] in _OWN_OPTIONS]
    if clash:
        raise LaunchError(f"torchrun_args {clash} repeat --nproc-per-node; pass it as nproc_per_node instead.")
    seen: int | None = None
    if kind is None:
        accel = hwenv.detect()
        kind, seen = accel.kind, accel.count
    elif kind not in hwenv.KINDS:
        raise LaunchError(f"--kind {kind!r} is not an accelerator kind; use one of {', '.join(hwenv.DETECTION_ORDER)}.")
    elif kind in SELECTABLE:
        probe = hwenv.run_probe(kind)  # is that kind here, and how many does this process see?
        seen = probe.count if probe.available else None
    selection = _selection(kind, devices, by, seen)
    count = _nproc(kind, nproc_per_node, selection, seen)
    argv = [sys.executable, *TORCHRUN, f"--nproc-per-node={count}", *torchrun_args]
    if module:
        argv.append("-m")
    argv += [script, *[str(a) for a in script_args]]
    return argv, selection.env()


def child_environment(env_changes: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full child environment: `environ` (default os.environ) plus `env_changes`; a Gaudi
    module selection drops an inherited HABANA_VISIBLE_DEVICES, as hwenv's Selection.apply does."""
    merged = dict(os.environ if environ is None else environ)
    if "HABANA_VISIBLE_MODULES" in env_changes:
        merged.pop("HABANA_VISIBLE_DEVICES", None)
    merged.update(env_changes)
    return merged


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the torchrun command (no shell) and return its exit status."""
    process = subprocess.Popen(list(argv), env=dict(env))
    try:
        return process.wait()
    except KeyboardInterrupt:  # torchrun got the same SIGINT from the terminal; let it stop its workers
        return process.wait()
