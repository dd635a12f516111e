"""`hwdist launch`: torchrun underneath, one process per selected device (G16), no shell.

The selection's variables (hwenv: `ZE_AFFINITY_MASK`, `HABANA_VISIBLE_MODULES`,
`HIP_VISIBLE_DEVICES`, ...) go to the torchrun child only (X4); torchrun's multi-node options
pass through unchanged. Which kinds take `--devices`, and through which variable, is the
platform's (`hwenv.get_platform(kind).selectable`, `.visible_devices`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import hwenv

from .errors import LaunchError
from .rules import DIST_RULES, rule_for

logger = logging.getLogger(__name__)

TORCHRUN = ("-m", "torch.distributed.run")
_OWN_OPTIONS = ("--nproc-per-node", "--nproc_per_node")


@dataclass(frozen=True)
class LaunchPlan:
    """What `hwdist launch` runs: the torchrun argv, the selection's variables for the child, the
    selection itself (its `apply` also removes what the child must not inherit) and the processes."""

    argv: list[str]
    env: dict[str, str]
    selection: hwenv.Selection
    nproc_per_node: int


def _selectable_kinds(joiner: str) -> str:
    """The kinds that take `--devices`, from the registry: `hpu|xpu|rocm|cuda` or `hpu, xpu, rocm or cuda`."""
    kinds = [p.kind for p in hwenv.platforms() if p.selectable]
    if joiner == "|" or len(kinds) < 2:
        return joiner.join(kinds)
    return ", ".join(kinds[:-1]) + f" or {kinds[-1]}"


def _selection(platform: hwenv.Platform, devices: str | None, by: str, device_count: int | None,
               given: bool) -> hwenv.Selection:
    """Validate `devices` for the platform's kind: syntax (and Gaudi's groups for 2+ cards, G8)
    always; indices against `device_count` only when that count is known for the target (`given`:
    from --device-count, else the count this process sees)."""
    kind = platform.kind
    try:
        if devices is None:
            if not platform.selectable:
                return hwenv.Selection(kind)
            inherited = hwenv.current_selection(kind)  # a selection already in this environment
            return dataclasses.replace(inherited, pci_order=True)  # with XPU's stable PCI order (X5)
        if not platform.selectable:
            raise LaunchError(
                f"--devices {devices!r} selects nothing on {kind}: only {_selectable_kinds(',')} devices are "
                f"selected; leave --devices out, or pass --kind {_selectable_kinds('|')}."
            )
        return hwenv.select(kind, devices, by=by, device_count=device_count)
    except hwenv.HwenvError as error:
        source = f"--device-count {device_count}" if given else f"the {device_count} {kind} device(s) this process sees"
        where = f" (checked against {source})" if device_count is not None else ""
        hint = ("" if device_count is None or given else
                " If the command is for another machine, pass --device-count N (its devices per node) or --kind.")
        if devices is None:  # the selection this environment already makes: name its variables and values
            env = ", ".join(f"{name}={os.environ[name]!r}" for name in platform.visible_devices if name in os.environ)
            raise LaunchError(f"the {kind} selection this environment makes ({env or 'no selection variable set'}) "
                              f"is not usable: {error} Fix or unset it, or pass --devices.") from error
        raise LaunchError(f"cannot select devices {devices!r} on {kind}{where}: {error}{hint}") from error


def _nproc(platform: hwenv.Platform, requested: int | None, selection: hwenv.Selection, target: int | None,
           given: bool, local: int | None, *, devices_given: bool = False) -> int:
    """Processes per node: `requested`, else the selection's device count, else the target's count (G16).

    `selection.count` is the number of devices the child will see (hwenv: under
    `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` the sub-device entries of one card are one device), not
    the number of entries. `target` is the device count known for the node the command is for
    (None: unknown, so an explicit request is not bounded by it); `local` is this machine's
    count, a default only.
    """
    kind = platform.kind
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise LaunchError(f"--nproc-per-node {requested!r} must be a positive integer.")
        _check_process_bound(platform, requested, selection.count if selection.count is not None else target)
        available = selection.count if selection.count is not None else target
        if available is not None and requested > available:
            what = ("selected" if selection.count is not None else "per node (--device-count)"
                    if given else "this process sees")
            raise LaunchError(
                f"--nproc-per-node {requested} exceeds the {available} {kind} device(s) {what}; run one process "
                f"per device (G16): pass --nproc-per-node {available} or select more --devices."
            )
        partial = rule_for(platform).partial_server_groups and selection.count is not None
        if partial and devices_given and requested == 1 < selection.count:
            # one process over several modules given on the command line (from the environment it is allowed: the
            # habana container runtime writes HABANA_VISIBLE_MODULES for every card a container mounts)
            raise LaunchError(
                f"--nproc-per-node 1 uses 1 of the {selection.count} selected Gaudi modules; the others would stay "
                f"idle: select one module (--devices with one id) or launch {selection.count} processes "
                f"(--nproc-per-node {selection.count})."
            )
        if partial and 1 < requested < selection.count:
            raise LaunchError(
                f"--nproc-per-node {requested} uses part of the {selection.count} selected Gaudi modules; Intel "
                f"supports partial-server groups only as selected (G8): select exactly the modules to use."
            )
        return requested
    if selection.count is not None:
        return selection.count
    if not platform.selectable:
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


#: Processes per node on a device kind that is not selected (CPU): this many per core this process may use (at
#: least CPU_PROCESS_FLOOR). Each is a whole Python process with its own copy of the model, and every step waits for
#: the slowest, so processes beyond the cores only time-slice; 100000 exhausted the process table (issue 42).
CPU_PROCESSES_PER_CORE = 4
CPU_PROCESS_FLOOR = 8
#: Processes per node when the device count of an accelerator node is not known (--kind for another machine, no
#: --device-count): beyond any node built (8-16 accelerators; 64 for the largest boards' sub-devices).
MAX_PROCESSES_PER_NODE = 256


def usable_cores() -> int:
    """The cores this process may run on (its affinity, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _check_process_bound(platform: hwenv.Platform, requested: int, available: int | None) -> None:
    """An upper bound on --nproc-per-node where no device count bounds it (the bound and why in the message)."""
    if available is not None:
        return  # bounded by the devices (below)
    if not platform.selectable:
        cores = usable_cores()
        bound = max(CPU_PROCESSES_PER_CORE * cores, CPU_PROCESS_FLOOR)
        if requested > bound:
            raise LaunchError(
                f"--nproc-per-node {requested} on {platform.kind} exceeds {bound} ({CPU_PROCESSES_PER_CORE} per core "
                f"of the {cores} this process may use, at least {CPU_PROCESS_FLOOR}): each process is a whole Python "
                "with its own copy of the model and every step waits for the slowest, so beyond the cores they only "
                f"time-slice. Fix: --nproc-per-node {min(cores, bound)} (one per core), or launch on the machine the "
                "processes are for."
            )
    elif requested > MAX_PROCESSES_PER_NODE:
        raise LaunchError(
            f"--nproc-per-node {requested} exceeds {MAX_PROCESSES_PER_NODE}, more {platform.kind} devices than any "
            f"node has (one process per device, G16). Fix: the node's device count, or pass --device-count N to "
            "check it against the node the command is for."
        )


def _check_by(by: str | None, devices: str | None, platform: hwenv.Platform) -> None:
    """`by` says how Gaudi reads `devices` (module IDs or indices): refused where it would do nothing."""
    if by is None:
        return
    if by not in ("module", "index"):
        raise LaunchError(f"--by {by!r} is not 'module' or 'index'.")
    if platform.selection_grammar != "module-ids":
        raise LaunchError(f"--by {by} applies to Gaudi module IDs/indices only, and the launch is on {platform.kind} "
                          f"(its --devices are {platform.selection_grammar}); leave --by out.")
    if devices is None:
        raise LaunchError(f"--by {by} says how to read --devices, and no --devices were given; pass --devices "
                          f"(e.g. --by {by} --devices 0,1) or leave --by out.")


def _check_device_count(device_count: object, platform: hwenv.Platform) -> int | None:
    kind = platform.kind
    if device_count is None:
        return None
    if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
        raise LaunchError(
            f"--device-count {device_count!r} must be a positive integer: the {kind} devices of each node the "
            "command is for."
        )
    if not platform.selectable:
        raise LaunchError(
            f"--device-count {device_count} counts {_selectable_kinds(',')} devices, and the launch is on {kind}; "
            f"leave it out and pass --nproc-per-node N for {kind} processes, or pass --kind {_selectable_kinds('|')}."
        )
    return device_count


def _narrowed_here(platform: hwenv.Platform) -> str | None:
    """The variable and value that already narrow the platform's devices in this environment, if any."""
    for variable in platform.visible_devices:
        value = os.environ.get(variable)
        if value is not None:
            return f"{variable}={value!r}"
    return None


def _platform(kind: str | None) -> tuple[hwenv.Platform, int | None, bool]:
    """(platform, how many of its devices this process sees or None, whether the kind was detected)."""
    if kind is None:
        try:
            accel = hwenv.detect()
        except hwenv.HwenvError as error:
            raise LaunchError(f"cannot detect the accelerator to launch on: {error} Or pass --kind.") from error
        return accel.platform, accel.count, True
    try:
        platform = hwenv.get_platform(kind)
    except hwenv.HwenvError:
        known = ", ".join(p.kind for p in hwenv.platforms())
        raise LaunchError(f"--kind {kind!r} is not an accelerator kind; use one of {known}.") from None
    if not platform.selectable:
        return platform, None, False
    probe = hwenv.run_probe(kind)  # is that kind here, and how many does this process see?
    return platform, probe.count if probe.available else None, False


def plan_launch(
    script: str,
    script_args: Sequence[str] = (),
    *,
    nproc_per_node: int | None = None,
    devices: str | None = None,
    kind: str | None = None,
    device_count: int | None = None,
    torchrun_args: Sequence[str] = (),
    module: bool = False,
    by: str | None = None,
) -> LaunchPlan:
    """The `LaunchPlan` for `launch_command`'s arguments (see there): what `hwdist launch` runs."""
    if not script:
        raise LaunchError("hwdist launch needs a script (or -m MODULE) to run, e.g. hwdist launch train.py")
    torchrun_args = [str(a) for a in torchrun_args]
    clash = [a for a in torchrun_args if a.split("=")[0] in _OWN_OPTIONS]
    if clash:
        raise LaunchError(f"torchrun_args {clash} repeat --nproc-per-node; pass it as nproc_per_node instead.")
    platform, local, detected = _platform(kind)
    _check_by(by, devices, platform)
    target = _check_device_count(device_count, platform)
    given = target is not None
    if not given and detected and platform.selectable:
        target = local
    index_count = target
    narrowed = _narrowed_here(platform) if device_count is None and devices is not None else None
    if narrowed is not None and index_count is not None:
        # The child gets `devices` instead of the inherited selection, and its indices count devices this
        # process cannot see: only their syntax can be checked here.
        logger.info("launch on %s: %s is set here and --devices %r replaces it for the child; its indices are "
                    "not checked against the %d device(s) this process sees (pass --device-count to check them)",
                    platform.kind, narrowed, devices, index_count)
        index_count = None
    selection = _selection(platform, devices, by or "module", index_count, given)
    count = _nproc(platform, nproc_per_node, selection, target, given, local, devices_given=devices is not None)
    argv = [sys.executable, *TORCHRUN, f"--nproc-per-node={count}", *torchrun_args]
    if module:
        argv.append("-m")
    argv += [script, *[str(a) for a in script_args]]
    return LaunchPlan(argv, selection.env(), selection, count)


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
    by: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The torchrun argv and the selection's environment changes for the child process.

    `devices` is always checked for syntax (and Gaudi's groups for 2+ cards, G8). Device indices
    and `nproc_per_node` are checked against a device count only where it is known for the node
    the command is for: `device_count` when given (the devices of `kind` on each node); else,
    with `kind` detected, the devices this process sees, unless this environment already
    narrows them (an inherited `ZE_AFFINITY_MASK`, ...), which `devices` replaces in the child.
    An explicit `kind` may be for another machine, so its local count is a default only.

    `nproc_per_node` defaults to the selected device count (G16; hwenv's `Selection.count`, so
    XPU sub-devices of one card under COMPOSITE are one process), else `device_count`, else the
    devices of `kind` this process sees, else 1 on CPU/MPS. `torchrun_args` (`--nnodes 2`,
    `--rdzv-endpoint ...`) go to torchrun unchanged; `module=True` runs `script` as `python -m script`.
    """
    plan = plan_launch(script, script_args, nproc_per_node=nproc_per_node, devices=devices, kind=kind,
                       device_count=device_count, torchrun_args=torchrun_args, module=module, by=by)
    return plan.argv, plan.env


def child_environment(env_changes: Mapping[str, str], environ: Mapping[str, str] | None = None, *,
                      selection: hwenv.Selection | None = None) -> dict[str, str]:
    """The full child environment: `environ` (default os.environ) plus `env_changes`.

    With the plan's `selection`, hwenv's `Selection.apply` decides what the child must not inherit
    (on Gaudi: the other selection variable, and the module pin `HLS_MODULE_ID`). Without it, each
    kind's per-process pin (`DistRule.module_pin_variable`) is still removed: torchrun's children
    are several processes, and an inherited pin would put them all on one card.
    """
    merged = dict(os.environ if environ is None else environ)
    if selection is not None:
        merged = selection.apply(merged)
    for rule in DIST_RULES.values():
        if rule.module_pin_variable is not None:
            merged.pop(rule.module_pin_variable, None)
    merged.update(env_changes)
    return merged


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the torchrun command (no shell) and return its exit status."""
    process = subprocess.Popen(list(argv), env=dict(env))
    try:
        return process.wait()
    except KeyboardInterrupt:  # torchrun got the same SIGINT from the terminal; let it stop its workers
        return process.wait()


@dataclass(frozen=True)
class ProcessCheck:
    """What `check_process_count` found: the processes, the devices they use, and the sentence saying so."""

    nproc: int
    kind: str
    devices: tuple[str, ...]  # the selection's ids (empty: the first `nproc` devices the processes see)
    modules: tuple[int, ...] | None  # Gaudi: the module IDs the processes use, where known
    reason: str


def check_process_count(nproc: int, accel: hwenv.Accelerator, *, environ: Mapping[str, str] | None = None,
                        read_selection: bool = True) -> ProcessCheck:
    """Check `nproc` processes, one per device (G16), against `accel`'s devices before anything starts: the
    selection this environment makes (`ZE_AFFINITY_MASK` and its hierarchy, `HABANA_VISIBLE_MODULES`,
    `CUDA_VISIBLE_DEVICES`, ...; not read with `read_selection=False`, for an accelerator planned for another
    machine), Intel's supported Gaudi groups for part of a server (G8), and on kinds without device selection
    (CPU) the per-core bound `hwdist launch` applies. Raises `LaunchError` (`GaudiWorldError` for a group)."""
    from .gaudi_world import check_gaudi_world

    platform = accel.platform
    kind = platform.kind
    env = os.environ if environ is None else environ
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise LaunchError(f"{nproc!r} processes: pass a positive integer (one process per device).")
    if platform.selectable and read_selection:
        try:
            selection = hwenv.current_selection(kind, env)
        except hwenv.HwenvError as error:
            raise LaunchError(f"the {kind} selection in this environment is invalid: {error}") from error
    else:
        selection = hwenv.Selection(kind)
    target = accel.count if platform.selectable else None
    count = _nproc(platform, nproc, selection, target, True, None)
    modules = None
    if rule_for(platform).partial_server_groups and count > 1:
        modules = check_gaudi_world(count, accel.count, env if read_selection else {}, kind=kind)
    if not platform.selectable:
        reason = (f"{count} {kind} process(es) on this host ({usable_cores()} usable core(s); at most "
                  f"{max(CPU_PROCESSES_PER_CORE * usable_cores(), CPU_PROCESS_FLOOR)})")
    elif selection.devices:
        reason = (f"{count} process(es), one per selected {kind} device ({selection.variable}="
                  f"{','.join(selection.devices)})")
    else:
        reason = f"{count} process(es), one per {kind} device: local ranks 0..{count - 1} of the {accel.count} visible"
    if modules:
        reason += f"; Gaudi modules {list(modules)}, a supported group (G8)"
    return ProcessCheck(count, kind, tuple(selection.devices), modules, reason)
