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


def _selection(kind: str, devices: str | None, by: str, device_count: int | None,
               given: bool) -> hwenv.Selection:
    """Validate `devices` for `kind`: syntax (and Gaudi's groups, G8) always; indices against
    `device_count` only when that count is known for the target (`given`: from --device-count,
    else the count this process sees)."""
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
        source = f"--device-count {device_count}" if given else f"the {device_count} {kind} device(s) this process sees"
        where = f" (checked against {source})" if device_count is not None else ""
        hint = ("" if device_count is None or given else
                " If the command is for another machine, pass --device-count N (its devices per node) or --kind.")
        raise LaunchError(f"cannot select devices {devices!r} on {kind}{where}: {error}{hint}") from error


def _nproc(kind: str, requested: int | None, selection: hwenv.Selection, target: int | None,
           given: bool, local: int | None) -> int:
    """Processes per node: `requested`, else the selection's size, else the target's device count (G16).

    `target` is the device count known for the node the command is for (None: unknown, so an
    explicit request is not bounded by it); `local` is this machine's count, a default only.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise LaunchError(f"--nproc-per-node {requested!r} must be a positive integer.")
        available = selection.count if selection.count is not None else target
        if available is not None and requested > available:
            what = ("selected" if selection.count is not None else "per node (--device-count)"
                    if given else "this process sees")
            raise LaunchError(
                f"--nproc-per-node {requested} exceeds the {available} {kind} device(s) {what}; run one process "
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
    if target is not None:
        return target
    if local is not None:
        logger.info("launch on %s: --nproc-per-node defaults to the %d %s device(s) this machine sees; pass "
                    "--nproc-per-node or --device-count when the command is for another machine", kind, local, kind)
        return local
    raise LaunchError(
        f"cannot count {kind} devices on this machine (it has none); pass --nproc-per-node N, --devices, or "
        f"--device-count N (the {kind} devices of each node the command is for)."
    )


def _check_device_count(device_count: object, kind: str) -> int | None:
    if device_count is None:
        return None
    if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
        raise LaunchError(
            f"--device-count {device_count!r} must be a positive integer: the {kind} devices of each node the "
            "command is for."
        )
    if kind not in SELECTABLE:
        raise LaunchError(
            f"--device-count {device_count} counts xpu, hpu or cuda devices, and the launch is on {kind}; leave it "
            f"out and pass --nproc-per-node N for {kind} processes, or pass --kind xpu|hpu|cuda."
        )
    return device_count


def _narrowed_here(kind: str) -> str | None:
    """The variable and value that already narrow `kind`'s devices in this environment, if any."""
    variable = hwenv.Selection(kind).variable
    value = os.environ.get(variable) if variable else None
    return f"{variable}={value!r}" if value is not None else None


def launch_command(
    script: str,
    script_args: Sequence[str] = (),
    *,
    nproc_per_node: int | None = None,
    devices: str | None = None,
    kind: str | None = None,
    device_count: int | None = None,
    torchrun_args: Sequence[str] = (),
    module: bool = False,
    by: str = "module",
) -> tuple[list[str], dict[str, str]]:
    """The torchrun argv and the selection's environment changes for the child process.

    `devices` is always checked for syntax (and Gaudi's groups, G8). Device indices and
    `nproc_per_node` are checked against a device count only where it is known for the node
    the command is for: `device_count` when given (the devices of `kind` on each node); else,
    with `kind` detected, the devices this process sees, unless this environment already
    narrows them (an inherited `ZE_AFFINITY_MASK`, ...), which `devices` replaces in the child.
    An explicit `kind` may be for another machine, so its local count is a default only.

    `nproc_per_node` defaults to the selected device count (G16), else `device_count`, else the
    devices of `kind` this process sees, else 1 on CPU/MPS. `torchrun_args` (`--nnodes 2`,
    `--rdzv-endpoint ...`) go to torchrun unchanged; `module=True` runs `script` as `python -m script`.
    """
    if not script:
        raise LaunchError("hwdist launch needs a script (or -m MODULE) to run, e.g. hwdist launch train.py")
    torchrun_args = [str(a) for a in torchrun_args]
    clash = [a for a in torchrun_args if a.split("=")[0] in _OWN_OPTIONS]
    if clash:
        raise LaunchError(f"torchrun_args {clash} repeat --nproc-per-node; pass it as nproc_per_node instead.")
    local: int | None = None  # the devices of `kind` this process sees
    detected = kind is None
    if detected:
        try:
            accel = hwenv.detect()
        except hwenv.HwenvError as error:
            raise LaunchError(f"cannot detect the accelerator to launch on: {error} Or pass --kind.") from error
        kind, local = accel.kind, accel.count
    elif kind not in hwenv.KINDS:
        raise LaunchError(f"--kind {kind!r} is not an accelerator kind; use one of {', '.join(hwenv.DETECTION_ORDER)}.")
    elif kind in SELECTABLE:
        probe = hwenv.run_probe(kind)  # is that kind here, and how many does this process see?
        local = probe.count if probe.available else None
    target = _check_device_count(device_count, kind)
    given = target is not None
    if not given and detected and kind in SELECTABLE:
        target = local
    index_count = target
    narrowed = _narrowed_here(kind) if device_count is None and devices is not None else None
    if narrowed is not None and index_count is not None:
        # The child gets `devices` instead of the inherited selection, and its indices count devices this
        # process cannot see: only their syntax can be checked here.
        logger.info("launch on %s: %s is set here and --devices %r replaces it for the child; its indices are "
                    "not checked against the %d device(s) this process sees (pass --device-count to check them)",
                    kind, narrowed, devices, index_count)
        index_count = None
    selection = _selection(kind, devices, by, index_count, given)
    count = _nproc(kind, nproc_per_node, selection, target, given, local)
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
